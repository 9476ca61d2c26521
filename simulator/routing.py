"""Deterministic routes: shortest by total latency, then fewest hops, ECMP ties broken by a stable hash.

The hash (BLAKE2b of ``src|dst|hop``) spreads different (src, dst) pairs over equal-cost paths the way ECMP
does, while the same pair always takes the same path in every run.
"""

from __future__ import annotations

import hashlib
import heapq
import math

import networkx as nx

__all__ = ["Router"]

Edge = tuple[str, str]


def _stable_hash(key: str) -> int:
    """A hash that is the same in every process and run (unlike ``hash``), with well-mixed low bits."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


class Router:
    """Route cache over a directed graph whose edges carry ``latency`` (seconds)."""

    def __init__(self, graph: nx.DiGraph) -> None:
        self._g = graph
        self._dist: dict[str, dict[str, tuple[float, int]]] = {}
        self._routes: dict[tuple[str, str], tuple[Edge, ...]] = {}

    def _distances_to(self, dst: str) -> dict[str, tuple[float, int]]:
        """(latency, hops) from every node to ``dst`` (Dijkstra on the reversed graph)."""
        dist = self._dist.get(dst)
        if dist is not None:
            return dist
        dist = {dst: (0.0, 0)}
        heap: list[tuple[float, int, str]] = [(0.0, 0, dst)]
        pred = self._g.pred
        while heap:
            lat, hops, v = heapq.heappop(heap)
            if dist[v] < (lat, hops):
                continue
            for u, attrs in pred[v].items():
                cand = (lat + attrs["latency"], hops + 1)
                if u not in dist or cand < dist[u]:
                    dist[u] = cand
                    heapq.heappush(heap, (cand[0], cand[1], u))
        self._dist[dst] = dist
        return dist

    def route(self, src: str, dst: str) -> tuple[Edge, ...]:
        """Directed edges from ``src`` to ``dst``; empty when ``src == dst``. Raises KeyError if unreachable."""
        key = (src, dst)
        hit = self._routes.get(key)
        if hit is not None:
            return hit
        dist = self._distances_to(dst)
        if src not in dist:
            raise KeyError(f"no route from {src} to {dst}")
        edges: list[Edge] = []
        cur = src
        while cur != dst:
            lat, hops = dist[cur]
            nxt = [v for v, a in self._g.succ[cur].items()
                   if v in dist and dist[v][1] == hops - 1
                   and math.isclose(dist[v][0] + a["latency"], lat, rel_tol=1e-12, abs_tol=1e-18)]
            nxt.sort()
            pick = nxt[_stable_hash(f"{src}|{dst}|{cur}") % len(nxt)] if len(nxt) > 1 else nxt[0]
            edges.append((cur, pick))
            cur = pick
        result = tuple(edges)
        self._routes[key] = result
        return result
