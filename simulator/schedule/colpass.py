"""Linear-time passes over a schedule's columns, compiled (numba): a block of transfers' columns written op after op
(:mod:`simulator.schedule.oplist`), and what :mod:`simulator.engine.core` would otherwise do with sorts of millions of
elements (the dependents of every op; the distinct values of a column of small codes).
"""

from __future__ import annotations

import numpy as np

from simulator.schedule.op import OP_KINDS, P2P_STREAMS
from simulator.support.arraycopy import put1
from simulator.support.jitcache import njit

__all__ = [
    "dependents",
    "distinct_codes",
    "fill_transfers",
    "first_of",
    "group_max",
    "ordered_sum",
    "p2p_batches",
    "spans",
    "stream_ordered",
    "timeline_order",
]


@njit(cache=True)
def _dependents(counts: np.ndarray, parents: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:  # pragma: no cover
    n = len(counts)
    total = 0
    for i in range(n):
        if counts[i] < 0:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64), 1
        total += counts[i]
    if total != len(parents):
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64), 1
    first_kid = np.zeros(n + 1, dtype=np.int64)
    for e in range(len(parents)):
        d = parents[e]
        if d < 0 or d >= n:
            return np.zeros(0, dtype=np.int32), first_kid, 2
        first_kid[d + 1] += 1
    for d in range(n):
        first_kid[d + 1] += first_kid[d]
    kids = np.empty(len(parents), dtype=np.int32)
    e = 0
    for i in range(n):  # children in id order: each parent's kids come out in op-id order, as appended
        for _ in range(counts[i]):
            d = parents[e]
            e += 1
            kids[first_kid[d]] = i
            first_kid[d] += 1  # d's cursor: at the end, d's end (d + 1's start)
    for d in range(n, 0, -1):  # the starts again
        first_kid[d] = first_kid[d - 1]
    first_kid[0] = 0
    return kids, first_kid, 0


def dependents(counts: np.ndarray, parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every op's dependents as CSR (op d's are ``kids[first_kid[d]:first_kid[d + 1]]``, in op-id order), from each
    op's count of dependencies and all of them op after op (a counting sort: no sort of the edges; the counts and
    the dependencies checked in the same compiled passes)."""
    kids, first_kid, wrong = _dependents(counts, parents)
    if wrong == 1:
        raise ValueError("dependency counts that do not add up to the dependencies")
    if wrong == 2:
        raise ValueError("a dependency does not name an op of the schedule")
    return kids, first_kid


def spans(lo: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The indices ``lo[k], ..., lo[k] + counts[k] - 1`` of every k, one span after another (a gather of CSR
    segments: ``flat[spans(starts[rows], starts[rows + 1] - starts[rows])]``)."""
    ends = np.cumsum(counts)
    return np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - counts - lo, counts)


@njit(cache=True)
def _firsts(code: np.ndarray, k: int) -> np.ndarray:  # pragma: no cover
    first = np.full(k, -1, dtype=np.int64)
    for i in range(len(code)):
        c = code[i]
        if c >= 0 and first[c] < 0:
            first[c] = i
    return first


def first_of(code: np.ndarray, k: int) -> np.ndarray:
    """The first index of each code in ``0..k-1`` in ``code`` (-1: absent; a negative code is no code), in one
    compiled pass."""
    if len(code) and int(code.max()) >= k:
        raise ValueError(f"codes outside 0..{k - 1}")
    return _firsts(code.astype(np.int64, copy=False), k)  # (one compiled signature)


def distinct_codes(code: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(code, return_index=True, return_inverse=True)`` for codes in ``0..k-1`` (k not much more than
    the codes), in linear time: the distinct codes in increasing order, the first index of each, and each code's
    index among them."""
    if len(code) and (int(code.min()) < 0 or int(code.max()) >= k):
        raise ValueError(f"codes outside 0..{k - 1}")
    first = _firsts(code.astype(np.int64, copy=False), k)
    distinct = np.flatnonzero(first >= 0)
    index = np.full(k, -1, dtype=np.int64)
    index[distinct] = np.arange(len(distinct))
    return distinct, first[distinct], index[code]


@njit(cache=True)
def fill_transfers(first: int, src: np.ndarray, dst: np.ndarray, size: np.ndarray, send_start: np.ndarray,
                   send_flat: np.ndarray, recv_start: np.ndarray, recv_flat: np.ndarray, at: int, kind: np.ndarray,
                   rank: np.ndarray, match: np.ndarray, nbytes: np.ndarray, dep_count: np.ndarray,
                   parents: np.ndarray, cost: np.ndarray, send_kind: int, recv_kind: int) -> None:  # pragma: no cover
    """A block of transfers' columns (:class:`simulator.schedule.oplist.TransferBlock`), written op after op:
    transfer k's send (id ``first + 2k``, :func:`simulator.schedule.op.transfer_send`) then its recv, their deps from
    ``at`` in ``parents``."""
    e = at
    for k in range(len(src)):
        s, r = first + 2 * k, first + 2 * k + 1
        kind[s], kind[r] = send_kind, recv_kind
        rank[s], rank[r] = src[k], dst[k]
        match[s], match[r] = r, s
        nbytes[s] = size[k]
        cost[s], cost[r] = -1, -1
        dep_count[s] = send_start[k + 1] - send_start[k]
        for j in range(send_start[k], send_start[k + 1]):
            parents[e] = send_flat[j]
            e += 1
        dep_count[r] = recv_start[k + 1] - recv_start[k]
        for j in range(recv_start[k], recv_start[k + 1]):
            parents[e] = recv_flat[j]
            e += 1


@njit(cache=True)
def _ties_by_rank(order: np.ndarray, keys: np.ndarray, ranks: np.ndarray, p: int) -> None:  # pragma: no cover
    count = np.zeros(p + 1, dtype=np.int64)
    i, n = 0, len(order)
    while i < n:
        j = i + 1
        while j < n and keys[order[j]] == keys[order[i]]:
            j += 1
        if j - i > 1:  # a run of equal keys, in index order: stably by rank
            run = order[i:j].copy()
            if (j - i) * 8 >= p:  # a counting sort: O(run + ranks)
                count[:] = 0
                for o in run:
                    count[ranks[o] + 1] += 1
                for r in range(p):
                    count[r + 1] += count[r]
                for o in run:
                    order[i + count[ranks[o]]] = o
                    count[ranks[o]] += 1
            else:
                put1(order[i:j], run[np.argsort(ranks[run], kind="mergesort")], j - i)
        i = j


def timeline_order(starts: np.ndarray, ranks: np.ndarray, ids: np.ndarray, p: int) -> np.ndarray:
    """``ids[np.lexsort((ids, ranks[ids], starts[ids]))]`` for ``ids`` increasing with no NaN start and ranks in
    ``0..p-1``: by start, then rank, then id; one stable sort of the starts, then each run of equal starts (the ops
    of one instant: hundreds in a lockstep schedule) stably by rank, by counting where the run is long."""
    keys = starts[ids]
    order = np.argsort(keys, kind="stable")
    _ties_by_rank(order, keys, ranks[ids], p)
    return ids[order]


@njit(cache=True)
def _group_max(code: np.ndarray, values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
    out = np.full(k, -np.inf)
    seen = np.zeros(k, dtype=np.bool_)
    for i in range(len(code)):
        c = code[i]
        seen[c] = True
        if values[i] > out[c]:
            out[c] = values[i]
    return out, seen


def group_max(code: np.ndarray, values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The largest of ``values`` per code in ``0..k-1`` (``np.maximum.at`` on ``-inf``, in one compiled pass) and
    which codes occur."""
    if len(code) and (int(code.min()) < 0 or int(code.max()) >= k):
        raise ValueError(f"codes outside 0..{k - 1}")
    return _group_max(code, values, k)


@njit(cache=True)
def _ordered_sum(values: np.ndarray) -> float:  # pragma: no cover
    total = 0.0
    for v in values:
        total += v
    return total


def ordered_sum(values: np.ndarray) -> float:
    """``sum(values.tolist())``: the floats added one after another in order (not numpy's pairwise sum), compiled."""
    return float(_ordered_sum(np.ascontiguousarray(values, dtype=np.float64)))


@njit(cache=True)
def _p2p_groups(counts: np.ndarray, parents: np.ndarray, kind: np.ndarray, rank: np.ndarray, match: np.ndarray,
                coll: np.ndarray, ordered: np.ndarray, per_peer: bool, kernel_a: int, kernel_b: int, send: int,
                recv: int, launch: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """(each op's group, or -1 where it is not an ordered rank's own end (an end that depends on an end of its rank's
    open group starts a new one: the program waits for that end before it posts this one, so they cannot be one
    batch); each group's predecessor on its rank's
    stream, or -1 (all -1 ``per_peer``: no stream per rank); each group's first index into the next array; the
    groups' ends in op order; each end's predecessor on its connection, or -1: ``per_peer``, the rank's end before it
    with the same peer (a stream per pair of ranks), else the end before it in its group to or from the same peer in
    the same direction (NCCL takes a group's sends to a peer from that peer's queue, head first))."""
    n, nr = len(kind), len(ordered)
    group = np.full(n, -1, dtype=np.int64)
    before = np.full(n, -1, dtype=np.int64)
    open_g = np.full(nr, -1, dtype=np.int64)
    closed = np.full(nr, -1, dtype=np.int64)
    groups = owned = e = 0
    for i in range(n):
        k, r, c = kind[i], rank[i], counts[i]
        e += c
        if not ordered[r]:
            continue
        if k in (kernel_a, kernel_b, launch):
            if open_g[r] >= 0:
                closed[r], open_g[r] = open_g[r], -1
        elif k in (send, recv):
            m = match[i]
            if (not coll[i]) if k == send else (m < 0 or m >= n or not coll[m]):
                if open_g[r] >= 0:
                    for j in range(e - c, e):
                        if group[parents[j]] == open_g[r]:
                            closed[r], open_g[r] = open_g[r], -1
                            break
                if open_g[r] < 0:
                    open_g[r] = groups
                    before[groups] = -1 if per_peer else closed[r]
                    groups += 1
                group[i] = open_g[r]
                owned += 1
    # the connections: a key per own end, sorted stably (op order within a key)
    key = np.empty(owned, dtype=np.int64)
    which = np.empty(owned, dtype=np.int64)
    j = 0
    for i in range(n):
        if group[i] >= 0:
            m = match[i]
            peer = rank[m] + 1 if 0 <= m < n else 0
            stream = rank[i] if per_peer else 2 * group[i] + (1 if kind[i] == recv else 0)
            key[j], which[j] = stream * (nr + 1) + peer, i
            j += 1
    chain = np.full(n, -1, dtype=np.int64)
    order = np.argsort(key, kind="mergesort")
    for q in range(1, owned):
        if key[order[q]] == key[order[q - 1]]:
            chain[which[order[q]]] = which[order[q - 1]]
    first = np.zeros(groups + 1, dtype=np.int64)
    for i in range(n):
        if group[i] >= 0:
            first[group[i] + 1] += 1
    for g in range(groups):
        first[g + 1] += first[g]
    ends = np.empty(first[groups], dtype=np.int64)
    fill = first[:groups].copy()
    for i in range(n):
        if group[i] >= 0:
            ends[fill[group[i]]] = i
            fill[group[i]] += 1
    return group, before[:groups], first, ends, chain


@njit(cache=True, inline="always")
def _among(parents: np.ndarray, e: int, c: int, d: int) -> bool:  # pragma: no cover
    for j in range(e, e + c):  # noqa: SIM110 (a loop: numba compiles no generator into any())
        if parents[j] == d:
            return True
    return False


@njit(cache=True)
def _stream_deps(counts: np.ndarray, parents: np.ndarray, kind: np.ndarray, rank: np.ndarray, match: np.ndarray,
                 coll: np.ndarray, ordered: np.ndarray, per_peer: bool, kernel_a: int, kernel_b: int, send: int,
                 recv: int, launch: int) -> tuple[np.ndarray, np.ndarray, int]:  # pragma: no cover
    n = len(counts)
    group, before, first, ends, chain = _p2p_groups(counts, parents, kind, rank, match, coll, ordered, per_peer,
                                                    kernel_a, kernel_b, send, recv, launch)
    last = np.full(len(ordered), -1, dtype=np.int64)  # each rank's last kernel so far
    gains = np.zeros(n, dtype=np.int32)
    gain_of = np.empty(16, dtype=np.int64)  # the added parents, op after op
    extra, e = 0, 0
    for i in range(n):
        k, r, c = kind[i], rank[i], counts[i]
        if k in (kernel_a, kernel_b):
            last[r] = i
        elif ordered[r] and (k == launch or group[i] >= 0):
            g = before[group[i]] if group[i] >= 0 else -1
            want = 2 + (first[g + 1] - first[g] if g >= 0 else 0)
            if extra + want > len(gain_of):
                grown = np.empty(2 * (extra + want), dtype=np.int64)
                grown[:extra] = gain_of[:extra]
                gain_of = grown
            if last[r] >= 0 and not _among(parents, e, c, last[r]):
                gain_of[extra + gains[i]] = last[r]
                gains[i] += 1
            if g >= 0:
                for q in range(first[g], first[g + 1]):
                    if not _among(parents, e, c, ends[q]):
                        gain_of[extra + gains[i]] = ends[q]
                        gains[i] += 1
            if chain[i] >= 0 and not _among(parents, e, c, chain[i]):
                gain_of[extra + gains[i]] = chain[i]
                gains[i] += 1
            extra += gains[i]
        e += c
    if extra == 0:
        return counts, parents, 0
    new_counts = counts.copy()
    new_parents = np.empty(len(parents) + extra, dtype=parents.dtype)
    e, f, a, gained = 0, 0, 0, 0
    for i in range(n):
        for j in range(e, e + counts[i]):
            new_parents[f] = parents[j]
            f += 1
        e += counts[i]
        for _ in range(gains[i]):
            new_parents[f] = gain_of[a]
            f += 1
            a += 1
        new_counts[i] += gains[i]
        if gains[i]:
            gained += 1
    return new_counts, new_parents, gained


_KINDS = tuple(OP_KINDS.index(k) for k in ("compute", "merge", "send", "recv", "launch"))  # the passes' kind codes


def _contiguous(counts: np.ndarray, parents: np.ndarray, kind: np.ndarray, rank: np.ndarray, match: np.ndarray,
                coll: np.ndarray) -> tuple[np.ndarray, ...]:
    """The columns the point-to-point passes read, as the compiled code takes them."""
    return (np.ascontiguousarray(counts, dtype=np.int32), np.ascontiguousarray(parents, dtype=np.int32),
            np.ascontiguousarray(kind, dtype=np.uint8), np.ascontiguousarray(rank, dtype=np.int32),
            np.ascontiguousarray(match, dtype=np.int32), np.ascontiguousarray(coll, dtype=np.bool_))


def p2p_batches(counts: np.ndarray, parents: np.ndarray, kind: np.ndarray, rank: np.ndarray, match: np.ndarray,
                coll: np.ndarray) -> np.ndarray:
    """Each op's point-to-point group (one ``batch_isend_irecv``), numbered from 0 in op order, or -1 where the op is
    not a send or receive outside a collective: a rank's own ends issued back to back (no kernel or launch between
    them in its op order) are one group, unless an end depends on an end of the open group (the program waits for
    that one first: a new group). The groups :func:`stream_ordered` orders with ``p2p`` ``"batched"``, for the real
    runner to post as it does (:mod:`simulator.distributed.runner`)."""
    columns = _contiguous(counts, parents, kind, rank, match, coll)
    group, *_ = _p2p_groups(*columns, np.ones(int(rank.max()) + 1 if len(rank) else 0, dtype=np.bool_), False,
                            *_KINDS)
    return group


def stream_ordered(counts: np.ndarray, parents: np.ndarray, kind: np.ndarray, rank: np.ndarray, match: np.ndarray,
                   coll: np.ndarray, ordered: np.ndarray, p2p: str = "batched") -> tuple[np.ndarray, np.ndarray, int]:
    """Every op's dependencies (``counts``, ``parents`` op after op) with the stream order of the ranks that post in it
    (``ordered``, by rank): a collective's launch, or a send or receive outside a collective (a send's ``coll`` false; a
    receive's match's), of such a rank depends on the last kernel (``compute`` or ``merge``) before it in its rank's op
    order too; and its point-to-point groups run one after another: a rank's own sends and receives issued back to back
    (no kernel or launch between them in its op order) are one group (one ``batch_isend_irecv``, one NCCL kernel; an end
    that depends on an end of the open group starts a new one: :func:`p2p_batches`), and each end of a group depends on
    every end of the rank's group before it (the kernels of one stream run in the order they were enqueued), and within
    a group on the end before it to (or from) the same peer (NCCL's ``scheduleP2pTasksToPlan`` takes each peer's sends,
    and receives, from its queue head first): ``p2p``
    ``"batched"``. With ``p2p`` ``"per-peer"`` (each send and receive its own kernel, on a stream per pair of ranks)
    an end depends on its rank's end before it with the same peer.
    Added after the op's own dependencies, unless among them. Returns the counts and parents (the given arrays where
    nothing was added) and how many ops gained a dependency; compiled passes."""
    if p2p not in P2P_STREAMS:
        raise ValueError(f"p2p must be one of {', '.join(P2P_STREAMS)}, got {p2p!r}")
    if not ordered.any():  # (no rank posts in stream order: nothing to add, no pass)
        return counts, parents, 0
    return _stream_deps(*_contiguous(counts, parents, kind, rank, match, coll),
                        np.ascontiguousarray(ordered, dtype=np.bool_), p2p == "per-peer", *_KINDS)
