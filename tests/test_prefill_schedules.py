"""Prefill schedules in the engine: the ring's closed form, causal imbalance per layout, transfer volumes of every
schedule against the collectives' closed forms, and memory."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
from conftest import star

from simulator.algorithms import Layout, build_schedule
from simulator.algorithms.prefill import build_prefill
from simulator.cluster.devices import compute_time
from simulator.cluster.topology import build_cluster
from simulator.collectives.alltoall import hierarchical_alltoall, pairwise_alltoall
from simulator.engine.core import simulate
from simulator.errors import InputError
from simulator.kernels.table import KERNELS
from simulator.kernels.tiles import AttentionCall, attention_time, call_dims, full_launch
from simulator.numeric.decode import Executor, make_inputs
from simulator.run.timing import critical_timing
from simulator.schedule.core import Schedule
from simulator.schedule.memory import peak_memory
from simulator.workloads.layouts import imbalance
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.shape import DecodeShape

BW, LAT, OVH = 25e9, 1.5e-6, 2e-6  # per link; a route crosses two links


def shape(n: int, *, causal: bool = True, layout: str = "zigzag", backward: bool = False, kv: int = 8,
          heads: int = 32) -> PrefillShape:
    return PrefillShape(batch=1, heads=heads, head_dim=128, kv_heads=kv, sequence=n, dtype="bf16", causal=causal,
                        layout=layout, backward=backward)


def sim(name: str, s: PrefillShape, p: int, cluster=None, **params):
    sched = build_prefill(name, params, s, Layout((0,) * p))
    return sched, simulate(sched, cluster or star(p, bw="25 GB/s", lat="1.5 us", overhead="2 us"))


def _ring_block(spec, s: PrefillShape, t: int, first: bool) -> float:
    """A non-causal ring step of t tokens on an H100 by the tile model: one unmasked flash-attention launch of t
    queries against t keys, then the merge into the running state (the first step a conversion)."""
    launch = (full_launch(t, t),)
    call = AttentionCall(s.head_dim, s.batch * s.heads, s.group, launch, *s.merge_extra(t, first))
    dims = call_dims((s.batch * s.heads * t, t, s.head_dim, 1.0), call)
    seconds = attention_time(spec, False, s.dtype, dims)
    assert seconds is not None  # the h100-sxm spec carries the tile facts
    return seconds


@pytest.mark.usefixtures("no_contention")  # (the closed form with contention: tests/test_contention.py)
@pytest.mark.parametrize("bw", ["25 GB/s", "400 GB/s"])  # transfer-bound, then compute-bound
@pytest.mark.parametrize("p", [2, 3, 8])
def test_noncausal_ring_forward_closed_form(p, bw):
    n = 4096 * p
    s = shape(n, causal=False)
    cluster = star(p, bw=bw, lat="1.5 us", overhead="2 us")
    _, res = sim("ring", s, p, cluster, overlap=True)
    spec = cluster.specs["h0"]
    t = n // p
    first, block = _ring_block(spec, s, t, True), _ring_block(spec, s, t, False)
    transfer = OVH + 2 * LAT + s.kv_bytes(t) / float(bw.split()[0]) / 1e9
    final = compute_time(spec, *s.elementwise_cost(t * s.heads * s.head_dim), "bf16")
    # step s >= 1 starts when its shard arrives (s transfers) and step s - 1 is done: the latest of the compute
    # chain and of the transfer chain with the steps after it (linear in s: its ends)
    steps = max(first + (p - 1) * block, transfer + (p - 1) * block, (p - 1) * transfer + block)
    assert math.isclose(res.makespan, steps + final, rel_tol=1e-9)


def test_ring_without_overlap_alternates():
    p, n = 4, 4 * 4096
    s = shape(n, causal=False)
    cluster = star(p, bw="25 GB/s", lat="1.5 us", overhead="2 us")
    _, res = sim("ring", s, p, cluster, overlap=False)
    spec, t = cluster.specs["h0"], n // p
    first, block = _ring_block(spec, s, t, True), _ring_block(spec, s, t, False)
    transfer = OVH + 2 * LAT + s.kv_bytes(t) / BW
    final = compute_time(spec, *s.elementwise_cost(t * s.heads * s.head_dim), "bf16")
    assert math.isclose(res.makespan, first + (p - 1) * (block + transfer) + final, rel_tol=1e-9)


def _exact_compute_star(p: int):
    """A device whose kernels take exactly flops / peak (no launch, unbounded memory), infinitely fast links."""
    dev = {"peak_flops": {"bf16": "1000 TFLOP/s"}, "mem_bw": "1e30 B/s", "mem": "80 GB", "launch_overhead": 0}
    raw = {"devices": {"exact": dev}, "name": "star",
           "nodes": [{"name": f"h{i}", "kind": "gpu", "device": "exact"} for i in range(p)]
           + [{"name": "s", "kind": "switch"}],
           "links": [{"a": f"h{i}", "b": "s", "bandwidth": "1e30 B/s", "latency": 0} for i in range(p)]}
    return build_cluster(raw, "<star>")


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
def test_causal_ring_p8_imbalance_shows_in_the_makespan(layout):
    p, n = 8, 2 * 8 * 512
    s = shape(n, layout=layout)
    _, res = sim("ring", s, p, _exact_compute_star(p))
    busy = [0.0] * p
    for rec in res.timeline:
        if rec.kind == "compute" and rec.name.startswith("attn-fwd"):
            busy[rec.rank] += rec.end - rec.start
    ratio = max(busy) / (sum(busy) / p)
    assert ratio == pytest.approx(imbalance(layout, n, p, True), rel=1e-12)  # compute is exactly the pair counts
    if layout == "contiguous":
        assert ratio == pytest.approx((2 * p - 1) / p, rel=0.01)
    else:
        assert ratio <= 1.02
    # with free communication the ring finishes with its busiest rank (plus the finalize)
    assert res.makespan == pytest.approx(max(busy), rel=1e-3)


def test_zigzag_beats_contiguous_by_the_imbalance():
    p, n = 8, 2 * 8 * 512
    cont = sim("ring", shape(n, layout="contiguous"), p, _exact_compute_star(p))[1].makespan
    zig = sim("ring", shape(n, layout="zigzag"), p, _exact_compute_star(p))[1].makespan
    assert cont / zig == pytest.approx(imbalance("contiguous", n, p, True), rel=1e-3)


def _sent(res) -> float:
    return sum(rec.nbytes for rec in res.timeline if rec.kind == "send")


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("backward", [False, True])
def test_transfer_volumes_equal_closed_forms(p, backward):
    n = 8 * 97 + 5  # uneven
    s = shape(n, backward=backward, layout="striped")
    kv_all = s.kv_bytes(n)
    # ring: every shard travels P - 1 hops (forward, and again backward), dK/dV P hops
    want = (p - 1) * kv_all * (2 if backward else 1) + (p * kv_all if backward else 0)
    assert _sent(sim("ring", s, p)[1]) == pytest.approx(want, rel=1e-12)
    # allgather: (P - 1) x the gathered K/V per all-gather; backward: one more all-gather and a reduce-scatter
    want = (p - 1) * kv_all * (3 if backward else 1)
    assert _sent(sim("allgather", s, p)[1]) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("kv", [8, 2])  # kv_heads >= P, and < P (replicated)
def test_ulysses_alltoall_volumes(p, kv):
    n = 64 * p  # even shards
    s = shape(n, backward=True, kv=kv)
    t = n // p
    q_piece = s.q_bytes(t, s.heads // p)
    kv_piece = s.kv_bytes(t, kv // p if kv % p == 0 else 1)
    per_pair = 4 * q_piece + 2 * kv_piece  # q, out back, dout, dq back; K/V, dK/dV back
    assert _sent(sim("ulysses", s, p)[1]) == pytest.approx(p * (p - 1) * per_pair, rel=1e-12)
    if kv % p == 0:  # all-to-all moves (P - 1) / P of each buffer
        assert p * (p - 1) * (q_piece + kv_piece) == pytest.approx((p - 1) / p * (s.q_bytes(n) + s.kv_bytes(n)))


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_pairwise_alltoall_is_p_minus_1_uncontended_rounds(p):
    piece = 3_000_000.0
    sched = Schedule(p, placement=tuple(f"h{i}" for i in range(p)))
    front = pairwise_alltoall(sched, list(range(p)), "x", lambda src: f"x@{src}",
                              lambda src, dst: (dst, dst + 1, piece), mode="heads", tag="a2a", deps={})
    res = simulate(sched, star(p, bw="25 GB/s", lat="1.5 us", overhead="2 us", device="zero"))
    assert math.isclose(res.makespan, (p - 1) * (OVH + 2 * LAT + piece / BW), rel_tol=1e-9)
    assert _sent(res) == p * (p - 1) * piece
    assert all(len(front[r]) == p for r in range(p))  # its own piece and one from every other rank


@pytest.mark.parametrize("name", ["ring", "allgather", "ulysses", "single"])
def test_memory_of_forward(name):
    p, n = 4, 4 * 256
    s = shape(n, causal=False, layout="contiguous")
    sched, res = sim(name, s, p)
    peaks = peak_memory(sched, {rec.op: (rec.start, rec.end) for rec in res.timeline})
    t = n // p if name != "single" else n
    base = s.q_bytes(t) + s.kv_bytes(t)
    out = s.q_bytes(t) + s.row_bytes(t)  # out and lse, saved for the backward
    if name == "ring":  # own K/V, two receive buffers, the running state, then out + lse
        want = base + 2 * s.kv_bytes(t) + s.state_bytes(t) + out
    elif name == "allgather":  # the gathered K/V of the whole sequence, released after the kernel
        want = base + s.state_bytes(t) + max(s.kv_bytes(n) - s.kv_bytes(t), out)
    elif name == "ulysses":  # head-sharded q, K/V of the whole sequence; the state, then out + lse, then y
        h = s.heads // p
        want = base + s.q_bytes(n, h) + s.kv_bytes(n, s.kv_heads // p) + s.q_bytes(n, h) + s.row_bytes(n, h) \
            + max(s.state_bytes(n, h), s.q_bytes(t))
    else:
        want = base + s.state_bytes(n) + out
    assert max(peaks) == pytest.approx(want, rel=1e-12)


def test_comm_hidden_frac_and_imbalance_of_rows():
    p, n = 4, 4 * 4096
    s = shape(n, causal=False)
    cluster = star(p, bw="400 GB/s", lat="1.5 us", overhead="2 us")  # compute-bound: transfers run under kernels
    hidden = critical_timing(sim("ring", s, p, cluster, overlap=True)[1], p)
    assert hidden["comm_under_compute_frac"] == 1.0 and hidden["imbalance"] == pytest.approx(1.0)
    # ... but hold SMs the kernels lose: of their time, a few per cent (h of 132 SMs) is not hidden
    assert 0.9 < hidden["comm_hidden_frac"] < 1.0
    with mock.patch("simulator.engine.core.p2p_channels", return_value=None):
        assert critical_timing(sim("ring", s, p, cluster, overlap=True)[1], p)["comm_hidden_frac"] == 1.0
    alternating = critical_timing(sim("ring", s, p, cluster, overlap=False)[1], p)
    assert alternating["comm_hidden_frac"] == 0.0
    single = critical_timing(sim("single", s, 1, star(1))[1], 1)
    assert math.isnan(single["comm_hidden_frac"])


def test_prefill_kernels_are_in_the_one_table_and_refuse_a_decode_executor():
    assert {"attn-fwd", "attn-final", "attn-delta", "attn-bwd", "concat", "slice-heads", "slice-rows",
            "add"} <= set(KERNELS)
    dec = build_schedule("single", {}, DecodeShape(1, 2, 4, 2, 8, "fp64"), Layout((0,)))
    ex = Executor(dec, make_inputs(np.random.default_rng(0), 1, 2, 2, 4, 8))
    op = build_prefill("single", {}, shape(8, heads=2, kv=2), Layout((0,))).ops[0]
    with pytest.raises(TypeError, match="prefill kernel needs a prefill executor"):
        KERNELS[op.fn].run(ex, op)


@pytest.mark.parametrize(("nodes", "g"), [(2, 2), (2, 4), (4, 2)])
def test_hierarchical_alltoall_volume_and_messages(nodes, g):
    p = nodes * g
    hosts = tuple(r // g for r in range(p))
    piece = 1_000_000.0
    sched = Schedule(p, placement=tuple(f"h{i}" for i in range(p)))
    groups = [list(range(n * g, (n + 1) * g)) for n in range(nodes)]
    hierarchical_alltoall(sched, groups, "x", lambda src: f"x@{src}", lambda src, dst: (dst, dst + 1, piece),
                          mode="heads", tag="a2a", deps={})
    res = simulate(sched, star(p))
    sends = [op for op in sched.ops if op.kind == "send"]
    # a piece from (n, i) to (m, j) crosses [i != j] + [n != m] hops
    assert _sent(res) == p * (nodes * (g - 1) + (nodes - 1) * g) * piece
    across = [op for op in sends if hosts[op.rank] != hosts[op.peer]]
    assert len(across) == p * (nodes - 1)  # one message per other node, instead of (nodes - 1) g
    assert all(op.nbytes == g * piece for op in across)


def test_hierarchical_alltoall_needs_equal_nodes():
    with pytest.raises(InputError, match="same number of GPUs on every node"):
        build_prefill("ulysses", {"alltoall": "hierarchical"}, shape(64, heads=6, kv=3), Layout((0, 0, 1)))
