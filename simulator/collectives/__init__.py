"""Collectives by name: allreduce, reduce and broadcast decompositions into sends, receives and reductions.

Names (docs/architecture.md): ``ring``, ``double-binary-tree``, ``recursive-doubling``, ``hierarchical``
(inside each node, then across node leaders, then inside again) and ``auto`` (NCCL's choice for these small
messages: ring inside one node, a tree across nodes, i.e. ``hierarchical``). Reduce and broadcast have no
double-tree or doubling form of their own: those names give the binomial tree (ceil(log2 P) rounds).

Each function appends ops to a schedule and returns the frontier: for every rank, the op ids after which the
buffer holds the result.

Given a ``fabric`` (:func:`simulator.collectives.fabric.fabric_of` a cluster), a collective runs as NCCL runs it
(:mod:`simulator.collectives.channels`): over channels, with a protocol, ``auto`` choosing algorithm and protocol by
the lowest predicted time (:mod:`simulator.collectives.tuner`); ``double-binary-tree`` then names NCCL's tree. Without
one, the decompositions above run as one channel with no protocol costs (the model before channels).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from simulator.collectives import channels as _channels
from simulator.collectives import tuner as _tuner
from simulator.collectives.base import REDUCE_OPS, CollBuilder, chunk_bounds
from simulator.collectives.channels import OPERATIONS, Choice
from simulator.collectives.fabric import Fabric, fabric_of
from simulator.collectives.ring import ring_allreduce, ring_broadcast, ring_reduce
from simulator.collectives.trees import (
    binomial_broadcast,
    binomial_reduce,
    double_binary_tree_allreduce,
    recursive_doubling_allreduce,
)
from simulator.errors import InputError
from simulator.schedule.core import Schedule

__all__ = ["ALGORITHMS", "COLLECTIVE_ALGORITHMS", "OPERATIONS", "REDUCE_OPS", "Choice", "Fabric", "Frontier",
           "allreduce", "broadcast", "choose_for", "chunk_bounds", "collective", "fabric_of", "operation_algorithm",
           "reduce"]

ALGORITHMS = ("ring", "double-binary-tree", "recursive-doubling", "hierarchical", "auto")
COLLECTIVE_ALGORITHMS = ("auto", "ring", "tree", "nvls", "hierarchical", "double-binary-tree", "recursive-doubling",
                         "pairwise")  # what a collective workload's ``algorithms:`` may name
_FABRIC_NAMES = {"double-binary-tree": "tree"}
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


def collective(sched: Schedule, operation: str, ranks: Sequence[int], buf: str, n: int, fabric: Fabric, *,
               algo: str = "auto", protocol: str = "auto", channels: int | None = None, op: str = "sum",
               root: int | None = None, elem_bytes: int, dtype: str, tag: str, deps: Mapping[int, Iterable[int]],
               switch_rank: int | None = None) -> tuple[Frontier, Choice]:
    """Any operation of :data:`OPERATIONS` as NCCL runs it on ``fabric``; returns the frontier and the choice made.

    ``algo`` / ``protocol``: a name or ``auto``; ``channels``: None for the fabric's count. ``switch_rank``: a rank
    placed on the server's NVSwitch, needed for ``nvls``.
    """
    if operation in ("broadcast", "reduce") and root is None:
        root = ranks[0]
    choice = choose_for(operation, ranks, n, fabric, algo=algo, protocol=protocol, channels=channels,
                        elem_bytes=elem_bytes, dtype=dtype, root=root, switch=switch_rank is not None)
    front = _channels.build(sched, operation, ranks, buf, n, choice, fabric, elem_bytes=elem_bytes, dtype=dtype,
                            tag=tag, deps=deps, op=op, root=root, switch_rank=switch_rank)
    return front, choice


def choose_for(operation: str, ranks: Sequence[int], n: int, fabric: Fabric, *, algo: str, protocol: str,
               channels: int | None, elem_bytes: int, dtype: str, root: int | None, switch: bool) -> Choice:
    """The choice :func:`collective` runs ``operation`` with (``algo`` a user's name, ``root`` already set for
    broadcast and reduce): what the size limits read before anything is built."""
    return _tuner.choose(operation, ranks, n, fabric, algo=operation_algorithm(operation, algo), protocol=protocol,
                         channels=channels, elem_bytes=elem_bytes, dtype=dtype, root=root, switch=switch)


def operation_algorithm(operation: str, algo: str) -> str:
    """The algorithm ``algo`` (a name of :data:`COLLECTIVE_ALGORITHMS`) names for ``operation``, or InputError."""
    algo = _FABRIC_NAMES.get(algo, algo)
    if operation == "alltoall" and algo in ("auto", "ring"):
        algo = "pairwise"
    if algo != "auto" and algo not in _channels.SUPPORTED[operation]:
        raise InputError(f"{operation} has no algorithm {algo!r}; valid: auto, "
                         f"{', '.join(_channels.SUPPORTED[operation])}")
    return algo


def allreduce(sched: Schedule, ranks: Sequence[int], hosts: Sequence[int], buf: str, n: int, *, op: str,
              algo: str, elem_bytes: int, dtype: str, tag: str, deps: Mapping[int, Iterable[int]],
              fabric: Fabric | None = None) -> Frontier:
    """Every rank's ``buf`` (``n`` elements) becomes the elementwise ``op`` over all ranks."""
    if fabric is not None:
        check_algorithm(algo)
        return collective(sched, "allreduce", ranks, buf, n, fabric, algo=algo, op=op, elem_bytes=elem_bytes,
                          dtype=dtype, tag=tag, deps=deps)[0]
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
