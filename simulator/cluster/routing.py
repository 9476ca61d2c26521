"""Deterministic routes: shortest by total latency, then fewest hops, ECMP ties broken by a stable hash.

Each link weighs ``latency + HOP_EPSILON`` so that, among paths of equal latency, the one with fewer hops is shorter;
a link into a CPU node weighs :data:`HOST_EPSILON` more, so that, before that, the path through fewer CPUs (host
bridges) is: of a GPU's NICs at the same latency, the one behind its PCIe switch before the one behind the host
bridge, as NCCL ranks paths (``PIX``/``PXB`` before ``PHB`` before ``SYS``, ``src/graph/paths.cc``).
The route walks from the source, at each node choosing among the successors that lie on a shortest path to the
destination; when there are several, the NIC the source GPU leaves its server by where it has several equally near
(NCCL's for channel 0, :mod:`simulator.cluster.nic_affinity`), else the one the destination GPU enters by, else a
hash (BLAKE2b of ``src|dst|hop``) picks one, so that different pairs spread over equal-cost paths as ECMP does while
the same pair always takes the same path, in every run and process.

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

A GPU (a node of kind ``gpu``) is a route's end and never a hop in its middle: CUDA peer-to-peer copies go over a
direct NVLink or over PCIe and the host, and no GPU forwards what it receives (NCCL chains through a GPU only as
an explicit step of its ring, a kernel that receives and sends: a schedule's step, not a route). The searches give a
GPU its distance to the destination but pass it on to no other node, the walks step onto a GPU only where it is
the destination, and scipy's search runs on a copy of the reversed graph in which the links into each GPU leave
from a node of their own (the GPU's "arrival" node, where a search to that GPU starts).

The searches (but scipy's) and the walks run compiled (:mod:`simulator.cluster.routecore`, numba), a batch of pairs
grouped by destination: a destination's search is done once for all its sources in the batch. :meth:`Router._walk`
is the walk's definition in Python, kept for :meth:`Router.plain_route`.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import networkx as nx
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from simulator.cluster.nic_affinity import home_nics
from simulator.cluster.routecore import (
    entry_constants,
    graph_arrays,
    scratch,
    two_hop_bounds,
    walk_bounded,
    walk_composed,
    walk_rows,
)
from simulator.schedule.colpass import spans

__all__ = ["HOP_EPSILON", "HOST_EPSILON", "Router"]

Edge = tuple[str, str]
HOP_EPSILON = 1e-15  # seconds added per hop: breaks latency ties in favour of fewer hops
HOST_EPSILON = 1e-13  # seconds added per link into a CPU node (more than HOP_EPSILON x any route's hops): breaks
# latency ties in favour of fewer host bridges first
_BATCH = 128  # destinations per compiled Dijkstra call (memory: batch x nodes floats)
_VECTOR_DEGREE = 32  # scan successors with numpy above this out-degree
_GROUP_MAX = 512  # a group larger than this is searched as a whole graph
_ENTRY_SOURCES_MAX = 64  # a group entered from more distinct nodes than this is searched as a whole graph
_ROW_FLOATS_MAX = 1 << 23  # distances to entry nodes kept per router (64 MiB)
_PART = 1 << 16  # pairs routed per compiled call, about (back in Python between parts: interrupts land)

Walked = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # a compiled walk's status, latency, starts, ids


def _stable_hash(key: str) -> int:
    """A hash that is the same in every process and run (unlike ``hash``), with well-mixed low bits."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


class Router:
    """Route cache over a directed graph whose edges carry ``latency`` (seconds)."""

    def __init__(self, graph: nx.DiGraph) -> None:
        self._names = list(graph.nodes)
        self._index = index = {n: i for i, n in enumerate(self._names)}
        n = len(self._names)
        edges = list(graph.edges(data="latency"))  # link ids: the graph's edge order
        ends = np.fromiter((index[x] for u, v, _ in edges for x in (u, v)), dtype=np.int64, count=2 * len(edges))
        eu, ev = ends[0::2].copy(), ends[1::2].copy()
        lat = np.fromiter((w for _, _, w in edges), dtype=np.float64, count=len(edges))
        kinds = [kind for _, kind in graph.nodes(data="kind")]  # (in the graph's node order: self._names')
        host = np.fromiter((k == "cpu" for k in kinds), dtype=bool, count=n)
        weight = lat + HOP_EPSILON + np.where(host[ev], HOST_EPSILON, 0.0)
        stop = np.fromiter((k == "gpu" for k in kinds), dtype=bool, count=n)
        # distances *to* a destination: the reversed graph, the links into a GPU leaving from its arrival node
        # (n + its place among the GPUs), so that a search reaches a GPU but never goes on through it
        arrival = np.full(n, -1, dtype=np.int64)
        arrival[stop] = n + np.arange(int(stop.sum()))
        self._start = np.where(stop, arrival, np.arange(n))  # where a search to each node starts
        self._reversed = csr_matrix((weight, (self._start[ev], eu)), shape=(n + int(stop.sum()),) * 2)
        self._ends = (eu, ev)  # each link's (u, v)
        group_of: dict[str, int] = {}
        group = [group_of.setdefault(name.split(".", 1)[0], len(group_of)) if "." in name else -1
                 for name in self._names]
        home = np.full(n, -1, dtype=np.int64)
        nic = np.fromiter((k == "nic" for k in kinds), dtype=bool, count=n)
        grp = np.asarray(group, dtype=np.int64)
        inside = nic[ev] & ~nic[eu] & (grp[eu] >= 0) & (grp[eu] == grp[ev])  # a server's own links into its NICs
        if inside.any() and np.bincount(eu[inside], minlength=n).max() > 1:  # some node hangs two NICs or more
            for gpu, card in home_nics(graph).items():
                home[index[gpu]] = index[card]
        self._graph = graph_arrays(self._names, eu, ev, lat, weight, group, stop, home)
        self._buf = np.zeros(3 * int(np.diff(self._graph.n_ptr).max(initial=0)) + 2, dtype=np.uint8)
        self._row_of = np.full(n, -1, dtype=np.int64)  # entry node -> its column in self._rows_t, -1: none
        self._rows_t = np.zeros((n, 0))  # distances to each entry node from every node (a column per entry node)
        self._scratch = scratch(self._graph)  # node-sized arrays the compiled searches write and reset
        self._row: dict[tuple[str, str], int] = {}  # a routed pair's row in the link-id CSR below
        self._starts = np.zeros(1, dtype=np.int64)  # rows' link ids: ids[starts[r]:starts[r + 1]] (buffers grown
        self._ids = np.zeros(0, dtype=np.int64)  # by doubling: rows and ids used so far below)
        self._latency = np.zeros(0)  # each row's route latency
        self._rows_used = 0
        self._ids_used = 0
        self._routes: dict[tuple[str, str], tuple[Edge, ...]] = {}  # routes as edges of names, made when asked

    def prepare(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Compute the routes of many (src, dst) pairs at once (grouped by destination)."""
        index, known = self._index, self._row
        new = list(dict.fromkeys((s, d) for s, d in pairs if s != d and (s, d) not in known))
        if not new:
            return
        src = np.fromiter((index[s] for s, _ in new), dtype=np.int64, count=len(new))
        dst = np.fromiter((index[d] for _, d in new), dtype=np.int64, count=len(new))
        order = np.argsort(dst, kind="stable")  # grouped by destination
        src, dst = src[order], dst[order]
        # a part at a time, cut between destinations: back in Python between parts (an interrupt lands)
        cuts = np.searchsorted(dst, dst[np.arange(_PART, len(dst), _PART)])
        for lo, hi in itertools.pairwise([0, *np.unique(cuts[cuts > 0]).tolist(), len(dst)]):
            self._route_sorted(src[lo:hi], dst[lo:hi])

    def _route_sorted(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Route new pairs ``src[k] -> dst[k]``, sorted by destination, every source of a destination among them."""
        dsts, first, counts = np.unique(dst, return_index=True, return_counts=True)
        by_dst = (src, dst, dsts, counts)
        bound = two_hop_bounds(self._graph, src, dst) * (1 + 1e-9)
        limit = np.maximum.reduceat(bound, first)  # every source's bound within it
        near = np.isfinite(limit)
        self._store(by_dst, near, walk_bounded, limit[near])
        rest = ~near
        if not rest.any():
            return
        ok, x_ptr, xs, cs = self._compiled(entry_constants, self._graph, dsts[rest], _GROUP_MAX, _ENTRY_SOURCES_MAX,
                                           *self._scratch)
        self._add_rows(np.unique(xs))
        rix = self._row_of[xs]
        composed = np.zeros(len(dsts), dtype=bool)
        missing = np.bincount(np.repeat(np.arange(len(ok)), np.diff(x_ptr))[rix < 0], minlength=len(ok))
        composed[rest] = ok & (missing == 0)  # every entry node's distances at hand
        keep = np.flatnonzero(composed[rest])
        lengths = np.diff(x_ptr)[keep]
        sub_ptr = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(lengths, out=sub_ptr[1:])
        sel = spans(x_ptr[keep], lengths)  # the kept ones' entries
        self._store(by_dst, composed, walk_composed, sub_ptr, rix[sel], cs[sel], self._rows_t)
        whole = np.flatnonzero(rest & ~composed)
        for start in range(0, len(whole), _BATCH):
            batch = np.zeros(len(dsts), dtype=bool)
            batch[whole[start:start + _BATCH]] = True
            dist = self._search_rows(dsts[batch])
            self._store(by_dst, batch, walk_rows, dist)

    def _store(self, by_dst: tuple[np.ndarray, ...], which: np.ndarray, walk: Callable[..., Walked],
               *args: object) -> None:
        """Walk the pairs of the destinations ``which`` (a mask over the distinct destinations ``dsts``, sorted;
        ``src``, ``dst``: the pairs sorted by destination, ``counts`` of each) with the compiled ``walk`` and keep
        their routes' link ids and latencies as rows."""
        if not which.any():
            return
        src, dst, dsts, counts = by_dst
        pick = np.repeat(which, counts)
        sub_src, sub_dst = src[pick], dst[pick]
        src_ptr = np.zeros(int(which.sum()) + 1, dtype=np.int64)
        np.cumsum(counts[which], out=src_ptr[1:])
        status, latency, starts, ids = self._compiled(walk, self._graph, dsts[which], *args, src_ptr, sub_src,
                                                      self._buf, *self._scratch[:2])
        names = self._names
        if status.any():
            k = int(np.argmax(status != 0))
            raise KeyError(f"no route from {names[int(sub_src[k])]} to {names[int(sub_dst[k])]}")
        first, n_ids = self._rows_used, self._ids_used
        keys = zip(map(names.__getitem__, sub_src.tolist()), map(names.__getitem__, sub_dst.tolist()), strict=True)
        self._row.update(zip(keys, range(first, first + len(sub_src)), strict=True))
        rows, more = first + len(sub_src), n_ids + len(ids)
        if rows + 1 > len(self._starts):
            self._starts = np.resize(self._starts, max(2 * len(self._starts), rows + 1))
            self._latency = np.resize(self._latency, len(self._starts) - 1)
        if more > len(self._ids):
            self._ids = np.resize(self._ids, max(2 * len(self._ids), more))
        self._starts[first + 1:rows + 1] = n_ids + starts[1:]
        self._latency[first:rows] = latency
        self._ids[n_ids:more] = ids
        self._rows_used, self._ids_used = rows, more

    def _search_rows(self, dsts: np.ndarray) -> np.ndarray:
        """Distances to each of ``dsts`` from every node (a row per destination), no route passing through a GPU:
        scipy's Dijkstra from the destination's start node over the reversed graph (:meth:`__init__`)."""
        n = len(self._names)
        dist = np.ascontiguousarray(dijkstra(self._reversed, directed=True, indices=self._start[dsts])[:, :n])
        dist[np.arange(len(dsts)), dsts] = 0.0
        return dist

    def _compiled(self, fn: Callable[..., Any], *args: object) -> Any:
        """``fn(*args)``, a compiled search or walk; where it raises, the scratch arrays it may have left written
        are made anew."""
        try:
            return fn(*args)
        except BaseException:
            self._scratch = scratch(self._graph)
            raise

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every routed pair's link ids (CSR: starts, ids) and latency, by row."""
        rows = self._rows_used
        return self._starts[:rows + 1], self._ids[:self._ids_used], self._latency[:rows]

    def paths(self, pairs: Sequence[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The routes of ``pairs`` as arrays, routing the new ones in one batch: (starts, link ids, latency) with
        pair k's link ids ``ids[starts[k]:starts[k + 1]]`` (the graph's edge order, route order) and its route's
        latency (its links' latencies added in route order). A node to itself: no link, latency 0."""
        self.prepare(pairs)
        row = self._row
        rows = np.fromiter((row.get(p, -1) for p in pairs), dtype=np.int64, count=len(pairs))
        starts, ids, latency = self._arrays()
        routed = rows >= 0
        lo = np.zeros(len(pairs), dtype=np.int64)
        counts = np.zeros(len(pairs), dtype=np.int64)
        lat = np.zeros(len(pairs))
        lo[routed] = starts[rows[routed]]
        counts[routed] = starts[rows[routed] + 1] - lo[routed]
        lat[routed] = latency[rows[routed]]
        out = np.zeros(len(pairs) + 1, dtype=np.int64)
        np.cumsum(counts, out=out[1:])
        return out, ids[spans(lo, counts)], lat

    def _add_rows(self, nodes: np.ndarray) -> None:
        """Distances to each of ``nodes`` from every node (kept while they fit in ``_ROW_FLOATS_MAX``)."""
        new = nodes[self._row_of[nodes] < 0]
        n = len(self._names)
        room = _ROW_FLOATS_MAX // max(1, n) - self._rows_t.shape[1]
        if not len(new) or len(new) > room:
            return
        dist = self._search_rows(new)
        self._row_of[new] = self._rows_t.shape[1] + np.arange(len(new))
        self._rows_t = np.ascontiguousarray(np.hstack([self._rows_t, dist.T]))

    def _walk(self, src: str, dst: str, dist: np.ndarray) -> tuple[Edge, ...]:
        """The route from ``src`` to ``dst`` over ``dist`` (distances to ``dst`` from every node), in Python: the
        definition the compiled walks (:mod:`simulator.cluster.routecore`) follow, kept for :meth:`plain_route`."""
        names, g = self._names, self._graph
        cur, goal = self._index[src], self._index[dst]
        here = float(dist[cur])
        if not np.isfinite(here):
            raise KeyError(f"no route from {src} to {dst}")
        edges: list[Edge] = []
        while cur != goal:
            tol = 1e-12 * here
            idx, ws = g.s_idx[g.s_ptr[cur]:g.s_ptr[cur + 1]], g.s_w[g.s_ptr[cur]:g.s_ptr[cur + 1]]  # name order
            if len(idx) <= _VECTOR_DEGREE:
                nxt = []
                for v, w in zip(idx.tolist(), ws.tolist(), strict=True):
                    dv = float(dist[v])
                    if abs(dv + w - here) <= tol and dv < here and (v == goal or not g.stop[v]):
                        nxt.append((v, dv))
            else:
                dvs = dist[idx]
                keep = (np.abs(dvs + ws - here) <= tol) & (dvs < here) & ((idx == goal) | (g.stop[idx] == 0))
                nxt = list(zip(idx[keep].tolist(), dvs[keep].tolist(), strict=True))
            pick = nxt[0]
            if len(nxt) > 1:  # the source's NIC among them, else the destination's, else the ECMP hash's
                homes = [int(g.home[self._index[end]]) for end in (src, dst)]
                pick = next((c for h in homes if h >= 0 for c in nxt if c[0] == h), None) or \
                    nxt[_stable_hash(f"{src}|{dst}|{names[cur]}") % len(nxt)]
            edges.append((names[cur], names[pick[0]]))
            cur, here = pick
        return tuple(edges)

    def route(self, src: str, dst: str) -> tuple[Edge, ...]:
        """Directed edges from ``src`` to ``dst``; empty when ``src == dst``. Raises KeyError if unreachable (without
        passing through a GPU)."""
        if src == dst:
            return ()
        hit = self._routes.get((src, dst))
        if hit is None:
            row = self._row.get((src, dst))
            if row is None:
                self.prepare([(src, dst)])
                row = self._row[(src, dst)]
            starts, ids, _ = self._arrays()
            us, vs = self._ends
            names = self._names
            link = ids[starts[row]:starts[row + 1]]
            hit = self._routes[(src, dst)] = tuple(zip(map(names.__getitem__, us[link].tolist()),
                                                       map(names.__getitem__, vs[link].tolist()), strict=True))
        return hit

    def plain_route(self, src: str, dst: str) -> tuple[Edge, ...]:
        """The route by a Dijkstra over the whole graph and a walk in Python, whatever shortcut :meth:`route`
        takes (the definition, for tests)."""
        if src == dst:
            return ()
        row = self._search_rows(np.array([self._index[dst]]))[0]
        return self._walk(src, dst, row)
