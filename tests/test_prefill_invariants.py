"""Invariants of the prefill costs on GPUs timed by tile (FlashAttention-2 on A100, -3 on H100), over random shapes,
layouts, P, forward or forward + backward, causal or not, and every prefill schedule:

* no schedule on P ranks beats the single device's time on the whole sequence divided by P:
  ``T(P ranks, n) >= T(single, n) / P``;
* where every rank runs the single device's kernel shape on n/P tokens (the ring without a mask, any layout; the
  causal ring with contiguous or striped shards, whose every block is that square, masked or not),
  ``P x T(single, n/P) <= T(P ranks, n)``.

A violation is a cost that rewards splitting work for nothing. (Zigzag's unmasked half blocks, allgather's chunks
against the keys up to their end and Ulysses' whole-sequence kernels are other kernels than the single device's on
n/P tokens, more efficient per FLOP than a causal n/P kernel: docs/kernels.md.)
"""

from __future__ import annotations

from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.algorithms import Layout
from simulator.algorithms.prefill import build_prefill, check_ulysses
from simulator.cluster.topology import Cluster, load_topology
from simulator.engine.core import simulate
from simulator.errors import InputError
from simulator.workloads.prefill_shape import PrefillShape

REL = 1e-9  # float noise of sums of durations


@cache
def cluster(name: str) -> Cluster:
    return load_topology(name, {"nodes": 1})


def latency(topology: str, name: str, s: PrefillShape, p: int) -> float:
    params = {"overlap": True} if name == "ring" else {}
    return simulate(build_prefill(name, params, s, Layout((0,) * p)), cluster(topology)).makespan


shapes = st.fixed_dictionaries({
    "topology": st.sampled_from(["dgx-a100", "dgx-h100"]),
    "p": st.sampled_from([2, 4]),
    "heads": st.sampled_from([4, 8, 16]),
    "kv_div": st.sampled_from([1, 2, 4]),
    "head_dim": st.sampled_from([64, 128]),
    "per_rank": st.integers(16, 3000),
    "causal": st.booleans(),
    "backward": st.booleans(),
    "layout": st.sampled_from(["contiguous", "zigzag", "striped"]),
})


def _shape(d: dict, n: int, layout: str) -> PrefillShape:
    return PrefillShape(1, d["heads"], d["head_dim"], d["heads"] // d["kv_div"], n, "bf16", causal=d["causal"],
                        layout=layout, backward=d["backward"])


@settings(max_examples=30, deadline=None)
@given(d=shapes)
def test_no_schedule_beats_the_single_device_divided_by_p(d):
    p, n = d["p"], d["p"] * d["per_rank"]
    whole = latency(d["topology"], "single", _shape(d, n, "contiguous"), 1)
    for name in ("ring", "allgather", "ulysses"):
        s = _shape(d, n, d["layout"])
        if name == "ulysses":
            try:
                check_ulysses(s, p)
            except InputError:
                continue
        t = latency(d["topology"], name, s, p)
        assert t >= whole / p * (1 - REL), (name, t, whole / p)


@settings(max_examples=30, deadline=None)
@given(d=shapes)
def test_the_same_kernels_on_p_ranks_never_beat_p_single_devices(d):
    p, t = d["p"], d["per_rank"]
    layout = d["layout"] if not d["causal"] else ("striped" if d["layout"] == "zigzag" else d["layout"])
    ring = latency(d["topology"], "ring", _shape(d, p * t, layout), p)
    alone = latency(d["topology"], "single", _shape(d, t, "contiguous"), 1)
    assert p * alone <= ring * (1 + REL), (layout, p * alone / ring)
