"""A schedule's ops held as blocks of columns (simulator.schedule.oplist): to every reader the same ops as tuples, and
to the
engine the same columns and the same floats as the tuples would give."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.algorithms import build_schedule, resolve
from simulator.cluster.topology import load_topology
from simulator.engine.core import simulate
from simulator.run.prepared import layout_of
from simulator.schedule.core import Op, Schedule
from simulator.schedule.memory import timeline_peaks
from simulator.schedule.op import OP_KINDS
from simulator.schedule.oplist import Indexed, OpBlock, OpList, TransferBlock, factorize
from simulator.workloads.shape import DecodeShape

RANKS = 4


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    """Blocks (transfer steps, kernel steps with deps as tuples or as a padded array) mixed with ops added one at a
    time (launches, transfers with floors, caps and not_before, merges)."""
    sched = Schedule(RANKS)
    kernels = [("k0", 1e6, 2e6, (64.0,)), ("k1", 3e6, 1e6, (128.0,)), ("k2", 0.0, 5e5, ())]
    for _ in range(draw(st.integers(1, 8))):
        n = len(sched.ops)
        dep = st.integers(0, n - 1) if n else st.nothing()
        width = draw(st.integers(1, 5))
        src = draw(st.lists(st.integers(0, RANKS - 1), min_size=width, max_size=width))
        deps = [tuple(draw(st.lists(dep, max_size=2))) if n else () for _ in range(width)]
        what = draw(st.sampled_from(["transfers", "step", "padded", "one", "launch", "merge", "mixed"]))
        if what == "mixed":
            _mixed(draw, sched, src, deps)
        elif what == "transfers":
            dst = [(s + draw(st.integers(1, RANKS - 1))) % RANKS for s in src]
            sched.add_transfers(src, dst, [float(draw(st.integers(0, 10**8))) for _ in src],
                                [f"t{d}" for d in dst], deps, deps[::-1], args=("a",), dst_args=("b",),
                                alloc=(("b", 8.0),) if draw(st.booleans()) else (),
                                coll=draw(st.sampled_from(["", "c"])))
        elif what in ("step", "padded"):
            which = np.array(draw(st.lists(st.integers(0, 2), min_size=width, max_size=width)))
            given_deps: list[tuple[int, ...]] | np.ndarray = deps
            if what == "padded":
                given_deps = np.full((width, 2), -1)
                for k, d in enumerate(deps):
                    given_deps[k, :len(d)] = d
            allocs = draw(st.sampled_from(["none", "shared", "each"]))
            alloc: tuple[tuple[str, float], ...] | Indexed = (("acc", 4.0),) if allocs == "shared" else ()
            if allocs == "each":  # some ops allocate, some do not, some another size
                alloc = Indexed([(), (("acc", 4.0),), (("acc", 6.0), ("m", 1.0))], np.array(
                    draw(st.lists(st.integers(0, 2), min_size=width, max_size=width))))
            sched.add_kernel_step(src, Indexed(kernels, which), given_deps, dtype="bf16", fn="attend", out="acc",
                                  args=("q",), fused=draw(st.booleans()), alloc=alloc)
        elif what == "one":
            sched.add_transfer(src[0], (src[0] + 1) % RANKS, float(draw(st.integers(0, 10**8))), "x", send_deps=deps[0],
                               not_before_s=draw(st.sampled_from([0.0, 1e-5])), floor_s=draw(st.sampled_from(
                                   [0.0, -1.0, 3e-6])), rate_cap=draw(st.sampled_from([0.0, 1e9])), coll="c",
                               free_src=("a",) if draw(st.booleans()) else ())
        elif what == "launch":
            sched.add_launch(src[0], "l", deps=deps[0], floor_s=draw(st.sampled_from([0.0, 2e-5])))
        else:
            sched.add_compute(src[0], "m", kind="merge", flops=1e3, nbytes=4e3, deps=deps[0])
    return sched


def _mixed(draw: st.DrawFn, sched: Schedule, src: list[int], deps: list[tuple[int, ...]]) -> None:
    """An OpBlock (``add_ops``): per entry a transfer (send, recv) or a compute op, interleaved, each op after
    earlier ops of the schedule or of the block; every other field shared, an array or an Indexed."""
    first = len(sched.ops)
    kind, rank, match, op_deps = [], [], [], []
    for s, d in zip(src, deps, strict=True):
        inside = st.integers(first, first + len(kind) - 1) if kind else st.nothing()
        own = tuple(draw(st.lists(inside, max_size=2))) if kind else ()
        if draw(st.booleans()):
            k = len(kind)
            kind += [2, 3]
            rank += [s, (s + draw(st.integers(1, RANKS - 1))) % RANKS]
            match += [first + k + 1, first + k]
            op_deps += [d + own, own]
        else:
            kind.append(draw(st.sampled_from([0, 1])))
            rank.append(s)
            match.append(-1)
            op_deps.append(own + d)
    m = len(kind)
    ints = st.lists(st.integers(0, 2), min_size=m, max_size=m)

    def field(shared: object, table: list[object], per_op: list[float] | None = None) -> object:
        how = draw(st.sampled_from(["shared", "indexed", "array"] if per_op is not None else ["shared", "indexed"]))
        if how == "shared":
            return shared
        if how == "array":
            return np.array(per_op)
        return Indexed(table, np.array(draw(ints)))

    sizes = [float(draw(st.integers(0, 10**8))) for _ in range(m)]
    sched.add_ops(np.array(kind), np.array(rank), op_deps, np.array(match), name=field("x", ["x", "y", "z"]),
                  nbytes=field(1e6, [0.0, 1e3, 2e6], sizes), flops=field(0.0, [0.0, 1e6, 3e6], sizes),
                  dtype=field("bf16", ["fp32", "bf16", "fp64"]), floor_s=field(-1.0, [0.0, -1.0, 3e-6], sizes),
                  rate_cap=field(0.0, [0.0, 1e9, 2e9]), coll=field("c", ["", "c", "d"]),
                  args=field(("a",), [(), ("a",), ("b", "c")]), alloc=field((), [(), (("t", 8.0),), ()]),
                  free=field((), [(), ("t",), ()]), fused=field(True, [False, True, False]),
                  into=np.array(draw(st.lists(st.booleans(), min_size=m, max_size=m))), lo=3, hi=field(9, [9, -1, 4]),
                  dims=field((), [(), (64.0,), (128.0, 2.0)]), not_before_s=field(0.0, [0.0, 1e-5, 0.0]))


def _tuples(sched: Schedule) -> Schedule:
    """The same schedule with its ops held as tuples, one segment."""
    return Schedule(sched.ranks, ops=OpList(list(sched.ops)), placement=sched.placement, initial=sched.initial)


@settings(max_examples=60, deadline=None)
@given(schedules())
def test_blocks_give_the_columns_and_holders_of_their_tuples(sched: Schedule) -> None:
    flat = _tuples(sched)
    a, b = sched.ops.columns(), flat.ops.columns()
    for name in ("kind", "rank", "match", "nbytes", "floor", "rate_cap", "coll", "not_before", "dep_count",
                 "parents"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.no_match == b.no_match == -1
    # the same kernels share a cost id, whatever its number
    key_a, key_b = list(a.cost_keys), list(b.cost_keys)
    assert [key_a[i] if i >= 0 else None for i in a.cost.tolist()] == [key_b[i] if i >= 0 else None
                                                                      for i in b.cost.tolist()]
    assert sched.ops.holders() == flat.ops.holders() == [op.id for op in sched.ops if op.alloc or op.free]


@settings(max_examples=60, deadline=None)
@given(schedules())
def test_a_blocks_kernels_grouped_get_the_cost_ids_they_get_op_by_op(sched: Schedule) -> None:
    grouped = sched.ops.columns()
    plain = OpBlock._cost_groups
    try:
        OpBlock._cost_groups = lambda self, comp: None  # type: ignore[method-assign]  # every op's key read
        one_by_one = sched.ops.columns()
    finally:
        OpBlock._cost_groups = plain  # type: ignore[method-assign]
    assert np.array_equal(grouped.cost, one_by_one.cost)
    assert list(grouped.cost_keys.items()) == list(one_by_one.cost_keys.items())


@settings(max_examples=40, deadline=None)
@given(schedules())
def test_an_op_list_reads_as_a_list_of_ops(sched: Schedule) -> None:
    ops = list(sched.ops)
    assert len(sched.ops) == len(ops) and [op.id for op in ops] == list(range(len(ops)))
    assert all(type(op) is Op for op in ops)
    assert [sched.ops[i] for i in range(len(ops))] == ops
    assert sched.ops[-1] == ops[-1] and sched.ops[1::3] == ops[1::3]
    assert sched.ops == ops and sched.ops == _tuples(sched).ops
    picks = np.random.default_rng(len(ops)).integers(-len(ops), len(ops), size=2 * len(ops))
    assert sched.ops.take(picks) == [ops[i] for i in picks.tolist()]  # any order, repeats, from the end
    for name in Op._fields:  # one field without the ops: what the ops say
        assert sched.ops.field(name, picks) == [getattr(ops[i], name) for i in picks.tolist()], name
    with pytest.raises(ValueError, match="no field 'size'"):
        sched.ops.field("size", picks)
    with pytest.raises(IndexError):
        sched.ops[len(ops)]
    with pytest.raises(IndexError):
        sched.ops.take([0, len(ops)])
    changed = ops[0]._replace(name="changed")
    sched.ops[0] = changed  # a block's ops become tuples to change one
    assert list(sched.ops) == [changed, *ops[1:]]


def test_a_block_must_follow_on() -> None:
    sched = Schedule(2)
    sched.add_compute(0, "a")
    with pytest.raises(ValueError, match="add_kernel_step needs one kernel, deps and allocation per op"):
        sched.add_kernel_step([0, 1], Indexed([("k", 1.0, 1.0, ())], np.zeros(1, dtype=np.int64)), [(), ()])
    with pytest.raises(ValueError, match="dependency 3 does not name an earlier op"):
        sched.add_kernel_step([0, 1], Indexed([("k", 1.0, 1.0, ())], np.zeros(2, dtype=np.int64)),
                              np.array([[0, -1], [3, -1]]))
    assert len(sched.ops) == 1


def test_bulk_computes_keep_each_ops_values_as_given() -> None:
    """Kernels that compare equal but differ (a dims of int or float, -0.0 and 0.0) stay each op's own."""
    one, bulk = Schedule(2), Schedule(2)
    for dims, flops in (((3,), -0.0), ((3.0,), 0.0)):
        one.add_compute(0, "k", flops=flops, dims=dims)
    bulk.add_computes([0, 0], ["k", "k"], [-0.0, 0.0], [0.0, 0.0], [(3,), (3.0,)], [(), ()])
    assert [(repr(op.flops), repr(op.dims)) for op in bulk.ops] == [(repr(op.flops), repr(op.dims)) for op in one.ops]
    assert [repr(op.dims) for op in bulk.ops] == ["(3,)", "(3.0,)"]


def test_indexes_and_blocks_are_checked_before_anything_is_added() -> None:
    sched = Schedule(2)
    sched.add_compute(0, "a")
    table = [("k", 1.0, 1.0, ())]
    with pytest.raises(ValueError, match="a kernel index outside the table of 1"):
        sched.add_kernel_step([0, 1], Indexed(table, np.array([0, -1])), [(), ()])
    with pytest.raises(ValueError, match="an allocation index outside the table of 1"):
        sched.add_kernel_step([0], Indexed(table, np.array([0])), [()], alloc=Indexed([()], np.array([1])))
    with pytest.raises(ValueError, match="a name index outside the table of 1"):
        sched.add_transfers([0], [1], [1.0], Indexed(["x"], np.array([2])), [()], [()])
    with pytest.raises(ValueError, match="must be integers"):
        sched.add_kernel_step([0], Indexed(table, np.array([0])), np.array([[np.nan]]))
    with pytest.raises(ValueError, match="may only grow"):
        sched.add_kernel_step([0], Indexed(table, np.array([0])), [()])
        table.pop()
        sched.add_kernel_step([0], Indexed(table, np.array([0])), [()])
    n = len(sched.ops)
    bad = TransferBlock(n, np.array([0]), np.array([1]), np.array([1.0]), ["x"], np.array([0]),
                        np.array([0, 5]), np.array([0]), np.array([0, 0]), np.zeros(0, np.int64), (), (), (), "")
    with pytest.raises(ValueError, match="not CSR"):
        sched.ops.add_block(bad)
    with pytest.raises(TypeError, match="integers"):
        sched.ops.take(np.array([0.5]))
    with pytest.raises(TypeError, match="one at a time"):
        sched.ops[0:1] = []  # type: ignore[index,assignment]
    assert len(sched.ops) == n


def test_a_block_of_any_kinds_is_checked_before_anything_is_added() -> None:
    sched = Schedule(3)
    sched.add_compute(0, "a")
    send, recv, comp = (np.uint8(k) for k in (2, 3, 0))
    ok = {"kind": np.array([send, recv, comp]), "rank": np.array([0, 1, 1]), "deps": [(0,), (), (2,)],
          "match": np.array([2, 1, -1])}
    cases = [({"deps": [(0,), (), (3,)]}, "does not name an earlier op"),
             ({"deps": [(0,), (), (-1,)]}, "does not name an earlier op"),
             ({"rank": np.array([0, 3, 1])}, "rank 3 out of range 0..2"),
             ({"rank": np.array([1, 1, 1])}, "do not name each other"),
             ({"match": np.array([1, 1, -1])}, "do not name each other"),
             ({"match": np.array([2, 1, 1])}, "does not name its other end in the block"),
             ({"match": np.array([2, 5, -1])}, "does not name its other end in the block"),
             ({"kind": np.array([send, send, comp])}, "do not name each other"),
             ({"kind": np.array([2, 3, 9])}, "a kind outside 0..4"),
             ({"kind": np.array([258, 3, 0])}, "a kind outside 0..4"),  # not wrapped to a send
             ({"rank": np.array([0.0, 1.0, 1.0])}, "rank must be integers"),
             ({"match": np.array([2, 1])}, "one entry per op")]
    for change, message in cases:
        args = {**ok, **change}
        with pytest.raises(ValueError, match=message):
            sched.add_ops(args["kind"], args["rank"], args["deps"], args["match"])
    for fields, message in [({"peer": 3}, "'peer' is not one of Op's"), ({"colour": 1}, "'colour' is not one of"),
                            ({"nbytes": np.ones(2)}, "'nbytes' does not have one entry per op"),
                            ({"name": Indexed(["x"], np.array([0, 1, 0]))}, "'name' indexes outside its table"),
                            ({"nbytes": Indexed([5.0, 7.0], np.array([False, True, True]))}, "not by integers"),
                            ({"floor_s": [0.0, 1.0, 2.0]}, "'floor_s' is a list"),
                            ({"nbytes": np.array([-1.0, -1.0, 0.0])}, "negative size")]:
        with pytest.raises(ValueError, match=message):
            sched.add_ops(ok["kind"], ok["rank"], ok["deps"], ok["match"], **fields)
    assert len(sched.ops) == 1
    first = sched.add_ops(ok["kind"], ok["rank"], tuple(ok["deps"]), ok["match"], name="t", nbytes=8.0)
    assert first == 1  # deps as a tuple of tuples: one per op (not read as CSR)
    assert [(op.kind, op.rank, op.peer, op.match, op.deps) for op in sched.ops[1:]] == [
        ("send", 0, 1, 2, (0,)), ("recv", 1, 0, 1, ()), ("compute", 1, None, None, (2,))]


@pytest.mark.parametrize(("algo", "nodes"), [("ring", 2), ({"name": "ring", "overlap": False}, 2), ("tree", 4)])
def test_the_engine_runs_blocks_as_it_runs_tuples(algo: str | dict[str, object], nodes: int) -> None:
    shape = DecodeShape(batch=2, heads=8, head_dim=64, kv_heads=4, context=40_000, dtype="bf16")
    cluster = load_topology("dgx-h100", {"nodes": nodes})
    name, params = resolve(algo)
    sched = build_schedule(name, params, shape, layout_of(cluster))
    assert any(not isinstance(seg, list) for seg in sched.ops._segs)  # held as blocks
    blocks, tuples = simulate(sched, cluster), simulate(_tuples(sched), cluster)
    assert np.array_equal(blocks.start, tuples.start) and np.array_equal(blocks.end, tuples.end)
    assert (blocks.events, blocks.allocations, blocks.bytes_sent()) == (tuples.events, tuples.allocations,
                                                                         tuples.bytes_sent())
    assert timeline_peaks(sched, blocks) == timeline_peaks(_tuples(sched), tuples)
    sends = blocks.ended(frozenset({"send"}))
    assert blocks.bytes_sent() == sum(op.nbytes for op in sched.ops.take(sends))  # added in timeline order
    for ranks in ([0], [1, 0], list(range(blocks.ranks)), [], [blocks.ranks + 5]):  # the ops of ranks and kinds
        for kinds in (None, frozenset({"send"}), frozenset({"compute", "merge"})):
            want = blocks.order[np.isin(blocks.rank_of[blocks.order], ranks)]
            if kinds is not None:
                want = want[np.isin(blocks.kind_of[want], [OP_KINDS.index(k) for k in kinds])]
            assert np.array_equal(blocks.ended(kinds, ranks), want)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 300), st.sampled_from(["small ints", "floats", "large ints"]), st.integers(0, 2**32 - 1))
def test_factorize_numbers_values_as_pandas_does(n, kind, seed):
    """The cost groups' codes: the distinct values numbered by first appearance, as ``pd.factorize`` numbers them,
    below and above the size where a dict gives way to pandas' hash table (0.0 and -0.0 one value)."""
    rng = np.random.default_rng(seed)
    values = {"small ints": lambda: rng.integers(-5, 5, size=n),
              "floats": lambda: rng.choice([0.0, -0.0, 1.5, 2.25, 1e300, -3.0], size=n),
              "large ints": lambda: rng.integers(0, 10**12, size=n)}[kind]()
    assert factorize(values).tolist() == pd.factorize(values)[0].tolist()
