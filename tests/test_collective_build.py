"""Collectives built as before issue 41 and as now give the same engine floats: a collective's frontier names a
rank's latest ops, not its history (a ring's allgather gave its last ops P deps each, O(P^2) per rank and
channel), and a ring's lockstep steps are built over arrays (collectives.ring.ring_steps: the ops CollBuilder.step
appends one step at a time, the same ids, fields and deps; the ring's build was Python, 4 us an op), and the
tuner prices an all-to-all's slowest hop without a Python loop over its P^2 pairs."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import simulator.collectives.channels as channels_module
import simulator.collectives.ring as ring_module
from simulator.cluster.topology import load_topology
from simulator.collectives import allreduce, broadcast, fabric_of, reduce
from simulator.collectives.base import CollBuilder, chunk_bounds
from simulator.collectives.channels import Choice
from simulator.collectives.protocols import PROTOCOLS
from simulator.collectives.standalone import collective_schedule
from simulator.collectives.tuner import _Predictor
from simulator.engine.core import simulate
from simulator.schedule.core import Schedule


def _history_step(self: CollBuilder, moves: Sequence[tuple[int, int, int, int]], reduce: bool) -> None:
    """CollBuilder.step as it was before issue 41: a sender's frontier kept its frontier from before the step."""
    if self.offset:
        moves = [(src, dst, lo + self.offset, hi + self.offset) for src, dst, lo, hi in moves]
    before = {r: self.front[r] for move in moves for r in move[:2]}
    received = []
    sends: dict[int, list[tuple[int, int, int]]] = {}
    for src, dst, lo, hi in moves:
        snd, recv, tmp = self._transfer(src, dst, lo, hi, reduce, before[src], before[dst])
        sends.setdefault(src, []).append((snd, lo, hi))
        received.append((recv, dst, lo, hi, tmp))
    for src, items in sends.items():
        if self.front[src] == before[src]:
            self.front[src] = (*before[src], *(snd for snd, _, _ in items))
    for recv, dst, lo, hi, tmp in received:
        if not reduce:
            self.front[dst] = (*self.front[dst], recv) if self.front[dst] != before[dst] else (recv,)
            continue
        war = [snd for snd, slo, shi in sends.get(dst, ()) if slo < hi and lo < shi]
        self.front[dst] = (self._reduction(dst, lo, hi, tmp, (recv, *self.front[dst], *war)),)


def ring_steps_one_by_one(b: CollBuilder, ranks: Sequence[int], first: int, steps: int, reduce: bool) -> None:
    """The ring's steps as they were built before issue 41: CollBuilder.step once a step."""
    p, chunks = len(ranks), chunk_bounds(b.n, len(ranks))
    for k in range(steps):
        b.step([(ranks[i], ranks[(i + 1) % p], *chunks[(i + first - k) % p]) for i in range(p)], reduce=reduce)


def pairwise_one_by_one(b: CollBuilder, ranks: list[int]) -> None:
    """The pairwise all-to-all as it was built before issue 41: CollBuilder.step once a step."""
    p, blocks = len(ranks), chunk_bounds(b.n, len(ranks))
    for k in range(1, p):
        b.step([(ranks[i], ranks[(i + k) % p], *blocks[(i + k) % p]) for i in range(p)], reduce=False)


def as_before(m: pytest.MonkeyPatch, history: bool = True) -> None:
    """Build as before issue 41: rings and all-to-alls step by step and (``history``) frontiers that keep their
    history."""
    m.setattr(ring_module, "ring_steps", ring_steps_one_by_one)
    m.setattr(channels_module, "ring_steps", ring_steps_one_by_one)
    m.setattr(channels_module, "_pairwise_alltoall", pairwise_one_by_one)
    if history:
        m.setattr(CollBuilder, "step", _history_step)


def _records(sched: Schedule, cluster) -> tuple:
    res = simulate(sched, cluster)
    return res.events, res.allocations, [(r.op, r.start, r.end) for r in res.timeline], res.bytes_sent()


def _without_deps(sched: Schedule) -> list:
    return [op._replace(deps=()) for op in sched.ops]


CASES = [("hgx-h200", 2, "allreduce", "ring", "LL"), ("hgx-h200", 2, "allreduce", "ring", "Simple"),
         ("dgx-h100", 2, "allreduce", "hierarchical", "auto"), ("dgx-h100", 2, "allreduce", "recursive-doubling",
                                                                "auto"),
         ("dgx-h100", 2, "allgather", "auto", "auto"), ("dgx-h100", 2, "reduce-scatter", "auto", "LL128"),
         ("dgx-h100", 2, "alltoall", "auto", "auto"), ("mi300x", 1, "allreduce", "ring", "auto"),
         ("dgx-a100", 2, "allreduce", "ring", "Simple")]


@pytest.mark.parametrize(("topo", "nodes", "operation", "algo", "protocol"), CASES)
def test_frontier_gives_the_floats_of_the_history(monkeypatch, topo, nodes, operation, algo, protocol):
    cluster = load_topology(topo, {"nodes": nodes})
    n = 3 * 2**20 + 5  # uneven pieces
    new, choice = collective_schedule(cluster, fabric_of(cluster), operation, n, 2, "bf16", algo, protocol)
    with monkeypatch.context() as m:
        as_before(m)
        old, old_choice = collective_schedule(cluster, fabric_of(cluster), operation, n, 2, "bf16", algo, protocol)
    assert choice == old_choice
    assert _without_deps(new) == _without_deps(old)  # the same ops, ids and fields; only deps differ
    assert all(set(a.deps) <= set(b.deps) for a, b in zip(new.ops, old.ops, strict=True))  # fewer, none new
    assert _records(new, cluster) == _records(old, cluster)  # to the last float


@pytest.mark.parametrize("what", ["allreduce", "reduce", "broadcast"])
@pytest.mark.parametrize("algo", ["ring", "double-binary-tree", "recursive-doubling", "hierarchical"])
def test_decompositions_without_a_fabric_unchanged(monkeypatch, what, algo):
    cluster = load_topology("dgx-h100", {"nodes": 2})
    hosts, p = cluster.host_indices(cluster.ranks), len(cluster.ranks)

    def build() -> Schedule:
        s = Schedule(p)
        common = {"algo": algo, "elem_bytes": 2, "dtype": "bf16", "tag": "c", "deps": {}}
        if what == "allreduce":
            allreduce(s, list(range(p)), hosts, "x", 2**20 + 3, op="sum", **common)
        elif what == "reduce":
            reduce(s, list(range(p)), hosts, "x", 2**20 + 3, root=3, op="sum", **common)
        else:
            broadcast(s, list(range(p)), hosts, "x", 2**20 + 3, root=3, **common)
        return s

    new = build()
    with monkeypatch.context() as m:
        as_before(m)
        old = build()
    assert _without_deps(new) == _without_deps(old)
    assert _records(new, cluster) == _records(old, cluster)


def test_ring_deps_do_not_grow_with_the_ring():
    cluster = load_topology("hgx-h200", {"nodes": 4})
    sched, _ = collective_schedule(cluster, fabric_of(cluster), "allreduce", 2**20, 2, "bf16", "ring")
    assert max(len(op.deps) for op in sched.ops) <= 3  # was 2 P - 3 = 61 for a ring of 32


RING_CASES = [("hgx-h200", 3, "allreduce", "ring", "LL", 2**20 + 7), ("hgx-h200", 2, "allreduce", "ring", "Simple", 5),
         ("dgx-h100", 2, "allreduce", "hierarchical", "auto", 3 * 2**20 + 1),
         ("dgx-h100", 2, "allgather", "auto", "LL128", 2**20), ("dgx-h100", 1, "reduce-scatter", "auto", "LL", 999),
         ("mi300x", 1, "allreduce", "ring", "auto", 2**21 + 3), ("dgx-a100", 2, "allreduce", "ring", "Simple", 2**20),
         ("hgx-h200", 3, "alltoall", "auto", "auto", 2**20 + 9), ("mi300x", 1, "alltoall", "auto", "LL", 2**20)]


@pytest.mark.parametrize(("topo", "nodes", "operation", "algo", "protocol", "n"), RING_CASES)
def test_ring_steps_are_the_step_by_step_ops(monkeypatch, topo, nodes, operation, algo, protocol, n):
    cluster = load_topology(topo, {"nodes": nodes})
    new, _ = collective_schedule(cluster, fabric_of(cluster), operation, n, 2, "bf16", algo, protocol)
    with monkeypatch.context() as m:
        as_before(m, history=False)
        old, _ = collective_schedule(cluster, fabric_of(cluster), operation, n, 2, "bf16", algo, protocol)
    assert list(new.ops) == list(old.ops)  # every field of every op, floats to the last bit
    a, b = simulate(new, cluster), simulate(old, cluster)
    assert [(r.op, r.start, r.end) for r in a.timeline] == [(r.op, r.start, r.end) for r in b.timeline]


@pytest.mark.parametrize("algo", ["ring", "hierarchical"])
def test_without_a_fabric_too(monkeypatch, algo):
    cluster = load_topology("dgx-h100", {"nodes": 2})
    hosts, p = cluster.host_indices(cluster.ranks), len(cluster.ranks)

    def build() -> Schedule:
        s = Schedule(p)
        launch = {r: (s.add_compute(r, "before"),) for r in range(0, p, 3)}  # frontiers of uneven lengths
        allreduce(s, list(range(p)), hosts, "x", 4 * p + 3, op="max", algo=algo, elem_bytes=4, dtype="fp32",
                  tag="t", deps=launch)
        return s

    new = build()
    with monkeypatch.context() as m:
        as_before(m, history=False)
        old = build()
    assert list(new.ops) == list(old.ops)


def _pairwise_as_before(pred: _Predictor, nbytes: float) -> float:
    """The tuner's all-to-all time as it was before issue 41: the slowest hop pair by pair, P^2 pairs in Python."""
    p = len(pred.ranks)
    pairs = [[(pred.ranks[i], pred.ranks[(i + k) % p])] for k in range(1, p) for i in range(p)]
    hop = max(pred.hop(a, b) for (a, b), in pairs)
    return pred.launch + (p - 1) * (hop + nbytes / p / pred.shared_bw(pairs[:p]))


@pytest.mark.parametrize(("topo", "nodes"), [("hgx-h200", 3), ("dgx-a100", 2), ("mi300x", 1), ("rtx4090-pcie", 2)])
def test_the_tuners_all_to_all_time_is_the_pair_by_pair_one(topo, nodes):
    cluster = load_topology(topo, {"nodes": nodes})
    fabric, ranks = fabric_of(cluster), list(range(len(cluster.ranks)))
    for k, protocol in enumerate(PROTOCOLS):
        pred = _Predictor(cluster, fabric, Choice("pairwise", protocol, 1), ranks)
        if k == 0:  # some wires routed one by one (Predictor.wire), as other predictions may have left them
            _ = [pred.wire(a, (a + 1) % len(ranks)) for a in ranks]
        assert pred.time("alltoall", 3e6 + k) == _pairwise_as_before(pred, 3e6 + k)
