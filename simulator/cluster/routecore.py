"""The router's searches and walks, compiled (numba): :class:`simulator.cluster.routing.Router`'s definitions over
arrays, for batches of (source, destination) pairs.

The graph comes as CSR arrays (:class:`Graph`): successors in name order (the order the ECMP pick counts in),
predecessors (the reversed graph the searches run on), successors by index (for weight lookups), each node's group
and its name as UTF-8 bytes (the ECMP hash is BLAKE2b of ``src|dst|hop``, computed here as :mod:`hashlib` does).
A walk's distances to its destination are ``min(base[v], min_j rows_t[v, rix[j]] + cs[j])``: a bounded or
group-local search written into ``base`` (the entry terms empty for a bounded search), or a whole-graph search's
row. Each function returns every pair's route as edge ids (the graph's edge order; CSR), its latency (the links'
latencies added in route order, as ``sum`` adds them) and a status: 0 a route, 2 no route.

A node marked ``stop`` (a GPU) is a route's end, never a hop in its middle: the searches do not relax the links
into it but from its destination, and the walks step onto it only as the destination (a GPU does not forward what
it receives; :class:`simulator.cluster.routing.Router`).
"""

from __future__ import annotations

import heapq
from typing import Any, NamedTuple

import numpy as np
from numba import types
from numba.typed import Dict, List

from simulator.support.arraycopy import put1
from simulator.support.jitcache import njit

__all__ = ["Graph", "blake2b_8", "entry_constants", "graph_arrays", "scratch", "two_hop_bounds", "walk_bounded",
           "walk_composed", "walk_rows"]

NO_ROUTE = 2
_INF = np.inf
_KEEP_DEGREE = 32  # a node with more successors than this keeps them per class in composed walks (see _Kept)
_PAIR = types.UniTuple(types.int64, 2)


class Graph(NamedTuple):
    """A directed graph as the compiled walks read it."""

    s_ptr: np.ndarray  # successors (name order) of node v: s_idx[s_ptr[v]:s_ptr[v + 1]], weights s_w
    s_idx: np.ndarray
    s_w: np.ndarray
    s_eid: np.ndarray  # ... the link's id (the graph's edge order) and latency
    s_lat: np.ndarray
    p_ptr: np.ndarray  # predecessors: the reversed graph
    p_idx: np.ndarray
    p_w: np.ndarray
    k_idx: np.ndarray  # successors sorted by index (CSR on s_ptr), and each one's position in s_idx: lookups by
    k_pos: np.ndarray  # bisection
    group: np.ndarray  # group of each node, -1 for none
    g_size: np.ndarray  # nodes of each group
    most: int  # the largest out-degree
    n_ptr: np.ndarray  # name of node v: n_bytes[n_ptr[v]:n_ptr[v + 1]] (UTF-8)
    n_bytes: np.ndarray
    stop: np.ndarray  # 1 where node v may end a route but not be passed through (a GPU), else 0
    home: np.ndarray  # a GPU's NIC among equally near ones (simulator.cluster.nic_affinity), else -1


def graph_arrays(names: list[str], eu: np.ndarray, ev: np.ndarray, lat: np.ndarray, weight: np.ndarray,
                 group: list[int], stop: np.ndarray | None = None, home: np.ndarray | None = None) -> Graph:
    """The CSR arrays of a graph given as its links ``eu[e] -> ev[e]`` (link id ``e``: the graph's edge order),
    their latencies and their weights in the searches; ``stop``: the nodes no route passes through (none if not
    given); ``home``: per node, the NIC (node index) a route from or to it takes among equally short next hops, -1
    for none (all -1 if not given)."""
    n = len(names)
    rank = np.empty(n, dtype=np.int64)  # each node's place in name order
    rank[sorted(range(n), key=names.__getitem__)] = np.arange(n)
    s_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(eu, minlength=n), out=s_ptr[1:])
    s_order = np.lexsort((rank[ev], eu))  # by node, its successors in name order
    s_idx = ev[s_order]
    p_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(ev, minlength=n), out=p_ptr[1:])
    p_order = np.argsort(ev, kind="stable")  # by node, its predecessors in link order
    order = np.lexsort((s_idx, eu[s_order]))  # within each node's successors, by index
    encoded = [name.encode() for name in names]
    n_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=n_ptr[1:])
    n_bytes = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()
    groups = np.array(group, dtype=np.int64)
    return Graph(s_ptr, s_idx, weight[s_order], s_order.astype(np.int64), lat[s_order], p_ptr, eu[p_order],
                 weight[p_order], s_idx[order], order.astype(np.int64), groups,
                 np.bincount(groups[groups >= 0], minlength=max(group, default=-1) + 1),
                 int(max(1, np.diff(s_ptr).max(initial=0))), n_ptr, n_bytes,
                 np.zeros(n, dtype=np.uint8) if stop is None else np.asarray(stop, dtype=np.uint8),
                 np.full(n, -1, dtype=np.int64) if home is None else np.asarray(home, dtype=np.int64))


def scratch(g: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Node-sized arrays the searches write and reset (a batch's functions take them: no allocation per call):
    distances (inf but where written), the nodes written, and the same two for entry constants."""
    n = len(g.s_ptr) - 1
    return np.full(n, _INF), np.empty(n, dtype=np.int64), np.full(n, _INF), np.empty(n, dtype=np.int64)


# BLAKE2b (RFC 7693), an 8-byte digest, no key: hashlib.blake2b(data, digest_size=8)
_IV = np.array([0x6A09E667F3BCC908, 0xBB67AE8584CAA73B, 0x3C6EF372FE94F82B, 0xA54FF53A5F1D36F1,
                0x510E527FADE682D1, 0x9B05688C2B3E6C1F, 0x1F83D9ABFB41BD6B, 0x5BE0CD19137E2179], dtype=np.uint64)
_SIGMA = np.array([
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
    [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
    [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
    [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
    [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
    [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
    [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
    [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
    [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3]], dtype=np.int64)
_ROT = np.array([32, 24, 16, 63], dtype=np.uint64)
_U64 = np.uint64(64)
_U8 = np.uint64(8)
_PARAMS = np.uint64(0x01010008)  # fanout 1, depth 1, no key, 8-byte digest


@njit(cache=True, inline="always")
def _rotr(x: np.uint64, n: np.uint64) -> np.uint64:  # pragma: no cover
    return (x >> n) | (x << (_U64 - n))


@njit(cache=True, inline="always")
def _compress(h: np.ndarray, m: np.ndarray, t: int, last: bool) -> None:  # pragma: no cover
    v = np.empty(16, dtype=np.uint64)
    put1(v, h, 8)
    for i in range(8):
        v[8 + i] = _IV[i]
    v[12] ^= np.uint64(t)
    if last:
        v[14] = ~v[14]
    for r in range(12):
        s = _SIGMA[r]
        for i in range(8):
            if i < 4:
                a, b, c, d = i, 4 + i, 8 + i, 12 + i
            else:
                a, b, c, d = i - 4, 4 + (i - 3) % 4, 8 + (i - 2) % 4, 12 + (i - 1) % 4
            va, vb, vc, vd = v[a], v[b], v[c], v[d]
            va = va + vb + m[s[2 * i]]
            vd = _rotr(vd ^ va, _ROT[0])
            vc = vc + vd
            vb = _rotr(vb ^ vc, _ROT[1])
            va = va + vb + m[s[2 * i + 1]]
            vd = _rotr(vd ^ va, _ROT[2])
            vc = vc + vd
            vb = _rotr(vb ^ vc, _ROT[3])
            v[a], v[b], v[c], v[d] = va, vb, vc, vd
    for i in range(8):
        h[i] ^= v[i] ^ v[i + 8]


@njit(cache=True, inline="always")
def blake2b_8(data: np.ndarray, length: int) -> np.uint64:  # pragma: no cover
    """``int.from_bytes(hashlib.blake2b(bytes(data[:length]), digest_size=8).digest(), "little")``."""
    h = _IV.copy()
    h[0] ^= _PARAMS
    m = np.zeros(16, dtype=np.uint64)
    blocks = max(1, (length + 127) // 128)
    for blk in range(blocks):
        m[:] = 0
        lo = blk * 128
        hi = min(lo + 128, length)
        for k in range(lo, hi):
            m[(k - lo) // 8] |= np.uint64(data[k]) << (_U8 * np.uint64((k - lo) % 8))
        _compress(h, m, hi, blk == blocks - 1)
    return h[0]


@njit(cache=True, inline="always")
def _pick(g: Graph, src: int, dst: int, cur: int, buf: np.ndarray, k: int) -> np.int64:  # pragma: no cover
    """The ECMP pick among ``k`` successors: BLAKE2b of ``src|dst|cur`` (names), modulo k."""
    n = 0
    for part in range(3):
        v = src if part == 0 else dst if part == 1 else cur
        if part:
            buf[n] = 124  # "|"
            n += 1
        for i in range(g.n_ptr[v], g.n_ptr[v + 1]):
            buf[n] = g.n_bytes[i]
            n += 1
    return np.int64(blake2b_8(buf, n) % np.uint64(k))


@njit(cache=True, inline="always")
def _prefer(g: Graph, src: int, dst: int, cand: np.ndarray, k: int) -> int:  # pragma: no cover
    """Of ``k`` equally short next hops, the source's NIC (``g.home``), else the destination's, else -1."""
    for end in (src, dst):
        want = g.home[end]
        if want >= 0:
            for j in range(k):
                if g.s_idx[cand[j]] == want:
                    return j
    return -1


@njit(cache=True, inline="always")
def _position(g: Graph, u: int, v: int) -> int:  # pragma: no cover
    """Position of the link u -> v among u's successors (in s_idx), -1 if none."""
    lo, hi = g.s_ptr[u], g.s_ptr[u + 1]
    at = lo + np.searchsorted(g.k_idx[lo:hi], v)
    return g.k_pos[at] if at < hi and g.k_idx[at] == v else -1


@njit(cache=True, inline="always")
def _weight(g: Graph, u: int, v: int) -> float:  # pragma: no cover
    """Weight of the link u -> v, inf if none."""
    e = _position(g, u, v)
    return g.s_w[e] if e >= 0 else _INF


@njit(cache=True)
def two_hop_bounds(g: Graph, srcs: np.ndarray, dsts: np.ndarray) -> np.ndarray:  # pragma: no cover
    """Latency of the best path of at most two links from each source to its destination (inf if none; the middle
    node not a stop node)."""
    out = np.empty(len(srcs))
    for k in range(len(srcs)):
        s, d = srcs[k], dsts[k]
        best = _weight(g, s, d)
        for e in range(g.s_ptr[s], g.s_ptr[s + 1]):
            if g.stop[g.s_idx[e]]:
                continue
            w2 = _weight(g, g.s_idx[e], d)
            if w2 < _INF and g.s_w[e] + w2 < best:
                best = g.s_w[e] + w2
        out[k] = best
    return out


@njit(cache=True, inline="always")
def _search(g: Graph, dst: int, limit: float, only: int, base: np.ndarray,
            touched: np.ndarray) -> int:  # pragma: no cover
    """Dijkstra from ``dst`` over the reversed graph: the distances of the nodes within ``limit`` (and, where
    ``only`` >= 0, inside group ``only``) written into ``base`` (inf elsewhere), their nodes into ``touched``;
    returns how many. A stop node other than ``dst`` gets its distance but passes none on (no route through it)."""
    nt = 0
    heap = [(0.0, dst)]
    while heap:
        d, v = heapq.heappop(heap)
        if base[v] < _INF:
            continue
        base[v] = d
        touched[nt] = v
        nt += 1
        if g.stop[v] and v != dst:
            continue
        for e in range(g.p_ptr[v], g.p_ptr[v + 1]):
            u = g.p_idx[e]
            if only >= 0 and g.group[u] != only:
                continue
            du = d + g.p_w[e]
            if du <= limit and base[u] == _INF:
                heapq.heappush(heap, (du, u))
    return nt


@njit(cache=True, inline="always")
def _via(v: int, rows_t: np.ndarray, rix: np.ndarray, cs: np.ndarray) -> float:  # pragma: no cover
    """The best of v's paths through an entry node: ``min_j rows_t[v, rix[j]] + cs[j]`` (inf: none)."""
    d = _INF
    for j in range(len(rix)):
        x = rows_t[v, rix[j]] + cs[j]
        if x < d:
            d = x
    return d


@njit(cache=True, inline="always")
def _dist(v: int, base: np.ndarray, rows_t: np.ndarray, rix: np.ndarray, cs: np.ndarray) -> float:  # pragma: no cover
    return min(base[v], _via(v, rows_t, rix, cs))


class _Kept(NamedTuple):
    """Successors on shortest paths found by walks over composed distances, kept per (class, node): a node outside
    the destination's group (where base is inf) has the same distance and the same such successors for every
    destination of one class (the same entry nodes and constants), but for the group's own nodes."""

    where: Any  # numba typed Dict: (class, node) -> (first, count) in the lists below
    pos: Any  # typed List of successor positions (in s_idx)
    dist: Any  # typed List of their distances


@njit(cache=True, inline="always")
def _new_kept() -> _Kept:  # pragma: no cover
    return _Kept(Dict.empty(key_type=_PAIR, value_type=_PAIR), List.empty_list(types.int64),
                 List.empty_list(types.float64))


@njit(cache=True, inline="always")
def _on_path(dv: float, w: float, here: float, tol: float) -> bool:  # pragma: no cover
    return abs(dv + w - here) <= tol and dv < here


@njit(cache=True, inline="always")
def _scan(g: Graph, cur: int, dst: int, here: float, base: np.ndarray, rows_t: np.ndarray, rix: np.ndarray,
          cs: np.ndarray, cand: np.ndarray, cand_d: np.ndarray, kept: _Kept, cls: int, grp: int, touched: np.ndarray,
          nt: int) -> int:  # pragma: no cover
    """The successors of ``cur`` on shortest paths to ``dst`` (positions into ``cand`` in name order, distances
    into ``cand_d``; a stop node only where it is ``dst``); how many. With ``cls`` >= 0, a wide node outside group
    ``grp`` reads them from ``kept``: those of its class, less the group's nodes (``touched``: their distances are
    not the class's), plus the group's nodes that are."""
    tol = 1e-12 * here
    lo, hi = g.s_ptr[cur], g.s_ptr[cur + 1]
    if cls < 0 or hi - lo <= _KEEP_DEGREE or g.group[cur] == grp:
        k = 0
        for e in range(lo, hi):
            if g.stop[g.s_idx[e]] and g.s_idx[e] != dst:
                continue
            dv = _dist(g.s_idx[e], base, rows_t, rix, cs)
            if _on_path(dv, g.s_w[e], here, tol):
                cand[k] = e
                cand_d[k] = dv
                k += 1
        return k
    key = (cls, cur)
    if key not in kept.where:
        first = len(kept.pos)
        for e in range(lo, hi):
            if g.stop[g.s_idx[e]]:  # outside the group: not the destination
                continue
            dv = _via(g.s_idx[e], rows_t, rix, cs)
            if _on_path(dv, g.s_w[e], here, tol):
                kept.pos.append(e)
                kept.dist.append(dv)
        kept.where[key] = (first, len(kept.pos) - first)
    first, count = kept.where[key]
    k = 0
    for j in range(first, first + count):
        e = kept.pos[j]
        if base[g.s_idx[e]] == _INF:  # not a node of the group
            cand[k] = e
            cand_d[k] = kept.dist[j]
            k += 1
    for t in range(nt):  # the group's nodes among cur's successors, each in its place
        e = _position(g, cur, touched[t])
        if e < 0 or (g.stop[touched[t]] and touched[t] != dst):
            continue
        dv = _dist(touched[t], base, rows_t, rix, cs)
        if _on_path(dv, g.s_w[e], here, tol):
            at = k
            while at > 0 and cand[at - 1] > e:
                cand[at] = cand[at - 1]
                cand_d[at] = cand_d[at - 1]
                at -= 1
            cand[at] = e
            cand_d[at] = dv
            k += 1
    return k


@njit(cache=True, inline="always")
def _room(a: np.ndarray, used: int, need: int) -> np.ndarray:  # pragma: no cover
    """``a``, or a copy of its first ``used`` entries in an array twice as long where ``need`` do not fit."""
    if need <= len(a):
        return a
    grown = np.empty(2 * need + 16, dtype=a.dtype)
    put1(grown, a, used)
    return grown


@njit(cache=True, inline="always")
def _walk(g: Graph, src: int, dst: int, base: np.ndarray, rows_t: np.ndarray, rix: np.ndarray, cs: np.ndarray,
          buf: np.ndarray, cand: np.ndarray, cand_d: np.ndarray, kept: _Kept, cls: int, touched: np.ndarray, nt: int,
          out: np.ndarray, n_out: int) -> tuple[int, float, np.ndarray, int]:  # pragma: no cover
    """The route from src to dst (Router._walk's definition) appended to ``out`` (grown as needed) as link ids;
    (status, latency, out, its length)."""
    here = _dist(src, base, rows_t, rix, cs)
    if not here < _INF:
        return NO_ROUTE, 0.0, out, n_out
    cur = src
    latency = 0.0
    grp = g.group[dst]
    while cur != dst:
        k = _scan(g, cur, dst, here, base, rows_t, rix, cs, cand, cand_d, kept, cls, grp, touched, nt)
        if k == 0:  # cannot happen on true distances: a node on a shortest path has a successor on one
            raise AssertionError("a route walk found no successor on a shortest path")
        pick = 0 if k == 1 else _prefer(g, src, dst, cand, k)
        if pick < 0:
            pick = _pick(g, src, dst, cur, buf, k)
        e = cand[pick]
        out = _room(out, n_out, n_out + 1)
        out[n_out] = g.s_eid[e]
        n_out += 1
        latency += g.s_lat[e]
        cur, here = g.s_idx[e], cand_d[pick]
    return 0, latency, out, n_out


@njit(cache=True, inline="always")
def _walk_sources(g: Graph, dst: int, first: int, src_ptr: np.ndarray, srcs: np.ndarray, base: np.ndarray,
                  rows_t: np.ndarray, rix: np.ndarray, cs: np.ndarray, buf: np.ndarray, cand: np.ndarray,
                  cand_d: np.ndarray, kept: _Kept, cls: int, touched: np.ndarray, nt: int, status: np.ndarray,
                  latency: np.ndarray, starts: np.ndarray, out: np.ndarray, n_out: int
                  ) -> tuple[np.ndarray, int]:  # pragma: no cover
    """The routes to ``dst`` of sources ``srcs[src_ptr[first]:src_ptr[first + 1]]``."""
    for k in range(src_ptr[first], src_ptr[first + 1]):
        st, latency[k], out, n_out = _walk(g, srcs[k], dst, base, rows_t, rix, cs, buf, cand, cand_d, kept, cls,
                                           touched, nt, out, n_out)
        status[k] = st
        starts[k + 1] = n_out
    return out, n_out


@njit(cache=True, inline="always")
def _outputs(g: Graph, pairs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                            _Kept]:  # pragma: no cover
    """A batch's status, latency, starts and link ids (grown as needed); room for one node's successors on shortest
    paths (its out-degree at most); successors kept per class."""
    return (np.zeros(pairs, dtype=np.int64), np.zeros(pairs), np.zeros(pairs + 1, dtype=np.int64),
            np.empty(4 * pairs + 16, dtype=np.int64), np.empty(g.most, dtype=np.int64), np.empty(g.most), _new_kept())


@njit(cache=True, inline="always")
def _no_entries(g: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """The entry terms of a walk over one array of distances: none."""
    return np.empty((len(g.s_ptr) - 1, 0)), np.empty(0, dtype=np.int64), np.empty(0)


@njit(cache=True, inline="always")
def _reset(base: np.ndarray, touched: np.ndarray, nt: int) -> None:  # pragma: no cover
    for t in range(nt):
        base[touched[t]] = _INF


@njit(cache=True)
def entry_constants(g: Graph, dsts: np.ndarray, group_max: int, entries_max: int, base: np.ndarray,
                    touched: np.ndarray, best: np.ndarray, seen: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """Per destination in a group of at most ``group_max`` nodes: each entry node x (outside the group, with a
    link into it) and ``w(x, y) + d_group(y, dst)``, the best over its links into the group (a path into the group
    enters it for the last time over such a link, at the destination or at a node that is not a stop node).
    (ok, x_ptr, xs, cs): not ok where the destination has no group, its group is larger or entered from more than
    ``entries_max`` nodes, or from a stop node (a path through it would pass through a stop node)."""
    ok = np.zeros(len(dsts), dtype=np.bool_)
    x_ptr = np.zeros(len(dsts) + 1, dtype=np.int64)
    xs = np.empty(0, dtype=np.int64)
    cs = np.empty(0)
    n_x = 0
    for i in range(len(dsts)):
        grp = g.group[dsts[i]]
        ns = 0
        if grp >= 0 and g.g_size[grp] <= group_max:
            nt = _search(g, dsts[i], _INF, grp, base, touched)
            ok[i] = True
            for t in range(nt):
                y = touched[t]
                if g.stop[y] and y != dsts[i]:
                    continue
                for e in range(g.p_ptr[y], g.p_ptr[y + 1]):
                    x = g.p_idx[e]
                    if g.group[x] != grp:
                        if g.stop[x]:
                            ok[i] = False
                        c = g.p_w[e] + base[y]
                        if c < best[x]:
                            if best[x] == _INF:
                                seen[ns] = x
                                ns += 1
                            best[x] = c
                if ns > entries_max:
                    ok[i] = False
                    break
            _reset(base, touched, nt)
            if ok[i]:
                xs, cs = _room(xs, n_x, n_x + ns), _room(cs, n_x, n_x + ns)
                for t in range(ns):
                    xs[n_x + t] = seen[t]
                    cs[n_x + t] = best[seen[t]]
                n_x += ns
            _reset(best, seen, ns)
        x_ptr[i + 1] = n_x
    return ok, x_ptr, xs[:n_x], cs[:n_x]


@njit(cache=True, inline="always")
def _class_of(rix: np.ndarray, cs: np.ndarray, classes: Any, class_rix: Any, class_cs: Any) -> int:  # pragma: no cover
    """An id shared by the destinations whose entry nodes and constants are these (in any order); -1 where its
    hash names another class (nothing kept for it then)."""
    order = np.argsort(rix, kind="mergesort")
    r, c = rix[order], cs[order]
    h = np.uint64(14695981039346656037)
    for j in range(len(r)):
        for word in (np.uint64(r[j]), c[j:j + 1].view(np.uint64)[0]):
            h = (h ^ word) * np.uint64(1099511628211)
    key = np.int64(h >> np.uint64(1))
    if key not in classes:
        classes[key] = len(class_rix)
        class_rix.append(r)
        class_cs.append(c)
    cls = classes[key]
    same = len(class_rix[cls]) == len(r)
    if same:
        for j in range(len(r)):
            if class_rix[cls][j] != r[j] or class_cs[cls][j] != c[j]:
                same = False
    return cls if same else -1


BOUNDED, COMPOSED, ROWS = range(3)  # how _walks finds a destination's distances


@njit(cache=True)
def _walks(g: Graph, mode: int, dsts: np.ndarray, limits: np.ndarray, x_ptr: np.ndarray, rix: np.ndarray,
           cs: np.ndarray, rows_t: np.ndarray, rows: np.ndarray, src_ptr: np.ndarray, srcs: np.ndarray,
           buf: np.ndarray, base: np.ndarray, touched: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """The three walks (:func:`walk_bounded`, :func:`walk_composed`, :func:`walk_rows`) as one compiled function
    (compiled once, not three times: what a fresh install compiles on its first run), ``mode`` choosing where each
    destination's distances come from; the arguments another mode reads are empty."""
    status, latency, starts, out, cand, cand_d, kept = _outputs(g, len(srcs))
    n_out = 0
    no_rows, no_rix, no_cs = _no_entries(g)
    no_touched = np.empty(0, dtype=np.int64)
    classes = Dict.empty(key_type=types.int64, value_type=types.int64)
    class_rix = List.empty_list(types.int64[:])
    class_cs = List.empty_list(types.float64[:])
    for i in range(len(dsts)):
        dst = dsts[i]
        if mode == ROWS:  # whole-graph distances
            dist, entry_rows, entry_rix, entry_cs, cls, hit, nt = rows[i], no_rows, no_rix, no_cs, -1, no_touched, 0
        elif mode == BOUNDED:  # a search bounded by limits[i]
            nt = _search(g, dst, limits[i], -1, base, touched)
            dist, entry_rows, entry_rix, entry_cs, cls, hit = base, no_rows, no_rix, no_cs, -1, touched
        else:  # composed: a search inside the destination's group and its entry nodes' rows
            nt = _search(g, dst, _INF, g.group[dst], base, touched)
            lo, hi = x_ptr[i], x_ptr[i + 1]
            cls = _class_of(rix[lo:hi], cs[lo:hi], classes, class_rix, class_cs)
            dist, entry_rows, entry_rix, entry_cs, hit = base, rows_t, rix[lo:hi], cs[lo:hi], touched
        out, n_out = _walk_sources(g, dst, i, src_ptr, srcs, dist, entry_rows, entry_rix, entry_cs, buf, cand,
                                   cand_d, kept, cls, hit, nt, status, latency, starts, out, n_out)
        if mode != ROWS:
            _reset(base, touched, nt)
    return status, latency, starts, out[:n_out]


_NO_INTS = np.empty(0, dtype=np.int64)
_NO_FLOATS = np.empty(0)
_NO_TABLE = np.empty((0, 0))


def walk_bounded(g: Graph, dsts: np.ndarray, limits: np.ndarray, src_ptr: np.ndarray, srcs: np.ndarray,
                 buf: np.ndarray, base: np.ndarray, touched: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Routes to each destination ``dsts[i]`` from ``srcs[src_ptr[i]:src_ptr[i + 1]]`` over a search bounded by
    ``limits[i]``: (status, latency, starts, link ids) per pair, in ``srcs``' order (``base``, ``touched``:
    :func:`scratch`'s, left as they came)."""
    return _walks(g, BOUNDED, dsts, limits, _NO_INTS, _NO_INTS, _NO_FLOATS, _NO_TABLE, _NO_TABLE, src_ptr, srcs,  # type: ignore[no-any-return]
                  buf, base, touched)


def walk_composed(g: Graph, dsts: np.ndarray, x_ptr: np.ndarray, rix: np.ndarray, cs: np.ndarray,
                  rows_t: np.ndarray, src_ptr: np.ndarray, srcs: np.ndarray, buf: np.ndarray, base: np.ndarray,
                  touched: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Routes over distances composed from the destination's group (a search inside it) and its entry nodes'
    rows: ``d(v) = min(d_group(v), min_x rows_t[v, x] + cs[x])``. As :func:`walk_bounded`."""
    return _walks(g, COMPOSED, dsts, _NO_FLOATS, x_ptr, rix, cs, rows_t, _NO_TABLE, src_ptr, srcs, buf, base,  # type: ignore[no-any-return]
                  touched)


def walk_rows(g: Graph, dsts: np.ndarray, rows: np.ndarray, src_ptr: np.ndarray, srcs: np.ndarray,
              buf: np.ndarray, base: np.ndarray, touched: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Routes over whole-graph distances: ``rows[i]`` to ``dsts[i]``. As :func:`walk_bounded` (the scratch
    unused)."""
    return _walks(g, ROWS, dsts, _NO_FLOATS, _NO_INTS, _NO_INTS, _NO_FLOATS, _NO_TABLE, rows, src_ptr, srcs, buf,  # type: ignore[no-any-return]
                  base, touched)
