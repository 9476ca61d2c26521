"""Which GPU holds which (TP, CP, PP, DP) coordinates (docs/training.md, Placement).

The training step's code numbers GPUs in one canonical order, fastest-varying first TP, then CP, then PP, then DP:
canonical index ``t + tp (c + cp (s + pp d))``. A workload's ``placement`` names the order in which the
coordinates vary over the cluster's own GPU order (server by server), as Megatron-LM's ``--order`` does; the
default, ``tp-cp-pp-dp``, is the canonical order itself. :func:`placed` gives the cluster with its ranks listed in
canonical order, so that every piece of the step (TP groups, CP groups, stage-to-stage sends, DP groups) lands on
the GPUs the placement names and nothing else in the step needs to know about it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from simulator.cluster.memo import cluster_memo
from simulator.cluster.topology import Cluster
from simulator.workloads.train import DIMENSIONS

__all__ = ["CANONICAL", "placed", "placed_order", "placement_label"]

CANONICAL = DIMENSIONS  # the order the step's code counts in


def placement_label(order: Sequence[str]) -> str:
    """``tp-cp-pp-dp``: the order as the rows and Megatron-LM's ``--order`` write it."""
    return "-".join(order)


def placed_order(sizes: Mapping[str, int], order: Sequence[str]) -> list[int]:
    """The cluster GPU index of each canonical index: ``result[i]`` is the GPU, in the cluster's order, of the
    coordinates that canonical index ``i`` stands for when the coordinates vary in ``order`` (fastest first)."""
    total = 1
    for dim in CANONICAL:
        total *= sizes[dim]
    stride, s = {}, 1
    for dim in order:
        stride[dim] = s
        s *= sizes[dim]
    result = []
    for i in range(total):
        rest, gpu = i, 0
        for dim in CANONICAL:
            rest, coord = divmod(rest, sizes[dim])
            gpu += coord * stride[dim]
        result.append(gpu)
    return result


def placed(cluster: Cluster, sizes: Mapping[str, int], order: Sequence[str]) -> Cluster:
    """``cluster`` with its ranks in canonical order for ``order`` (the cluster itself for the canonical order);
    the graph, devices and routes are shared (one per cluster, sizes and order)."""
    if tuple(order) == CANONICAL:
        return cluster
    memo = cluster_memo(cluster, "training.placed")
    key = (tuple(sizes[d] for d in CANONICAL), tuple(order))
    if key not in memo:
        ranks = tuple(cluster.ranks[g] for g in placed_order(sizes, order))
        view = dataclasses.replace(cluster, ranks=ranks)
        object.__setattr__(view, "_router", cluster._router)  # routes are by node name: share what was routed
        object.__setattr__(view, "_latency", cluster._latency)
        memo[key] = view
    result: Cluster = memo[key]
    return result
