"""A cluster's rank-to-rank connections as rows of arrays, for the tuner's closed forms over thousands of them.

The tuner prices a collective from its connections' routes: a message's fixed seconds (message overhead plus the
route's latency), the narrowest link of a route, and which links the connections of every channel share. Per
cluster, a :class:`HopTable` keeps each connection it was asked for as a row: its route's link ids (CSR), its wire
seconds and its narrowest link's bytes/s, computed once (the routes of a batch in one
:meth:`~simulator.cluster.topology.Cluster.paths`, as link ids) and then read as arrays: a tree of 16,384 ranks or the
rings of 8 channels are a few array operations, not a Python call per connection. Every number is the same IEEE
operation as the per-connection form it replaces (the same sums, minima and quotients of the same operands).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import numpy as np

from simulator.cluster.links import link_table
from simulator.cluster.memo import cluster_memo
from simulator.cluster.topology import Cluster
from simulator.schedule.colpass import spans

__all__ = ["HopTable", "hop_table"]


class HopTable:
    """Rows of rank-to-rank connections on one cluster (:func:`hop_table`: one per cluster). Ask for the rows of
    the connections first (:meth:`rows`: it adds the new ones), then read their arrays."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = weakref.ref(cluster)  # the table lives in the cluster's memo: it must not keep the cluster
        self._n = len(cluster.ranks)
        self._keys = np.zeros(0, dtype=np.int64)  # a * ranks + b of every row, sorted
        self._key_rows = np.zeros(0, dtype=np.int64)  # ... and their rows
        self.wire = np.zeros(0)  # a message's fixed seconds per row: message overhead plus its route's latency
        self.free = np.zeros(0)  # bytes/s per row alone: its route's narrowest link (inf: none)
        self.capacity = np.zeros(0)  # bytes/s per link id (the ids links() gives: the cluster's link ids)
        self._starts = np.zeros(1, dtype=np.int64)  # rows' link ids as CSR
        self._flat = np.zeros(0, dtype=np.int64)

    def rows(self, a: np.ndarray | Sequence[int], b: np.ndarray | Sequence[int]) -> np.ndarray:
        """The row of each connection from rank ``a[k]`` to rank ``b[k]`` (GPUs), routing the new ones in one
        batch."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        if len(a) and (min(a.min(), b.min()) < 0 or max(a.max(), b.max()) >= self._n):
            raise ValueError(f"a connection between ranks beyond the cluster's {self._n} GPUs")
        keys = a * self._n + b
        at = np.searchsorted(self._keys, keys)
        found = at < len(self._keys)
        found[found] = self._keys[at[found]] == keys[found]
        if not found.all():
            self._add(np.unique(keys[~found]))
            at = np.searchsorted(self._keys, keys)
        return self._key_rows[at]

    def rows_of(self, pairs: Sequence[tuple[int, int]]) -> np.ndarray:
        """:meth:`rows` of (rank a, rank b) pairs."""
        both = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        return self.rows(both[:, 0], both[:, 1])

    def _add(self, keys: np.ndarray) -> None:
        cl = self._cluster()
        assert cl is not None, "a hop table outlived its cluster"
        nodes = cl.ranks
        pairs = [(nodes[a], nodes[b]) for a, b in zip((keys // self._n).tolist(), (keys % self._n).tolist(),
                                                      strict=True)]
        starts, ids, latency = cl.paths(pairs)
        if not len(self.capacity):
            self.capacity = link_table(cl).capacity_array
        counts = np.diff(starts)
        free = np.full(len(pairs), math.inf)  # a route's narrowest link (none: inf)
        some = counts > 0
        if some.any():
            free[some] = np.minimum.reduceat(self.capacity[ids], starts[:-1][some])
        first = len(self.wire)
        self.wire = np.concatenate([self.wire, cl.message_overhead_s + latency])
        self.free = np.concatenate([self.free, free])
        self._starts = np.concatenate([self._starts, self._starts[-1] + starts[1:]])
        self._flat = np.concatenate([self._flat, ids])
        keys = np.concatenate([self._keys, keys])
        rows = np.concatenate([self._key_rows, first + np.arange(len(pairs))])
        order = np.argsort(keys, kind="stable")
        self._keys, self._key_rows = keys[order], rows[order]

    def links(self, rows: np.ndarray) -> np.ndarray:
        """The link ids of ``rows``' routes, row after row, each route's in its order."""
        starts = self._starts
        return self._flat[spans(starts[rows], starts[rows + 1] - starts[rows])]

    def shared(self, paths: Sequence[np.ndarray]) -> float:
        """Bottleneck bytes/s one path (rows) gets when all ``paths`` run at once: over every link any of them
        crosses, its bandwidth over the number of paths that cross it (a path counts once)."""
        if not paths:
            return math.inf
        rows = np.concatenate(paths)
        path = np.repeat(np.arange(len(paths)), [len(p) for p in paths])
        per_row = self._starts[rows + 1] - self._starts[rows]
        ids = self.links(rows)
        n_links = len(self.capacity)
        crossed = np.unique(np.repeat(path, per_row) * n_links + ids) % n_links  # each (path, link) once
        uses = np.bincount(crossed, minlength=n_links)
        used = uses > 0
        return float((self.capacity[used] / uses[used]).min()) if used.any() else math.inf


def hop_table(cluster: Cluster) -> HopTable:
    """The cluster's :class:`HopTable` (one, kept as long as the cluster)."""
    memo = cluster_memo(cluster, "hop table")
    table = memo.get(None)
    if table is None:
        table = memo[None] = HopTable(cluster)
    return table
