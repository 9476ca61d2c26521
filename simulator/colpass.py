"""Linear-time passes over a schedule's columns, compiled (numba): a block of transfers' columns written op after op
(:mod:`simulator.oplist`), and what :mod:`simulator.engine.core` would otherwise do with sorts of millions of
elements (the dependents of every op; the distinct values of a column of small codes).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["dependents", "distinct_codes", "fill_transfers", "group_max"]


@njit(cache=True)
def _dependents(starts: np.ndarray, parents: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
    first_kid = np.zeros(n + 1, dtype=np.int64)
    for e in range(len(parents)):
        first_kid[parents[e] + 1] += 1
    for d in range(n):
        first_kid[d + 1] += first_kid[d]
    fill = first_kid[:n].copy()
    kids = np.empty(len(parents), dtype=np.int32)
    for i in range(n):  # children in id order: each parent's kids come out in op-id order, as appended
        for e in range(starts[i], starts[i + 1]):
            d = parents[e]
            kids[fill[d]] = i
            fill[d] += 1
    return kids, first_kid


def dependents(counts: np.ndarray, parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every op's dependents as CSR (op d's are ``kids[first_kid[d]:first_kid[d + 1]]``, in op-id order), from each
    op's count of dependencies and all of them op after op (a counting sort: no sort of the edges)."""
    n = len(counts)
    if int(counts.sum()) != len(parents) or (len(counts) and int(counts.min()) < 0):
        raise ValueError("dependency counts that do not add up to the dependencies")
    if len(parents) and (int(parents.min()) < 0 or int(parents.max()) >= n):
        raise ValueError("a dependency does not name an op of the schedule")
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    return _dependents(starts, parents, n)


@njit(cache=True)
def _firsts(code: np.ndarray, k: int) -> np.ndarray:  # pragma: no cover
    first = np.full(k, -1, dtype=np.int64)
    for i in range(len(code)):
        if first[code[i]] < 0:
            first[code[i]] = i
    return first


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
    """A block of transfers' columns (:class:`simulator.oplist.TransferBlock`), written op after op: transfer k's
    send (id ``first + 2k``) then its recv, their deps from ``at`` in ``parents``."""
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
