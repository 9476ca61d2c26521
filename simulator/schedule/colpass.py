"""Linear-time passes over a schedule's columns, compiled (numba): a block of transfers' columns written op after op
(:mod:`simulator.schedule.oplist`), and what :mod:`simulator.engine.core` would otherwise do with sorts of millions of
elements (the dependents of every op; the distinct values of a column of small codes).
"""

from __future__ import annotations

import numpy as np

from simulator.schedule.op import OP_KINDS
from simulator.support.arraycopy import put1
from simulator.support.jitcache import njit

__all__ = ["dependents", "distinct_codes", "fill_transfers", "first_of", "group_max", "ordered_sum", "spans",
           "stream_ordered", "timeline_order"]


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
def _stream_deps(counts: np.ndarray, parents: np.ndarray, kind: np.ndarray, rank: np.ndarray, match: np.ndarray,
                 coll: np.ndarray, ordered: np.ndarray, kernel_a: int, kernel_b: int, send: int, recv: int,
                 launch: int) -> tuple[np.ndarray, np.ndarray, int]:  # pragma: no cover
    n = len(counts)
    last = np.full(len(ordered), -1, dtype=np.int64)  # each rank's last kernel so far
    gains = np.full(n, -1, dtype=np.int64)
    extra, e = 0, 0
    for i in range(n):
        k, r, c = kind[i], rank[i], counts[i]
        if k in (kernel_a, kernel_b):
            last[r] = i
        elif k in (send, recv, launch) and ordered[r] and last[r] >= 0:
            m = match[i]
            own = k == launch or (not coll[i] if k == send else (m < 0 or m >= n or not coll[m]))
            if own:
                seen = False
                for j in range(e, e + c):
                    if parents[j] == last[r]:
                        seen = True
                if not seen:
                    gains[i] = last[r]
                    extra += 1
        e += c
    if extra == 0:
        return counts, parents, 0
    new_counts = counts.copy()
    new_parents = np.empty(len(parents) + extra, dtype=parents.dtype)
    e, f = 0, 0
    for i in range(n):
        for j in range(e, e + counts[i]):
            new_parents[f] = parents[j]
            f += 1
        e += counts[i]
        if gains[i] >= 0:
            new_parents[f] = gains[i]
            f += 1
            new_counts[i] += 1
    return new_counts, new_parents, extra


def stream_ordered(counts: np.ndarray, parents: np.ndarray, kind: np.ndarray, rank: np.ndarray, match: np.ndarray,
                   coll: np.ndarray, ordered: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Every op's dependencies (``counts``, ``parents`` op after op) with the stream order of the ranks that post in it
    (``ordered``, by rank): a collective's launch, or a send or receive outside a collective (a send's ``coll`` false; a
    receive's match's), of such a rank depends on the last kernel (``compute`` or ``merge``) before it in its rank's op
    order too, appended after its own dependencies unless among them. Returns the counts and parents (the given arrays
    where nothing was added) and how many ends gained a dependency; one compiled pass, no sort."""
    if not ordered.any():  # (no rank posts in stream order: nothing to add, no pass)
        return counts, parents, 0
    index = OP_KINDS.index
    return _stream_deps(np.ascontiguousarray(counts, dtype=np.int32), np.ascontiguousarray(parents, dtype=np.int32),
                        np.ascontiguousarray(kind, dtype=np.uint8), np.ascontiguousarray(rank, dtype=np.int32),
                        np.ascontiguousarray(match, dtype=np.int32), np.ascontiguousarray(coll, dtype=np.bool_),
                        np.ascontiguousarray(ordered, dtype=np.bool_), index("compute"), index("merge"),
                        index("send"), index("recv"), index("launch"))
