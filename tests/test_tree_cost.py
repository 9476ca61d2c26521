"""The tuner's tree price over arrays (collectives/tree_cost.py) is the per-rank form, bit for bit."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cluster.devices import compute_time
from simulator.cluster.memo import cluster_memo
from simulator.cluster.topology import Cluster, load_topology
from simulator.collectives import fabric_of, tree_cost
from simulator.collectives.base import chunk_bounds
from simulator.collectives.caps import fabric_cap
from simulator.collectives.channels import Choice
from simulator.collectives.fabric import Fabric
from simulator.collectives.nccl_tree import (
    Tree,
    channel_trees,
    pipeline_time,
    pipeline_time_arrays,
    tree_chunks,
    tree_step,
)
from simulator.collectives.protocols import PROTOCOLS, base_latency, forward_grain, hop_latency, wire_factor
from simulator.collectives.tuner import predict


@st.composite
def trees(draw: st.DrawFn) -> tuple[Tree, dict[int, tuple[float, float]], dict[int, tuple[float, float]],
                                    dict[int, float], list[int]]:
    """A random tree over shuffled rank labels, random stages (the first step's fixed seconds, a step's; some
    reductions none) and chunks of random step counts."""
    n = draw(st.integers(2, 40))
    labels = draw(st.permutations(range(100, 100 + n)))
    parent = {labels[i]: labels[draw(st.integers(0, i - 1))] for i in range(1, n)}
    tree = Tree.of(labels[0], parent)
    secs = st.floats(0.0, 1e-3, allow_subnormal=False)
    stage = st.tuples(secs, secs)
    up = {r: draw(stage) for r in parent}
    down = {r: draw(stage) for r in parent}
    reduce = {r: draw(st.sampled_from([0.0, 1e-6, draw(secs)])) for r, kids in tree.children.items() if kids}
    return tree, up, down, reduce, draw(st.lists(st.integers(1, 70), min_size=1, max_size=8))


@settings(max_examples=200, deadline=None)
@given(trees(), st.one_of(st.none(), st.integers(1, 80)), st.randoms(use_true_random=False))
def test_pipeline_over_arrays_is_the_per_rank_recursion(case, held, rng) -> None:
    """Bit for bit, with connections that hold back no step or ``held`` steps (a network connection of a
    cut-through protocol, some of the tree's at random)."""
    tree, up, down, reduce, chunks = case
    heads = None if held is None else {r: held if rng.random() < 0.5 else 1 for r in tree.parent}
    order = list(tree.order)
    pos = {r: i for i, r in enumerate(order)}
    parent = np.array([-1] + [pos[tree.parent[r]] for r in order[1:]])
    depth = [0] * len(order)
    for i in range(1, len(order)):
        depth[i] = depth[parent[i]] + 1
    levels = [np.flatnonzero(np.array(depth) == d) for d in range(max(depth) + 1)]

    def columns(stages: dict[int, tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
        a, b = (np.array([0.0] + [stages[r][j] for r in order[1:]]) for j in range(2))
        return a, b

    kids = np.array([bool(tree.children[r]) for r in order])
    head_array = None if heads is None else np.array([1] + [heads[r] for r in order[1:]])
    arrays = pipeline_time_arrays(parent, levels, chunks, columns(up), columns(down),
                                  np.array([reduce.get(r, 0.0) for r in order]), kids, head_array)
    assert arrays == pipeline_time(tree, chunks, up, down, reduce, heads)


def reference_tree(cluster: Cluster, fabric: Fabric, ranks: list[int], n: int, choice: Choice, elem_bytes: int,
                   dtype: str) -> float:
    """The tuner's tree price written out per connection and rank, with dictionaries (its form before arrays)."""
    c, family = choice.channels, "tree"
    nodes = cluster.ranks
    rings = fabric.rings(ranks, c)
    shape = [channel_trees(fabric, rings[k], k) for k in range(c)]
    ids: dict[tuple[str, str], int] = {}
    links = {}
    for ts in shape:
        for t in ts:
            for r, q in t.parent.items():
                for a, b in ((r, q), (q, r)):
                    links[(a, b)] = [ids.setdefault(e, len(ids)) for e in cluster.route(nodes[a], nodes[b])]
    capacity = [float(cluster.graph.edges[e]["bandwidth"]) for e in ids]
    free = {hop: min(capacity[i] for i in ids_) for hop, ids_ in links.items()}
    reductions: dict[int, int] = {}
    for ts in shape:
        for t in ts:
            for q in t.parent.values():
                reductions[q] = reductions.get(q, 0) + 1
    wire = wire_factor(family, choice.protocol)
    cap = fabric_cap(fabric, "allreduce", family, choice.protocol, ranks, c) * wire
    spec = cluster.specs[nodes[ranks[0]]]
    step = tree_step(n * elem_bytes, c, choice.protocol, len({fabric.hosts[r] for r in ranks}), len(ranks))

    def stage(a: int, b: int, nbytes: float, rate: float) -> tuple[float, float]:
        fixed = cluster.message_overhead_s + cluster.route_latency(cluster.route(nodes[a], nodes[b]))
        return max(fixed, hop_latency(family, choice.protocol, fabric.hw(a, b), cluster.nccl_latency)), nbytes / rate

    load = [0.0] * len(capacity)
    busy, fills = 0.0, []
    for k, (lo, hi) in enumerate(chunk_bounds(n, c)):
        tcap = cap / (2 * len(shape[k]))
        for tree, (a, z) in zip(shape[k], chunk_bounds(hi - lo, len(shape[k])), strict=True):
            chunks, count, head = tree_chunks((z - a) * elem_bytes, step, len(shape[k]),  # priced step by step
                                              forward_grain(choice.protocol))
            heads = {r: head if fabric.hw(r, q) == "net" else 1 for r, q in tree.parent.items()}
            per_chunk = [len(range(i, chunks, count)) for i in range(count)]  # each chunk's steps: S/K, +1 first
            elems = (z - a) / chunks
            size = elems * elem_bytes * wire
            one = compute_time(spec, elems, 3 * elems * elem_bytes, dtype, launch=False, fn="reduce-sum")
            up, down = {}, {}
            for r, q in tree.parent.items():
                for link in (*links[(r, q)], *links[(q, r)]):
                    load[link] += chunks * size
                up[r] = stage(r, q, size, min(free[(r, q)], tcap))
                down[r] = stage(q, r, size, min(free[(q, r)], tcap))
            if z == a:
                continue
            busy = max(busy, chunks * size / tcap, chunks * one * max(reductions.values()))
            reduce = {r: one * len(kids) for r, kids in tree.children.items() if kids}
            alone = pipeline_time(tree, per_chunk, up, down, reduce, heads if head > 1 else None)
            slowest = max(*(d for _, d in up.values()), *(d for _, d in down.values()), *reduce.values())
            fills.append((alone, alone - chunks * slowest))
    bound = max(busy, *(x / c_ for x, c_ in zip(load, capacity, strict=True)))
    return max(max(alone, bound + fill) for alone, fill in fills)


@functools.cache
def dgx(nodes: int) -> Cluster:
    return load_topology("dgx-h100", {"nodes": nodes})


@pytest.mark.parametrize("per_level", [0, 10**9], ids=["arrays", "lists"])  # every tree priced per level / rank
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nodes=st.integers(1, 5), data=st.data(), n=st.integers(1, 3 * 10**8), protocol=st.sampled_from(PROTOCOLS),
       channels=st.integers(1, 9), elem=st.sampled_from([(2, "bf16"), (4, "fp32")]))
def test_predicted_tree_time_is_the_per_rank_reference(monkeypatch, per_level, nodes, data, n, protocol, channels,
                                                       elem) -> None:
    monkeypatch.setattr(tree_cost, "_SMALL_PER_LEVEL", per_level)
    cluster = dgx(nodes)
    cluster_memo(cluster, "predict").clear()  # predictions are kept: price anew
    fabric = fabric_of(cluster)
    p = len(cluster.ranks)
    ranks = data.draw(st.lists(st.integers(0, p - 1), min_size=2, max_size=p, unique=True))
    choice = Choice("tree", protocol, channels)
    elem_bytes, dtype = elem
    got = predict("allreduce", ranks, n, choice, fabric, elem_bytes=elem_bytes, dtype=dtype)
    launch = max(cluster.collective_start_s, base_latency("tree", protocol, cluster.nccl_latency))
    want = launch + reference_tree(cluster, fabric, ranks, n, choice, elem_bytes, dtype)
    assert got == want and math.isfinite(got)
