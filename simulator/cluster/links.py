"""A cluster's links by id, read off its graph once: the ids are the graph's edge order, the ids
:meth:`simulator.cluster.topology.Cluster.paths` gives routes in (the engine's link columns and the collective
tuner's connection rows both index by them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.cluster.memo import cluster_memo
from simulator.cluster.size_curve import SizeCurve
from simulator.cluster.topology import Cluster

__all__ = ["LinkTable", "link_table"]


@dataclass(frozen=True)
class LinkTable:
    """Each link's name (its two nodes), bytes/s, latency, and bandwidth by message size where it was measured."""

    names: list[tuple[str, str]]
    capacity: list[float]
    latency: list[float]
    curves: dict[int, tuple[float, SizeCurve]]  # link id -> (nominal bytes/s, bandwidth by message size)

    @property
    def capacity_array(self) -> np.ndarray:
        return np.array(self.capacity, dtype=float)


def link_table(cluster: Cluster) -> LinkTable:
    """The cluster's :class:`LinkTable` (one, kept as long as the cluster)."""
    memo = cluster_memo(cluster, "link table")
    hit = memo.get(None)
    if hit is None:
        names: list[tuple[str, str]] = []
        capacity: list[float] = []
        latency: list[float] = []
        curves: dict[int, tuple[float, SizeCurve]] = {}
        for u, out in cluster.graph.adjacency():  # graph.edges' order, without its view's per-edge cost
            for v, data in out.items():
                if data.get("by_size") is not None:
                    curves[len(names)] = (data["bandwidth"], data["by_size"])
                names.append((u, v))
                capacity.append(data["bandwidth"])
                latency.append(data["latency"])
        hit = memo[None] = LinkTable(names, capacity, latency, curves)
    return hit
