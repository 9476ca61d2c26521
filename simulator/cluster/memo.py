"""Memos that live as long as their cluster: what the collective tuner works out once per cluster (routes' wires,
rings' bandwidths, trees' shapes, predictions) is dropped with the cluster, not kept for the process's life (a
sweep or a fit builds a new cluster per point or parameter vector: module caches keyed by ``id(cluster)`` that
held the cluster, so that no other could reuse its id, grew by about 1.8 MB per 128-GPU cluster)."""

from __future__ import annotations

import weakref
from typing import Any

from simulator.cluster.topology import Cluster

__all__ = ["cluster_memo", "live_memos"]

_MEMOS: dict[int, dict[str, dict[Any, Any]]] = {}


def cluster_memo(cluster: Cluster, name: str) -> dict[Any, Any]:
    """The memo called ``name`` of ``cluster`` (empty at first); it goes when the cluster is garbage."""
    key = id(cluster)
    memos = _MEMOS.get(key)
    if memos is None:
        memos = _MEMOS[key] = {}
        weakref.finalize(cluster, _MEMOS.pop, key, None)
    memo = memos.get(name)
    if memo is None:
        memo = memos[name] = {}
    return memo


def live_memos() -> int:
    """How many clusters have memos now (for tests)."""
    return len(_MEMOS)
