"""The compiled engine gives the floats of its reference (one Python callback per event on a simpy calendar) exactly:
every op's start and end, the event and allocation counts, the recorded link loads, on generated schedules that use
every mechanism (host threads in program order, kernels of no duration, shared cores and memory, loopback copies
and links measured by size, rate caps, floors, streamed steps, launches, not_before) and on the real algorithms."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.algorithms import build_schedule, resolve
from simulator.algorithms.prefill import build_prefill
from simulator.cluster.topology import Cluster, build_cluster, load_topology
from simulator.collectives import fabric_of
from simulator.collectives.standalone import collective_schedule
from simulator.engine import core, eventcore
from simulator.engine.core import SimResult, simulate
from simulator.engine.reference import simulate_reference
from simulator.run.prepared import layout_of
from simulator.schedule.core import STREAMED, Schedule
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.shape import DecodeShape

CURVE = {"bytes": [1e4, 1e6, 1e8], "bandwidth": ["0.5 GB/s", "2 GB/s", "3 GB/s"]}


def _host(ranks: int, launch: str) -> Cluster:
    """CPU ranks on one host sharing 2 cores and its memory, loopback copies and an aggregate link by size."""
    cpu = {"peak_flops": {"fp32": "1 TFLOP/s"}, "mem_bw": "5 GB/s", "mem": "8 GB", "launch_overhead": launch}
    raw: dict = {
        "devices": {"cpu": cpu, "slow": {**cpu, "mem_bw": "3 GB/s"}},  # two kinds: a kernel's cost on each
        "nodes": [{"name": f"h.r{r}", "kind": "gpu", "device": "slow" if r % 3 == 2 else "cpu"}
                  for r in range(ranks)]
        + [{"name": "h.tx", "kind": "switch"}, {"name": "h.rx", "kind": "switch"}],
        "links": [{"src": f"h.r{r}", "dst": "h.tx", "bandwidth": "2 GB/s"} for r in range(ranks)]
        + [{"src": "h.tx", "dst": "h.rx", "bandwidth": "3 GB/s", "bandwidth_by_size": CURVE}]
        + [{"src": "h.rx", "dst": f"h.r{r}", "bandwidth": "2 GB/s"} for r in range(ranks)],
        "message_overhead": "20 us", "comm_overhead": "5 us",
        "host_cores": {"h": 2}, "host_mem_bw": {"h": "8 GB/s"}, "host_copy_bw": {"h": "4 GB/s"},
        "host_copy_bw_by_size": {"h": CURVE},
    }
    return build_cluster(raw, "t.yaml")


def _same(a: SimResult, b: SimResult) -> None:
    np.testing.assert_array_equal(a.start, b.start)  # NaN where both never started
    np.testing.assert_array_equal(a.end, b.end)
    np.testing.assert_array_equal(a.order, b.order)
    assert (a.events, a.allocations, a.simpy_events) == (b.events, b.allocations, b.simpy_events)
    assert a.end_time == b.end_time
    assert a.link_load == b.link_load
    assert a.extrapolated == b.extrapolated
    assert a.bytes_sent() == b.bytes_sent()  # the engine's column against a pass over the ops
    assert (a.slowed is None) == (b.slowed is None)
    if a.slowed is not None:
        np.testing.assert_array_equal(a.slowed, b.slowed)


SIZES = st.sampled_from([0.0, 1e4, 3e5, 1e6, 4e7])
OP = st.tuples(st.sampled_from(["compute", "merge", "transfer", "transfer", "launch"]), st.integers(0, 3),
               st.integers(0, 3), SIZES, st.sets(st.integers(0, 200), max_size=3),
               st.sampled_from([0.0, 0.0, 0.0, 2e-4]), st.sampled_from([0.0, 0.0, STREAMED, 1e-4]),
               st.sampled_from([0.0, 0.0, 5e8]), st.booleans())


def _schedule(ranks: int, spec: list[tuple]) -> Schedule:
    sched = Schedule(ranks)
    for kind, a, b, size, deps, not_before, floor, cap, coll in spec:
        a, b = a % ranks, b % ranks
        n = len(sched.ops)
        deps = [d % n for d in deps] if n else []
        if kind in ("compute", "merge"):  # some SM-bound (flops): transfers in flight slow them on a GPU
            sched.add_compute(a, "k", nbytes=size, flops=size * 3e3 if coll else 0.0, deps=deps, kind=kind,
                              not_before_s=not_before)
        elif kind == "launch":
            sched.add_launch(a, "l", deps=deps, floor_s=floor if floor > 0 else 0.0)
        elif a != b:
            sched.add_transfer(a, b, size, "x", send_deps=deps, recv_deps=deps[:1], not_before_s=not_before,
                               coll="c" if coll else "", floor_s=floor, rate_cap=cap)
    return sched


@settings(max_examples=60, deadline=None)
@given(ranks=st.integers(2, 4), launch=st.sampled_from(["0 s", "10 us"]), record=st.booleans(),
       spec=st.lists(OP, min_size=1, max_size=40))
def test_generated_schedules_on_host_threads_match_the_reference(ranks, launch, record, spec):
    cluster = _host(ranks, launch)
    sched = _schedule(ranks, spec)
    with mock.patch.object(core, "CALLBACKS_PER_CALL", 3), \
            mock.patch.object(eventcore, "run", wraps=eventcore.run) as run:  # stopped and resumed all along
        result = simulate(sched, cluster, record)
    assert run.call_count >= result.events / 4  # (a call may overrun its budget by a reallocation)
    _same(result, simulate_reference(sched, cluster, record))


@settings(max_examples=30, deadline=None)
@given(spec=st.lists(OP, min_size=1, max_size=60), record=st.booleans())
def test_generated_schedules_on_gpus_match_the_reference(spec, record):
    cluster = load_topology("dgx-h100", {"nodes": 2})
    sched = _schedule(16, [(k, a * 5 + 1, b * 3, *rest) for k, a, b, *rest in spec])
    with mock.patch.object(core, "CALLBACKS_PER_CALL", 7), \
            mock.patch.object(eventcore, "run", wraps=eventcore.run) as run:
        result = simulate(sched, cluster, record)
    assert run.call_count >= result.events / 8
    _same(result, simulate_reference(sched, cluster, record))


@pytest.mark.parametrize("algo", ["ring", "ring-q", "tree", "tree-p2p"])
@pytest.mark.parametrize("where", ["host", "dgx-h100"])
def test_decode_schedules_match_the_reference(algo, where):
    cluster = _host(4, "10 us") if where == "host" else load_topology("dgx-h100", {"nodes": 2})
    shape = DecodeShape(batch=2, heads=8, head_dim=64, kv_heads=4, context=40_000, dtype="fp32")
    name, params = resolve(algo)
    sched = build_schedule(name, params, shape, layout_of(cluster))
    _same(simulate(sched, cluster, True), simulate_reference(sched, cluster, True))


@pytest.mark.parametrize(("coll", "algo", "gib"), [("allreduce", "tree", 0.25), ("allreduce", "ring", 0.1),
                                                   ("alltoall", "auto", 0.01), ("broadcast", "ring", 0.05)])
def test_collectives_match_the_reference(coll, algo, gib):
    cluster = load_topology("dgx-h100", {"nodes": 2})
    sched, _ = collective_schedule(cluster, fabric_of(cluster), coll, int(gib * 2**30) // 2, 2, "bf16", algo)
    _same(simulate(sched, cluster, True), simulate_reference(sched, cluster, True))


@pytest.mark.parametrize(("algo", "params", "nodes", "backward", "layout"), [
    ("ring", {"overlap": True}, 1, True, "zigzag"), ("ring", {"overlap": True}, 2, False, "zigzag"),
    ("ring-q", {"overlap": True}, 2, True, "zigzag"), ("ulysses", {}, 2, False, "zigzag"),
    ("allgather", {}, 1, True, "zigzag"), ("ring", {"p2p": "per-peer"}, 2, True, "striped"),
    ("ring-q", {}, 2, True, "contiguous"), ("usp", {}, 2, True, "zigzag")])
def test_prefill_schedules_match_the_reference(algo, params, nodes, backward, layout):
    """Prefill and training attention, where point-to-point transfers hold SMs while kernels run (contention) and
    a GPU's point-to-point kernels wait on their stream (both ``p2p`` modes; a contiguous ring's groups split where
    an end waits for one of them): every kernel re-timed as transfers come and go, exactly as the reference does."""
    cluster = load_topology("dgx-h100", {"nodes": nodes})
    shape = PrefillShape(batch=1, heads=16, head_dim=128, kv_heads=8, sequence=4096 * 8 * nodes, dtype="bf16",
                         causal=True, layout=layout, backward=backward)
    sched = build_prefill(algo, params, shape, layout_of(cluster))
    result = simulate(sched, cluster, True)
    if algo.startswith("ring"):  # (collectives' transfers, as all-to-all's and all-gather's, hold none here)
        assert result.slowed is not None and result.slowed.max() > 0
    _same(result, simulate_reference(sched, cluster, True))


def test_a_transfer_end_without_its_match_is_named():
    cluster = _host(2, "0 s")
    sched = Schedule(2)
    send, _ = sched.add_transfer(0, 1, 1e6, "x")
    sched.ops[send] = sched.ops[send]._replace(match=None)  # as a builder handing ops to extend could leave it
    with pytest.raises(ValueError, match=r"op 0 \(send 'x' of rank 0\) names no matching op"):
        simulate(sched, cluster)


def _broken(how: str) -> Schedule:
    sched = Schedule(3)
    send, recv = sched.add_transfer(0, 1, 1e6, "x")
    if how == "outside":
        sched.ops[send] = sched.ops[send]._replace(match=7)
    elif how == "twice":  # a second recv names the same send
        sched.ops.append(sched.ops[recv]._replace(id=2, rank=2))
    elif how in ("nan", "negative"):
        sched.ops.append(sched.ops[0]._replace(id=2, kind="compute", peer=None, match=None, deps=(),
                                               not_before_s=math.nan if how == "nan" else -1.0))
    return sched


@pytest.mark.parametrize(("how", "says"), [
    ("outside", r"op 0 \(send 'x' of rank 0\) names a match outside the schedule"),
    ("twice", r"op 2 \(recv 'x' of rank 2\) and its match do not name each other"),
    ("nan", r"op 2 \(compute 'x' of rank 0\) may not start before nan s"),
    ("negative", r"op 2 \(compute 'x' of rank 0\) may not start before -1.0 s")])
def test_a_broken_schedule_is_refused_naming_the_op(how, says):
    with pytest.raises(ValueError, match=says):
        simulate(_broken(how), _host(3, "0 s"))


def test_a_kernel_without_a_finite_duration_is_refused_naming_the_first():
    """Durations are computed once per cost and kind of device: the error still names the first bad op."""
    sched = Schedule(3)
    sched.add_compute(2, "fine", flops=1e9)
    sched.add_compute(0, "inf", flops=math.inf)  # rank 0's device, then rank 2's (the slow one)
    sched.add_compute(2, "wide", nbytes=math.inf)
    sched.add_compute(2, "inf again", flops=math.inf)
    with pytest.raises(ValueError, match=r"op 1 \(compute 'inf' of rank 0\) lasts inf s on its device"):
        simulate(sched, _host(3, "0 s"))
    sched.ops[1] = sched.ops[1]._replace(flops=1e9)
    with pytest.raises(ValueError, match=r"op 2 \(compute 'wide' of rank 2\) lasts inf s on its device"):
        simulate(sched, _host(3, "0 s"))
