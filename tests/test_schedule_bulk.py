"""Schedule.add_transfers / add_computes (a whole step at once) give the ops of the one-at-a-time calls, and the
engine's timeline comes out in (start, rank, op) order with every rank's end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.algorithms import build_schedule, resolve
from simulator.cluster.topology import load_topology
from simulator.engine.core import simulate
from simulator.run.prepared import layout_of
from simulator.schedule.core import Op, Schedule
from simulator.workloads.shape import DecodeShape

RANKS = 5


@st.composite
def steps(draw: st.DrawFn) -> list[tuple[str, list[tuple[int, ...]]]]:
    """A few steps, each a list of (rank(s), size, deps picked among the ops before the step)."""
    out = []
    n = 0
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["transfers", "computes"]))
        width = draw(st.integers(1, 6))
        items = []
        for _ in range(width):
            deps = tuple(sorted(draw(st.sets(st.integers(0, n - 1), max_size=2)))) if n else ()
            deps2 = tuple(sorted(draw(st.sets(st.integers(0, n - 1), max_size=2)))) if n else ()
            src = draw(st.integers(0, RANKS - 1))
            dst = (src + draw(st.integers(1, RANKS - 1))) % RANKS
            items.append((src, dst, draw(st.integers(0, 10**9)), deps, deps2))
        out.append((kind, items))
        n += width * (2 if kind == "transfers" else 1)
    return out


@settings(max_examples=60, deadline=None)
@given(steps())
def test_bulk_steps_give_the_ops_of_one_call_each(plan: list[tuple[str, list[tuple[int, ...]]]]) -> None:
    one, bulk = Schedule(RANKS), Schedule(RANKS)
    for kind, items in plan:
        if kind == "transfers":
            for src, dst, size, sd, rd in items:
                one.add_transfer(src, dst, size, f"t{size}", send_deps=sd, recv_deps=rd, args=("a",),
                                 dst_args=("b",), alloc=(("b", 8.0),), coll="c")
            first = bulk.add_transfers([i[0] for i in items], [i[1] for i in items], [i[2] for i in items],
                                       [f"t{i[2]}" for i in items], [i[3] for i in items], [i[4] for i in items],
                                       args=("a",), dst_args=("b",), alloc=(("b", 8.0),), coll="c")
        else:
            fused = len(items) % 2 == 1  # a reduction inside a communication kernel, or not
            for src, _, size, deps, _ in items:
                one.add_compute(src, f"k{size}", flops=size, nbytes=2 * size, dtype="bf16", deps=deps, fn="attend",
                                out="acc", args=("q", "kv0"), alloc=(("acc", 4.0),), dims=(float(size),),
                                fused=fused)
            first = bulk.add_computes([i[0] for i in items], [f"k{i[2]}" for i in items], [i[2] for i in items],
                                      [2 * i[2] for i in items], [(float(i[2]),) for i in items],
                                      [i[3] for i in items], dtype="bf16", fn="attend", out="acc",
                                      args=("q", "kv0"), alloc=(("acc", 4.0),), fused=fused)
        assert first == len(bulk.ops) - len(items) * (2 if kind == "transfers" else 1)
    assert bulk.ops == one.ops
    assert [tuple(map(type, op)) for op in bulk.ops] == [tuple(map(type, op)) for op in one.ops]
    assert all(type(op) is Op for op in bulk.ops)


@pytest.mark.parametrize(("src", "dst", "size", "deps", "message"), [
    ([0, 7], [1, 0], [1, 1], [(), ()], r"rank 7 out of range 0\.\.3"),
    ([0, 2], [1, 2], [1, 1], [(), ()], "a transfer needs two different ranks, got 2 twice"),
    ([0, 2], [1, 3], [1, -1], [(), ()], "nbytes must not be negative, got -1"),
    ([0, 2], [1, 3], [1, 1], [(0,), (5,)], "dependency 5 does not name an earlier op"),
    ([0, 2], [1, 3], [1, 1], [(-1,), ()], "dependency -1 does not name an earlier op"),
])
def test_bulk_transfers_refuse_what_add_transfer_refuses(src: list[int], dst: list[int], size: list[float],
                                                         deps: list[tuple[int, ...]], message: str) -> None:
    sched = Schedule(4)
    sched.add_compute(0, "x")
    with pytest.raises(ValueError, match=message):
        sched.add_transfers(src, dst, size, ["t"] * 2, deps, [()] * 2)
    assert len(sched.ops) == 1  # nothing added


def test_bulk_computes_refuse_bad_ranks_and_deps() -> None:
    sched = Schedule(2)
    with pytest.raises(ValueError, match=r"rank 2 out of range 0\.\.1"):
        sched.add_computes([0, 2], ["a", "b"], [1, 1], [1, 1], [(), ()], [(), ()])
    with pytest.raises(ValueError, match="dependency 0 does not name an earlier op"):
        sched.add_computes([0, 1], ["a", "b"], [1, 1], [1, 1], [(), ()], [(), (0,)])
    with pytest.raises(ValueError, match="one name, cost, dims and deps per op"):
        sched.add_computes([0, 1], ["a"], [1, 1], [1, 1], [(), ()], [(), ()])
    assert not sched.ops


@pytest.mark.parametrize("algo", ["ring", "ring-q", "tree"])
def test_timeline_in_start_rank_op_order_with_every_ranks_end(algo: str) -> None:
    shape = DecodeShape(batch=1, heads=4, head_dim=64, kv_heads=4, context=4096, dtype="bf16")
    cluster = load_topology("dgx-h100", {"nodes": 2})
    name, params = resolve(algo)
    sched = build_schedule(name, params, shape, layout_of(cluster))
    res = simulate(sched, cluster)
    keys = [(r.start, r.rank, r.op) for r in res.timeline]
    assert keys == sorted(keys) and len(keys) == len(sched.ops) == len({r.op for r in res.timeline})
    for rec in res.timeline:
        op = sched.ops[rec.op]
        assert (rec.rank, rec.kind, rec.name, rec.nbytes, rec.flops) == (op.rank, op.kind, op.name, op.nbytes, op.flops)
        assert rec.start <= rec.end
    ends: dict[int, float] = {}
    for rec in res.timeline:
        ends[rec.rank] = max(ends.get(rec.rank, 0.0), rec.end)
    assert res.end_time == ends
