"""The tuner's price of NCCL's tree (:mod:`.nccl_tree`) on a cluster, over arrays.

What does not depend on the protocol or the message is prepared once per (cluster, ranks, channels) and kept
(:func:`tree_shape`): every channel's trees as arrays over their ranks in top-down order (each rank's parent
position, its depth level, its children count), every connection's fixed seconds (message overhead plus route
latency), whether it crosses servers, its rate alone (its route's narrowest link) and its route's links. A
candidate (protocol, cap, message) then costs a few array operations per tree level and chunk (:func:`tree_time`):
the stages' seconds for all connections at once, :func:`.nccl_tree.pipeline_time`'s recursion one level at a time.

Every number is the same IEEE operation as in the per-rank form (:func:`.nccl_tree.pipeline_time` with
dictionaries, ``tests/test_tree_cost.py`` compares them bit for bit): elementwise sums, products, quotients and
maxima of the same operands, and each link's load summed tree after tree (``numpy.add.at``: a tree adds the same
amount for each of its connections, so their order within it does not change the sum).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.cluster.memo import cluster_memo
from simulator.cluster.topology import Cluster
from simulator.collectives.base import chunk_bounds
from simulator.collectives.fabric import Fabric
from simulator.collectives.hops import HopTable, hop_table
from simulator.collectives.nccl_tree import Tree, channel_trees, pipeline_time_arrays, pipeline_time_lists, tree_chunks
from simulator.collectives.steps import step_counts

__all__ = ["TreeArrays", "TreeShape", "tree_arrays", "tree_shape", "tree_time"]

_SMALL_PER_LEVEL = 16  # ranks per level below which a tree is priced per rank (lists), not per level (arrays)


@dataclass(frozen=True)
class TreeArrays:
    """One tree, its ranks in top-down order (position 0: the root). Per position p > 0, the connection up is from
    ``order[p]`` to its parent ``order[parent[p]]``, the connection down the other way."""

    order: np.ndarray  # rank per position
    parent: np.ndarray  # parent's position (-1 for the root)
    levels: tuple[np.ndarray, ...]  # positions per depth, the root's level first
    kids: np.ndarray  # children per position
    net: np.ndarray  # the connection crosses servers (NCCL's ``net`` hop class)
    wire_up: np.ndarray  # fixed seconds of a message up (overhead and route latency), down
    wire_down: np.ndarray
    free_up: np.ndarray  # bytes/s of the connection up alone (its route's narrowest link), down
    free_down: np.ndarray
    links: np.ndarray  # link ids of every connection, top-down: its route up, then down (a tree's connections all
    # add the same load, so their order does not change a link's sum)
    lists: tuple[list[Any], ...] = ()  # the arrays from parent to free_down as lists (to price it per rank)


@dataclass(frozen=True)
class TreeShape:
    """Every channel's trees on a cluster, the links' capacities (by link id), the most reductions of one chunk
    round that a rank runs (all channels and trees)."""

    trees: list[list[TreeArrays]]
    capacity: np.ndarray
    reductions: int


def tree_arrays(tree: Tree, table: HopTable, hosts: np.ndarray) -> TreeArrays:
    """``tree`` as arrays, its connections' routes read off ``table`` (the cluster's); ``hosts``: each rank's
    server (a connection between two crosses servers)."""
    order = list(tree.order)
    pos = {r: i for i, r in enumerate(order)}
    parent = [-1] + [pos[tree.parent[r]] for r in order[1:]]
    depth = [0] * len(order)
    for i in range(1, len(order)):
        depth[i] = depth[parent[i]] + 1
    depths = np.array(depth, dtype=np.int64)
    levels = tuple(np.flatnonzero(depths == d) for d in range(max(depth) + 1))
    ranks, parents = np.array(order, dtype=np.int64), np.array(parent, dtype=np.int64)
    kid, par = ranks[1:], ranks[parents[1:]]
    up, down = table.rows(kid, par), table.rows(par, kid)
    wire, free = table.wire, table.free  # read after the rows: rows() may add some
    arrays = TreeArrays(
        order=ranks, parent=parents, levels=levels, kids=np.bincount(parents[1:], minlength=len(order)),
        net=np.concatenate([[False], hosts[kid] != hosts[par]]),
        wire_up=np.concatenate([[0.0], wire[up]]), wire_down=np.concatenate([[0.0], wire[down]]),
        free_up=np.concatenate([[math.inf], free[up]]), free_down=np.concatenate([[math.inf], free[down]]),
        links=table.links(np.stack([up, down], axis=1).reshape(-1)))
    return dataclasses.replace(arrays, lists=(
        arrays.parent.tolist(), arrays.kids.tolist(), arrays.net.tolist(), arrays.wire_up.tolist(),
        arrays.wire_down.tolist(), arrays.free_up.tolist(), arrays.free_down.tolist()))


def tree_shape(cluster: Cluster, fabric: Fabric, ranks: list[int], channels: int) -> TreeShape:
    """The trees of ``channels`` channels over ``ranks`` on ``cluster`` (kept per cluster, ranks and channels),
    their connections' routes from the cluster's :class:`~.hops.HopTable`."""
    memo = cluster_memo(cluster, "tree shapes")
    key = (tuple(ranks), channels)
    hit = memo.get(key)
    if hit is not None:
        return hit
    rings = fabric.rings(ranks, channels)
    trees = [channel_trees(fabric, rings[k], k) for k in range(channels)]
    table = hop_table(cluster)
    kids = np.concatenate([np.fromiter(t.parent, dtype=np.int64, count=len(t.parent)) for ts in trees for t in ts])
    pars = np.concatenate([np.fromiter(t.parent.values(), dtype=np.int64, count=len(t.parent))
                           for ts in trees for t in ts])
    table.rows(np.concatenate([kids, pars]), np.concatenate([pars, kids]))  # routed at once: a batch shares searches
    hosts = np.asarray(fabric.hosts, dtype=np.int64)
    arrays = [[tree_arrays(t, table, hosts) for t in ts] for ts in trees]
    reductions = np.bincount(np.concatenate([t.order[t.parent[1:]] for ts in arrays for t in ts]))
    shape = TreeShape(arrays, table.capacity, int(reductions.max()) if len(reductions) else 0)
    memo[key] = shape
    return shape


def tree_time(shape: TreeShape, n: int, elem_bytes: int, wire: float, cap: float, hop: tuple[float, float],
              reduce_s: Callable[[float], float], step: float, grain: float | None = None) -> float:
    """Seconds of the tree's pipelines on every channel (``_Predictor.tree``'s two forms, the slowest), launch not
    included: ``n`` elements of ``elem_bytes``, ``wire`` bytes on the wire per payload byte, ``cap`` a channel's
    bytes/s on the wire, ``hop`` the protocol's per-hop latency (inside a server, across servers),
    ``reduce_s(elems)`` the seconds of one reduction of ``elems`` elements, ``step`` the payload bytes of a
    pipeline step (:func:`.nccl_tree.tree_step`), ``grain`` the payload bytes a rank passes on at a time inside a
    server (:func:`.protocols.forward_grain`). A pipeline is priced step by step (its steps the grains with LL and
    LL128, a connection between servers holding one NCCL step in its first op of a chunk): its chunks' first,
    middle and last ops, the steps' pipeline exactly where stages run at their own pace (:mod:`.steps`)."""
    channels = len(shape.trees)
    load = np.zeros(len(shape.capacity))  # bytes every link carries
    busy = 0.0  # the longest a connection's cap or a rank's compute stream keeps it busy
    fills = []
    for k, (lo, hi) in enumerate(chunk_bounds(n, channels)):
        trees = shape.trees[k]
        tcap = cap / (2 * len(trees))  # each direction: half of a tree's share of the channel's threads
        for t, (a, z) in zip(trees, chunk_bounds(hi - lo, len(trees)), strict=True):
            if z == a:  # adds nothing to the links' load
                continue
            steps, chunks, head = tree_chunks((z - a) * elem_bytes, step, len(trees), grain)
            per_chunk = step_counts(steps, chunks)  # each chunk's steps, as the builder cuts them
            elems = (z - a) / steps
            size = elems * elem_bytes * wire
            one = reduce_s(elems)
            np.add.at(load, t.links, steps * size)
            busy = max(busy, steps * size / tcap, steps * one * shape.reductions)
            price = _small if len(t.order) < _SMALL_PER_LEVEL * len(t.levels) else _large
            alone, slowest = price(t, per_chunk, size, tcap, hop, one, head)
            fills.append((alone, alone - steps * slowest))
    bound = max(busy, float((load / shape.capacity).max()))
    return max(max(alone, bound + fill) for alone, fill in fills)


def _large(t: TreeArrays, chunks: list[int], size: float, cap: float, hop: tuple[float, float],
           one: float, head: int = 1) -> tuple[float, float]:
    """(the pipeline's time alone, its slowest stage's seconds a step), one array operation per level; ``chunks``:
    each chunk's steps, ``size`` a step's bytes on the wire, ``head`` the steps a network connection holds back."""
    latency = np.where(t.net, hop[1], hop[0])
    t_up = size / np.minimum(t.free_up, cap)
    t_down = size / np.minimum(t.free_down, cap)
    up = (np.maximum(t.wire_up, latency), t_up)
    down = (np.maximum(t.wire_down, latency), t_down)
    reduce = one * t.kids
    kids = t.kids > 0
    heads = None if head == 1 else np.where(t.net, head, 1)
    alone = pipeline_time_arrays(t.parent, t.levels, chunks, up, down, reduce, kids, heads)
    return alone, max(float(t_up[1:].max()), float(t_down[1:].max()), float(reduce[kids].max()))


def _small(t: TreeArrays, chunks: list[int], size: float, cap: float, hop: tuple[float, float],
           one: float, head: int = 1) -> tuple[float, float]:
    """:func:`_large` one rank at a time over lists (the same operations): cheaper where levels are few ranks
    wide (a server's chain, a small cluster), whose per-level array calls would cost more than the ranks."""
    parent, kids, net, wire_up, wire_down, free_up, free_down = t.lists
    n = len(parent)
    zero = (0.0, 0.0)
    up, down = [zero] * n, [zero] * n
    reduce = [one * c for c in kids]
    slowest = max(r for r, c in zip(reduce, kids, strict=True) if c)
    for p in range(1, n):
        latency = hop[1] if net[p] else hop[0]
        t_up = size / min(free_up[p], cap)
        t_down = size / min(free_down[p], cap)
        up[p] = (max(wire_up[p], latency), t_up)
        down[p] = (max(wire_down[p], latency), t_down)
        slowest = max(slowest, t_up, t_down)
    heads = None if head == 1 else [head if x else 1 for x in net]
    alone = pipeline_time_lists(parent, chunks, up, down, reduce, [c > 0 for c in kids], heads)
    return alone, slowest
