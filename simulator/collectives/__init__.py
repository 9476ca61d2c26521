"""Collectives by name: allreduce, reduce and broadcast decompositions into sends, receives and reductions.

Names (docs/architecture.md): ``ring``, ``double-binary-tree``, ``recursive-doubling``, ``hierarchical``
(inside each node, then across node leaders, then inside again) and ``auto`` (NCCL's choice for these small
messages: ring inside one node, a tree across nodes, i.e. ``hierarchical``). Reduce and broadcast have no
double-tree or doubling form of their own: those names give the binomial tree (ceil(log2 P) rounds).

Each function appends ops to a schedule and returns the frontier: for every rank, the op ids after which the
buffer holds the result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from simulator.collectives.base import REDUCE_OPS, CollBuilder, chunk_bounds
from simulator.collectives.ring import ring_allreduce, ring_broadcast, ring_reduce
from simulator.collectives.trees import (
    binomial_broadcast,
    binomial_reduce,
    double_binary_tree_allreduce,
    recursive_doubling_allreduce,
)
from simulator.errors import InputError
from simulator.schedule import Schedule

__all__ = ["ALGORITHMS", "REDUCE_OPS", "Frontier", "allreduce", "broadcast", "chunk_bounds", "reduce"]

ALGORITHMS = ("ring", "double-binary-tree", "recursive-doubling", "hierarchical", "auto")
Frontier = dict[int, tuple[int, ...]]

_ALLREDUCE: dict[str, Callable[[CollBuilder, Sequence[int]], None]] = {
    "ring": ring_allreduce,
    "double-binary-tree": double_binary_tree_allreduce,
    "recursive-doubling": recursive_doubling_allreduce,
}
_ROOTED: dict[str, tuple[Callable[[CollBuilder, Sequence[int], int], None],
                         Callable[[CollBuilder, Sequence[int], int], None]]] = {
    "ring": (ring_reduce, ring_broadcast),
    "double-binary-tree": (binomial_reduce, binomial_broadcast),
    "recursive-doubling": (binomial_reduce, binomial_broadcast),
}
INTER_NODE = "double-binary-tree"  # across node leaders inside `hierarchical`
INTRA_NODE = "ring"


def check_algorithm(name: str, field: str = "allreduce") -> str:
    if name not in ALGORITHMS:
        raise InputError(f"unknown collective algorithm {name!r}; valid: {', '.join(ALGORITHMS)}", field=field)
    return name


def _groups(ranks: Sequence[int], hosts: Sequence[int]) -> list[list[int]]:
    by_host: dict[int, list[int]] = {}
    for r in ranks:
        by_host.setdefault(hosts[r], []).append(r)
    return list(by_host.values())


def _resolve(algo: str, ranks: Sequence[int], hosts: Sequence[int]) -> str:
    check_algorithm(algo)
    if algo == "auto":
        return INTRA_NODE if len(_groups(ranks, hosts)) == 1 else "hierarchical"
    if algo == "hierarchical" and len(_groups(ranks, hosts)) == 1:
        return INTRA_NODE
    return algo


def _builder(sched: Schedule, ranks: Sequence[int], buf: str, n: int, elem_bytes: int, dtype: str, op: str,
             tag: str, deps: Mapping[int, Iterable[int]], kind: str, root: int | None = None) -> CollBuilder:
    return CollBuilder.start(sched, ranks, buf, n, elem_bytes, dtype, op, tag, deps, kind, root)


def allreduce(sched: Schedule, ranks: Sequence[int], hosts: Sequence[int], buf: str, n: int, *, op: str,
              algo: str, elem_bytes: int, dtype: str, tag: str, deps: Mapping[int, Iterable[int]]) -> Frontier:
    """Every rank's ``buf`` (``n`` elements) becomes the elementwise ``op`` over all ranks."""
    b = _builder(sched, ranks, buf, n, elem_bytes, dtype, op, tag, deps, "allreduce")
    algo = _resolve(algo, ranks, hosts)
    if algo != "hierarchical":
        _ALLREDUCE[algo](b, ranks)
        return b.front
    groups = _groups(ranks, hosts)
    leaders = [g[0] for g in groups]
    reduce_fn, bcast_fn = _ROOTED[INTRA_NODE]
    for g in groups:
        reduce_fn(b, g, g[0])
    _ALLREDUCE[INTER_NODE](b, leaders)
    for g in groups:
        bcast_fn(b, g, g[0])
    return b.front


def reduce(sched: Schedule, ranks: Sequence[int], hosts: Sequence[int], buf: str, n: int, *, root: int, op: str,
           algo: str, elem_bytes: int, dtype: str, tag: str, deps: Mapping[int, Iterable[int]]) -> Frontier:
    """``root``'s ``buf`` becomes the elementwise ``op`` over all ranks (others' buffers are scratch)."""
    b = _builder(sched, ranks, buf, n, elem_bytes, dtype, op, tag, deps, "reduce", root)
    _rooted(b, ranks, hosts, root, algo, 0)
    return b.front


def _rooted(b: CollBuilder, ranks: Sequence[int], hosts: Sequence[int], root: int, algo: str, which: int) -> None:
    """Reduce (``which=0``: inside nodes, then across leaders) or broadcast (1: the other way round)."""
    algo = _resolve(algo, ranks, hosts)
    if algo != "hierarchical":
        _ROOTED[algo][which](b, ranks, root)
        return
    groups = _groups(ranks, hosts)
    leaders = [root if root in g else g[0] for g in groups]
    phases = [lambda: [_ROOTED[INTRA_NODE][which](b, g, lead) for g, lead in zip(groups, leaders, strict=True)],
              lambda: _ROOTED[INTER_NODE][which](b, leaders, root)]
    for phase in phases if which == 0 else phases[::-1]:
        phase()


def broadcast(sched: Schedule, ranks: Sequence[int], hosts: Sequence[int], buf: str, n: int, *, root: int,
              algo: str, elem_bytes: int, dtype: str, tag: str, deps: Mapping[int, Iterable[int]]) -> Frontier:
    """Every rank's ``buf`` becomes ``root``'s."""
    b = _builder(sched, ranks, buf, n, elem_bytes, dtype, "sum", tag, deps, "broadcast", root)
    _rooted(b, ranks, hosts, root, algo, 1)
    return b.front
