"""Deterministic routes: shortest by total latency, then fewest hops, ECMP ties broken by a stable hash.

Each link weighs ``latency + HOP_EPSILON`` so that, among paths of equal latency, the one with fewer hops is shorter.
The route walks from the source, at each node choosing among the successors that lie on a shortest path to the
destination; when there are several, a hash (BLAKE2b of ``src|dst|hop``) picks one, so that different pairs spread
over equal-cost paths as ECMP does while the same pair always takes the same path, in every run and process.

The walk needs distances *to* the destination, found in one of three ways, whichever applies first (they give the
same routes: ``tests/test_topology.py`` compares routes of the shipped topologies and of random graphs with those of
:meth:`Router.plain_route`, the whole-graph search):

* a pair joined by a path of at most two links (GPUs on one switch): a Dijkstra from the destination over the
  reversed graph bounded by that path's length (only the few nodes within it);
* a destination in a *group* (the nodes named ``host.*``: a server's GPUs, NICs and switch) entered from few other
  nodes: a path into the group enters it for the last time over an entry link ``x -> y`` and then stays inside,
  so ``d(v, dst) = min(d_group(v, dst), min over entries of d(v, x) + w(x, y) + d_group(y, dst))``: distances to
  the entry nodes ``x`` (the fabric switches, a handful shared by every server) are computed once per router, and
  a destination costs a Dijkstra inside its group;
* otherwise scipy's compiled Dijkstra from the destination over the whole reversed graph, batched.

The first two are kept per destination (within a budget of nodes), with the successors the walks found on shortest
paths to it: a tuner that routes a ring's hops, then its trees', then the engine its transfers, asks for the same
destinations from other sources, batch after batch.
"""

from __future__ import annotations

import hashlib
import heapq
import operator
from collections.abc import Callable, Iterable

import networkx as nx
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

__all__ = ["HOP_EPSILON", "Router"]

Edge = tuple[str, str]
HOP_EPSILON = 1e-15  # seconds added per hop: breaks latency ties in favour of fewer hops
_BATCH = 128  # destinations per compiled Dijkstra call (memory: batch x nodes floats)
_VECTOR_DEGREE = 32  # scan successors with numpy above this out-degree
_GROUP_MAX = 512  # a group larger than this is searched as a whole graph
_ENTRY_SOURCES_MAX = 64  # a group entered from more distinct nodes than this is searched as a whole graph
_NEAR_MAX = 1 << 20  # nodes of bounded searches kept for later batches (see Router._near_dist)
_ROW_FLOATS_MAX = 1 << 23  # distances to entry nodes kept per router (64 MiB), and as much again in blocks

Dist = tuple[Callable[[int], float], Callable[[np.ndarray], np.ndarray]]  # distance of one node, of many


def _stable_hash(key: str) -> int:
    """A hash that is the same in every process and run (unlike ``hash``), with well-mixed low bits."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def _array_dist(row: np.ndarray) -> Dist:
    return (lambda v: float(row[v])), (lambda idx: row[idx])


class Router:
    """Route cache over a directed graph whose edges carry ``latency`` (seconds)."""

    def __init__(self, graph: nx.DiGraph) -> None:
        self._names = list(graph.nodes)
        self._index = {n: i for i, n in enumerate(self._names)}
        n = len(self._names)
        self._succ: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        self._pred: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        rows, cols, weights = [], [], []
        for u, v, lat in graph.edges(data="latency"):
            iu, iv = self._index[u], self._index[v]
            self._succ[iu].append((iv, lat + HOP_EPSILON))
            self._pred[iv].append((iu, lat + HOP_EPSILON))
            rows.append(iv)  # reversed graph: distances *to* a destination
            cols.append(iu)
            weights.append(lat + HOP_EPSILON)
        self._reversed = csr_matrix((weights, (rows, cols)), shape=(n, n))
        for succ in self._succ:
            succ.sort(key=lambda e: self._names[e[0]])
        self._succ_np = [(np.array([v for v, _ in s], dtype=np.int64), np.array([w for _, w in s]))
                         if len(s) > _VECTOR_DEGREE else None for s in self._succ]
        self._weight = [dict(s) for s in self._succ]
        group_of: dict[str, int] = {}
        self._group = [group_of.setdefault(name.split(".", 1)[0], len(group_of)) if "." in name else -1
                       for name in self._names]
        self._group_np = np.array(self._group, dtype=np.int64)
        self._members: list[list[int]] = [[] for _ in group_of]
        for i, g in enumerate(self._group):
            if g >= 0:
                self._members[g].append(i)
        self._row_of: dict[int, int] = {}  # entry node -> its row in self._rows (distances to it from every node)
        self._rows = np.zeros((0, n))
        self._blocks: dict[tuple[int, bytes], tuple[np.ndarray, np.ndarray]] = {}  # see _block
        self._block_floats = 0
        self._vias: dict[tuple[int, bytes, bytes], np.ndarray] = {}  # see _composed
        self._via_floats = 0
        self._cols: dict[tuple[int, ...], dict[int, list[float]]] = {}  # see _composed
        self._routes: dict[tuple[str, str], tuple[Edge, ...]] = {}
        self._near: dict[int, tuple[float, Dist, dict[int, list[tuple[int, float]]]]] = {}  # see _near_dist
        self._far: dict[int, tuple[Dist, dict[int, list[tuple[int, float]]]]] = {}  # composed (prepare)
        self._near_nodes = 0
        self._near_size: dict[int, int] = {}  # nodes each kept bounded search holds

    def _two_hop_bound(self, s: int, d: int) -> float:
        """Latency of the best path of at most two links from s to d (inf if none): a bound on the distance."""
        best = self._weight[s].get(d, np.inf)
        for x, w in self._succ[s]:
            w2 = self._weight[x].get(d)
            if w2 is not None and w + w2 < best:
                best = w + w2
        return best

    def prepare(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Compute the routes of many (src, dst) pairs at once (grouped by destination)."""
        todo: dict[str, list[str]] = {}
        limit: dict[str, float] = {}
        for src, dst in pairs:
            if src != dst and (src, dst) not in self._routes:
                todo.setdefault(dst, []).append(src)
                bound = self._two_hop_bound(self._index[src], self._index[dst]) * (1 + 1e-9)
                limit[dst] = max(limit.get(dst, 0.0), bound)
        rest = []
        entries = {}
        for dst in todo:
            if np.isfinite(limit[dst]):
                self._walk_all(dst, todo[dst], *self._near_dist(self._index[dst], limit[dst]))
            elif self._index[dst] in self._far:  # its distances composed in an earlier batch
                self._walk_all(dst, todo[dst], *self._far[self._index[dst]])
            else:
                found = self._entries(self._index[dst])
                if found is None:
                    rest.append(dst)
                else:
                    entries[dst] = found
        self._add_rows({x for inside, consts in entries.values() for x in consts})
        for dst, (inside, consts) in entries.items():
            if all(x in self._row_of for x in consts):
                d = self._index[dst]
                composed: tuple[Dist, dict[int, list[tuple[int, float]]]] = (
                    self._composed(self._group[d], inside, consts), {})
                if self._near_nodes + len(inside) + len(consts) <= _NEAR_MAX:  # kept, as _near_dist keeps its
                    self._far[d] = composed
                    self._near_nodes += len(inside) + len(consts)
                self._walk_all(dst, todo[dst], *composed)
            else:
                rest.append(dst)
        for start in range(0, len(rest), _BATCH):
            batch = rest[start:start + _BATCH]
            dist = dijkstra(self._reversed, directed=True, indices=[self._index[d] for d in batch])
            for row, dst in zip(dist, batch, strict=True):
                self._walk_all(dst, todo[dst], _array_dist(row))

    def _near_dist(self, dst: int, limit: float) -> tuple[Dist, dict[int, list[tuple[int, float]]]]:
        """Distances to ``dst`` of the nodes within ``limit`` (:meth:`_bounded`) and the walks' shared successors
        (:meth:`_walk`), kept per destination while they fit in ``_NEAR_MAX`` nodes: a later batch of sources for
        the same destination, within the same or a smaller limit, walks the same distances (a node on a shortest
        path from a source within the limit is itself within it, whatever farther nodes a larger search settled)."""
        hit = self._near.get(dst)
        if hit is not None and hit[0] >= limit:
            return hit[1], hit[2]
        dist, settled = self._bounded(dst, limit)
        on_path: dict[int, list[tuple[int, float]]] = {}
        if hit is not None:  # a wider search replaces the kept one
            self._near_nodes -= self._near_size.pop(dst)
            del self._near[dst]
        if self._near_nodes + settled <= _NEAR_MAX:
            self._near[dst] = (limit, dist, on_path)
            self._near_size[dst] = settled
            self._near_nodes += settled
        return dist, on_path

    def _walk_all(self, dst: str, sources: list[str], dist: Dist,
                  on_path: dict[int, list[tuple[int, float]]] | None = None) -> None:
        on_path = {} if on_path is None else on_path  # shared by the sources: see _walk
        for src in sources:
            self._routes[(src, dst)] = self._walk(src, dst, dist, on_path)

    def _bounded(self, dst: int, limit: float) -> tuple[Dist, int]:
        """Distances to ``dst`` of the nodes within ``limit`` of it (the others: inf), as scipy's ``limit``, and
        how many nodes that is."""
        settled: dict[int, float] = {}
        heap = [(0.0, dst)]
        pred, pop, push = self._pred, heapq.heappop, heapq.heappush
        while heap:
            d, v = pop(heap)
            if v in settled:
                continue
            settled[v] = d
            for u, w in pred[v]:
                du = d + w
                if du <= limit and u not in settled:  # a node farther than limit is never settled: not pushed
                    push(heap, (du, u))
        inf = float("inf")
        return ((lambda v: settled.get(v, inf)),
                (lambda idx: np.array([settled.get(v, inf) for v in idx.tolist()]))), len(settled)

    def _entries(self, dst: int) -> tuple[dict[int, float], dict[int, float]] | None:
        """Distances to ``dst`` inside its group, and the constant ``w(x, y) + d_group(y, dst)`` of each entry
        node x (the best over its links into the group); None when the group is too large or too open."""
        g = self._group[dst]
        if g < 0 or len(self._members[g]) > _GROUP_MAX:
            return None
        inside: dict[int, float] = {}
        heap = [(0.0, dst)]
        while heap:
            d, v = heapq.heappop(heap)
            if v in inside:
                continue
            inside[v] = d
            for u, w in self._pred[v]:
                if self._group[u] == g and u not in inside:
                    heapq.heappush(heap, (d + w, u))
        consts: dict[int, float] = {}
        for y, dy in inside.items():
            for x, w in self._pred[y]:
                if self._group[x] != g:
                    c = w + dy
                    if c < consts.get(x, np.inf):
                        consts[x] = c
                        if len(consts) > _ENTRY_SOURCES_MAX:
                            return None
        return inside, consts

    def _add_rows(self, nodes: set[int]) -> None:
        """Distances to each of ``nodes`` from every node (kept while they fit in ``_ROW_FLOATS_MAX``)."""
        new = sorted(x for x in nodes if x not in self._row_of)
        room = _ROW_FLOATS_MAX // max(1, len(self._names)) - len(self._row_of)
        if not new or len(new) > room:
            return
        dist = dijkstra(self._reversed, directed=True, indices=new)
        for x in new:
            self._row_of[x] = len(self._row_of)
        self._rows = np.vstack([self._rows, dist])

    def _composed(self, group: int, inside: dict[int, float], consts: dict[int, float]) -> Dist:
        """d(v) = min(d_group(v), min over entry nodes x of d(v, x) + consts[x])."""
        xs = sorted(consts)
        rix = np.array([self._row_of[x] for x in xs], dtype=np.int64)
        c = np.array([consts[x] for x in xs])
        inf = float("inf")

        cols = self._cols.setdefault(tuple(xs), {})  # node -> its distances to the entry nodes xs, as floats
        cl = c.tolist()

        def one(v: int) -> float:
            col = cols.get(v)
            if col is None:  # the rows as they are now (read at the call: kept distances hold no old copy)
                col = cols[v] = self._rows[rix, v].tolist()
            via = min(map(operator.add, col, cl)) if cl else inf  # the same IEEE sums and minimum as numpy's
            return min(inside.get(v, inf), via)

        ckey = (rix.tobytes(), c.tobytes())

        def many(idx: np.ndarray) -> np.ndarray:
            block, groups = self._block(idx, rix)
            key = (id(idx), *ckey)  # destinations alike (the same entry nodes and constants) share this minimum
            via = self._vias.get(key)
            if via is None:
                via = (block + c[:, None]).min(axis=0) if len(c) else np.full(len(idx), inf)
                if self._via_floats + via.size <= _ROW_FLOATS_MAX:
                    self._vias[key] = via
                    self._via_floats += via.size
            mine = np.flatnonzero(groups == group).tolist()
            if not mine:
                return via
            via = via.copy()
            for pos in mine:
                via[pos] = min(via[pos], inside.get(int(idx[pos]), inf))
            return via

        return one, many

    def _block(self, idx: np.ndarray, rix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distances from the successors ``idx`` of one node to entry nodes ``rix``, and their groups: kept, as
        the servers behind one switch share their entry nodes (``idx`` is one of ``self._succ_np``'s arrays)."""
        key = (id(idx), rix.tobytes())
        hit = self._blocks.get(key)
        if hit is None:
            hit = (self._rows[np.ix_(rix, idx)], self._group_np[idx])
            if self._block_floats + hit[0].size <= _ROW_FLOATS_MAX:
                self._blocks[key] = hit
                self._block_floats += hit[0].size
        return hit

    def _walk(self, src: str, dst: str, dist: Dist, on_path: dict[int, list[tuple[int, float]]] | None = None
              ) -> tuple[Edge, ...]:
        """The route from ``src`` to ``dst`` over ``dist`` (distances to ``dst``). ``on_path`` keeps, per node, the
        successors on a shortest path to ``dst`` with their distances: they depend on the node and ``dst`` only, so
        the sources of one destination share them (only the ECMP pick among them depends on the source)."""
        at, many = dist
        names, succ, succ_np = self._names, self._succ, self._succ_np
        cur, goal = self._index[src], self._index[dst]
        here = at(cur)
        if not np.isfinite(here):
            raise KeyError(f"no route from {src} to {dst}")
        if on_path is None:
            on_path = {}
        edges: list[Edge] = []
        while cur != goal:
            nxt = on_path.get(cur)
            if nxt is None:
                tol = 1e-12 * here
                vec = succ_np[cur]
                if vec is None:
                    nxt = []
                    for v, w in succ[cur]:
                        dv = at(v)
                        if abs(dv + w - here) <= tol and dv < here:
                            nxt.append((v, dv))
                else:
                    idx, ws = vec
                    dvs = many(idx)
                    keep = (np.abs(dvs + ws - here) <= tol) & (dvs < here)
                    nxt = list(zip(idx[keep].tolist(), dvs[keep].tolist(), strict=True))
                on_path[cur] = nxt
            pick = nxt[_stable_hash(f"{src}|{dst}|{names[cur]}") % len(nxt)] if len(nxt) > 1 else nxt[0]
            edges.append((names[cur], names[pick[0]]))
            cur, here = pick
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

    def plain_route(self, src: str, dst: str) -> tuple[Edge, ...]:
        """The route by a Dijkstra over the whole graph, whatever shortcut :meth:`route` takes (the definition,
        for tests)."""
        if src == dst:
            return ()
        row = dijkstra(self._reversed, directed=True, indices=[self._index[dst]])[0]
        return self._walk(src, dst, _array_dist(row))
