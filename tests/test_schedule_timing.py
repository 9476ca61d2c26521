"""Closed forms and exact traces of schedules and collectives on a single switch with zero compute."""

from __future__ import annotations

import math

import pytest
from conftest import star

from simulator.algorithms import Layout, build_schedule, resolve
from simulator.collectives import allreduce, broadcast, reduce
from simulator.collectives.ring import PIPELINE_SLICE_BYTES
from simulator.engine.core import simulate
from simulator.schedule.core import STREAMED, Schedule
from simulator.workloads.shape import DecodeShape

REL = 1e-9
BW, LAT, OVH = 25e9, 1.5e-6, 2e-6  # per link; a route crosses two links (host -> switch -> host)


def zero_star(p: int, comm: str = "0 s"):
    return star(p, bw="25 GB/s", lat="1.5 us", overhead="2 us", device="zero", comm_overhead=comm)


def coll_schedule(p: int, kind: str, algo: str, n: int) -> Schedule:
    sched = Schedule(p, placement=tuple(f"h{i}" for i in range(p)))
    common = {"elem_bytes": 1, "dtype": "fp32", "tag": kind, "deps": {}, "algo": algo}
    if kind == "allreduce":
        allreduce(sched, list(range(p)), (0,) * p, "x", n, op="sum", **common)
    elif kind == "reduce":
        reduce(sched, list(range(p)), (0,) * p, "x", n, root=0, op="sum", **common)
    else:
        broadcast(sched, list(range(p)), (0,) * p, "x", n, root=0, **common)
    return sched


@pytest.mark.parametrize("p", [2, 3, 4, 8, 16])
def test_ring_allreduce_is_2_p_minus_1_steps(p):
    n = 1_000_000 * p
    res = simulate(coll_schedule(p, "allreduce", "ring", n), zero_star(p))
    step = OVH + 2 * LAT + n / (p * BW)
    assert math.isclose(res.makespan, 2 * (p - 1) * step, rel_tol=REL)


def test_comm_overhead_is_paid_once_per_collective():
    p, n = 4, 4_000_000
    base = simulate(coll_schedule(p, "allreduce", "ring", n), zero_star(p)).makespan
    with_launch = simulate(coll_schedule(p, "allreduce", "ring", n), zero_star(p, comm="7 us")).makespan
    assert math.isclose(with_launch - base, 7e-6, rel_tol=1e-6)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 13, 16])
@pytest.mark.parametrize("algo", ["double-binary-tree", "recursive-doubling"])
def test_binary_tree_reduce_of_a_small_message_takes_ceil_log2_p_hops(p, algo):
    n = 64
    hop = OVH + 2 * LAT + n / BW
    res = simulate(coll_schedule(p, "reduce", algo, n), zero_star(p))
    assert math.isclose(res.makespan, math.ceil(math.log2(p)) * hop, rel_tol=REL)
    res = simulate(coll_schedule(p, "broadcast", algo, n), zero_star(p))
    assert math.isclose(res.makespan, math.ceil(math.log2(p)) * hop, rel_tol=REL)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
def test_ring_broadcast_and_reduce_pipeline_their_slices(p, kind):
    # m slices down a chain of p ranks: a rank forwards slice k while it receives slice k + 1, so the last slice
    # reaches the chain's end after m + p - 2 slice times (not m (p - 1), one hop at a time); the first slice pays
    # each hop's message overhead and latency, the later ones stream behind it (NCCL's steps in flight)
    m = 16
    n = m * PIPELINE_SLICE_BYTES
    res = simulate(coll_schedule(p, kind, "ring", n), zero_star(p))
    want = (p - 1) * (OVH + 2 * LAT) + (m + p - 2) * PIPELINE_SLICE_BYTES / BW
    assert math.isclose(res.makespan, want, rel_tol=REL)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_recursive_doubling_allreduce_is_log2_p_exchanges(p):
    n = 1000
    res = simulate(coll_schedule(p, "allreduce", "recursive-doubling", n), zero_star(p))
    assert math.isclose(res.makespan, math.log2(p) * (OVH + 2 * LAT + n / BW), rel_tol=REL)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("overlap", [True, False])
def test_ring_decode_with_zero_compute_is_p_minus_1_shard_transfers(p, overlap):
    shape = DecodeShape(batch=1, heads=4, head_dim=64, kv_heads=4, context=1000 * p, dtype="bf16")
    name, params = resolve({"name": "ring", "overlap": overlap})
    sched = build_schedule(name, params, shape, Layout((0,) * p))
    comm = 3e-6
    res = simulate(sched, zero_star(p, comm="3 us"))
    shard = shape.kv_bytes(1000)
    assert math.isclose(res.makespan, (p - 1) * (comm + OVH + 2 * LAT + shard / BW), rel_tol=REL)
    assert sum(r.nbytes for r in res.timeline if r.kind == "send") == (p - 1) * p * shard


def _trace(sched, cluster):
    return [(r.rank, r.kind, r.name, r.start, r.end) for r in simulate(sched, cluster).timeline]


def _assert_trace(got, want):
    assert [g[:3] for g in got] == [w[:3] for w in want]
    for g, w in zip(got, want, strict=True):
        assert math.isclose(g[3], w[3], rel_tol=REL, abs_tol=1e-15), (g, w)
        assert math.isclose(g[4], w[4], rel_tol=REL, abs_tol=1e-15), (g, w)


def test_exact_trace_ring_p4():
    p = 4
    shape = DecodeShape(batch=1, heads=2, head_dim=8, kv_heads=2, context=400, dtype="fp32")
    name, params = resolve("ring")
    sched = build_schedule(name, params, shape, Layout((0,) * p))
    step = OVH + 2 * LAT + shape.kv_bytes(100) / BW
    want = []
    for s in range(p):
        t = s * step
        want += [(r, "compute", f"attend[{(r - s) % p}]", t, t) for r in range(p)]
        if s < p - 1:
            want += [(r, kind, f"kv[{(r - s) % p if kind == 'send' else (r - 1 - s) % p}]", t, t + step)
                     for r in range(p) for kind in ("send", "recv")]
    want += [(r, "compute", "finalize", (p - 1) * step, (p - 1) * step) for r in range(p)]
    key = lambda x: (round(x[3], 15), x[0], x[1] != "compute", x[1], x[2])  # noqa: E731
    got = sorted(_trace(sched, zero_star(p)), key=key)
    want.sort(key=key)
    _assert_trace(got, want)


def test_exact_trace_tree_p4():
    """Tree decode with a ring allreduce: attend, pack-m, launch, 6 steps of max, rescale, launch, 6 of sum."""
    p = 4
    shape = DecodeShape(batch=1, heads=4, head_dim=8, kv_heads=4, context=400, dtype="fp32")
    name, params = resolve({"name": "tree", "allreduce": "ring"})
    sched = build_schedule(name, params, shape, Layout((0,) * p))
    comm = 5e-6
    cluster = zero_star(p, comm="5 us")
    # m has b*heads = 4 elements, (o, l) has 4*8 + 4 = 36: chunks of 1 and 9 elements of 4 bytes
    want = [(r, "compute", f"attend[{r}]", 0.0, 0.0) for r in range(p)]
    want += [(r, "compute", "pack-m", 0.0, 0.0) for r in range(p)]
    t = 0.0
    for tag, chunk, nxt in (("allreduce-max", 1, "rescale"), ("allreduce-sum", 9, "finalize")):
        want += [(r, "launch", f"{tag}.launch", t, t + comm) for r in range(p)]
        t += comm
        dur = OVH + 2 * LAT + chunk * 4 / BW
        for k in range(2 * (p - 1)):
            for i in range(p):
                want += [(i, "send", tag, t, t + dur), ((i + 1) % p, "recv", tag, t, t + dur)]
                if k < p - 1:  # reduce-scatter steps end with a (fused, here instantaneous) reduction
                    want.append(((i + 1) % p, "compute", f"{tag}.reduce", t + dur, t + dur))
            t += dur
        want += [(r, "compute", nxt, t, t) for r in range(p)]
    key = lambda x: (round(x[3], 15), x[0], x[1], x[2], round(x[4], 15))  # noqa: E731
    got = sorted(_trace(sched, cluster), key=key)
    want.sort(key=key)
    _assert_trace(got, want)


def test_collective_overhead_can_differ_from_a_standalone_send():
    from simulator.cluster.topology import build_cluster

    raw = {"nodes": [{"name": f"h{i}", "kind": "gpu", "device": "zero"} for i in range(4)]
           + [{"name": "s", "kind": "switch"}],
           "devices": {"zero": {"peak_flops": {"fp32": "1e30 FLOP/s"}, "mem_bw": "1e30 B/s", "launch_overhead": 0}},
           "links": [{"a": f"h{i}", "b": "s", "bandwidth": "25 GB/s", "latency": "1.5 us"} for i in range(4)],
           "message_overhead": "2 us", "comm_overhead": "3 us", "collective_overhead": "40 us"}
    cluster = build_cluster(raw, "<t>")
    n = 4_000_000
    res = simulate(coll_schedule(4, "allreduce", "ring", n), cluster)
    assert math.isclose(res.makespan, 40e-6 + 6 * (OVH + 2 * LAT + n / (4 * BW)), rel_tol=REL)
    sched = Schedule(4, placement=cluster.ranks)
    sched.add_transfer(0, 1, 1e6, "x")
    assert math.isclose(simulate(sched, cluster).makespan, 3e-6 + OVH + 2 * LAT + 1e6 / BW, rel_tol=REL)


def test_a_streamed_step_pays_no_fixed_seconds():
    """Three steps of a pipeline over one route, each after the previous: the first pays the message overhead and
    the route's latency (raised to its floor), the later ones (floor_s = STREAMED) only their bytes; a transfer
    outside any collective pays the communication overhead on top whatever its floor."""
    sched = Schedule(2, placement=("h0", "h1"))
    n = 1_000_000
    s0, _ = sched.add_transfer(0, 1, n, "step", coll="c", floor_s=10e-6)
    s1, _ = sched.add_transfer(0, 1, n, "step", send_deps=(s0,), coll="c", floor_s=STREAMED)
    s2, _ = sched.add_transfer(0, 1, n, "step", send_deps=(s1,), coll="c", floor_s=STREAMED)
    res = simulate(sched, zero_star(2))
    ends = res.op_ends()
    assert math.isclose(ends[s0], 10e-6 + n / BW, rel_tol=REL)  # max(OVH + 2 LAT = 5 us, the 10 us floor)
    assert math.isclose(ends[s1], ends[s0] + n / BW, rel_tol=REL)
    assert math.isclose(ends[s2], ends[s0] + 2 * n / BW, rel_tol=REL)
    alone = Schedule(2, placement=("h0", "h1"))
    alone.add_transfer(0, 1, n, "p2p", floor_s=STREAMED)
    comm = 3e-6
    assert math.isclose(simulate(alone, zero_star(2, comm="3 us")).makespan, comm + n / BW, rel_tol=REL)
