"""Deterministic routes: shortest by total latency, then fewest hops, ECMP ties broken by a stable hash.

Distances to a destination come from scipy's compiled Dijkstra on the reversed graph, with a weight of
``latency + HOP_EPSILON`` per link so that, among paths of equal latency, the one with fewer hops is shorter. The
route then walks from the source, at each node choosing among the successors that lie on a shortest path; when
there are several, a hash (BLAKE2b of ``src|dst|hop``) picks one, so that different pairs spread over equal-cost
paths as ECMP does while the same pair always takes the same path, in every run and process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import networkx as nx
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

__all__ = ["HOP_EPSILON", "Router"]

Edge = tuple[str, str]
HOP_EPSILON = 1e-15  # seconds added per hop: breaks latency ties in favour of fewer hops
_BATCH = 128  # destinations per compiled Dijkstra call (memory: batch x nodes floats)
_VECTOR_DEGREE = 32  # scan successors with numpy above this out-degree


def _stable_hash(key: str) -> int:
    """A hash that is the same in every process and run (unlike ``hash``), with well-mixed low bits."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


class Router:
    """Route cache over a directed graph whose edges carry ``latency`` (seconds)."""

    def __init__(self, graph: nx.DiGraph) -> None:
        self._names = list(graph.nodes)
        self._index = {n: i for i, n in enumerate(self._names)}
        self._succ: list[list[tuple[int, float]]] = [[] for _ in self._names]
        rows, cols, weights = [], [], []
        for u, v, lat in graph.edges(data="latency"):
            iu, iv = self._index[u], self._index[v]
            self._succ[iu].append((iv, lat + HOP_EPSILON))
            rows.append(iv)  # reversed graph: distances *to* a destination
            cols.append(iu)
            weights.append(lat + HOP_EPSILON)
        n = len(self._names)
        self._reversed = csr_matrix((weights, (rows, cols)), shape=(n, n))
        for succ in self._succ:
            succ.sort(key=lambda e: self._names[e[0]])
        self._succ_np = [(np.array([v for v, _ in s], dtype=np.int64), np.array([w for _, w in s]))
                         if len(s) > _VECTOR_DEGREE else None for s in self._succ]
        self._weight = [dict(s) for s in self._succ]
        self._routes: dict[tuple[str, str], tuple[Edge, ...]] = {}

    def _two_hop_bound(self, s: int, d: int) -> float:
        """Latency of the best path of at most two links from s to d (inf if none): a bound on the distance."""
        best = self._weight[s].get(d, np.inf)
        for x, w in self._succ[s]:
            w2 = self._weight[x].get(d)
            if w2 is not None and w + w2 < best:
                best = w + w2
        return best

    def prepare(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Compute the routes of many (src, dst) pairs at once (batched by destination).

        Pairs joined by a path of at most two links (GPUs on one switch) only need the graph within that
        distance of the destination, so their search is bounded by it; the others search the whole graph.
        """
        todo: dict[str, list[str]] = {}
        limit: dict[str, float] = {}
        for src, dst in pairs:
            if src != dst and (src, dst) not in self._routes:
                todo.setdefault(dst, []).append(src)
                bound = self._two_hop_bound(self._index[src], self._index[dst]) * (1 + 1e-9)
                limit[dst] = max(limit.get(dst, 0.0), bound)
        dsts = sorted(todo, key=lambda d: limit[d])
        for start in range(0, len(dsts), _BATCH):
            batch = dsts[start:start + _BATCH]
            dist = dijkstra(self._reversed, directed=True, indices=[self._index[d] for d in batch],
                            limit=limit[batch[-1]])
            for row, dst in zip(dist, batch, strict=True):
                for src in todo[dst]:
                    self._routes[(src, dst)] = self._walk(src, dst, row)

    def _walk(self, src: str, dst: str, dist: np.ndarray) -> tuple[Edge, ...]:
        cur, goal = self._index[src], self._index[dst]
        if not np.isfinite(dist[cur]):
            raise KeyError(f"no route from {src} to {dst}")
        edges: list[Edge] = []
        while cur != goal:
            here = dist[cur]
            tol = 1e-12 * here
            vec = self._succ_np[cur]
            if vec is None:
                nxt = [v for v, w in self._succ[cur] if abs(dist[v] + w - here) <= tol and dist[v] < here]
            else:
                idx, w = vec
                dv = dist[idx]
                nxt = idx[(np.abs(dv + w - here) <= tol) & (dv < here)].tolist()
            pick = nxt[_stable_hash(f"{src}|{dst}|{self._names[cur]}") % len(nxt)] if len(nxt) > 1 else nxt[0]
            edges.append((self._names[cur], self._names[pick]))
            cur = pick
        return tuple(edges)

    def route(self, src: str, dst: str) -> tuple[Edge, ...]:
        """Directed edges from ``src`` to ``dst``; empty when ``src == dst``. Raises KeyError if unreachable."""
        if src == dst:
            return ()
        hit = self._routes.get((src, dst))
        if hit is None:
            self.prepare([(src, dst)])
            hit = self._routes[(src, dst)]
        return hit
