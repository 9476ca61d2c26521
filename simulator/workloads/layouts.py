"""How a prefill sequence is split over the P ranks of a context-parallel group, and the causal work of each block.

Layouts (docs/reference.md, ``workload.layout``), n tokens over P ranks, uneven n allowed:

* ``contiguous``: rank r owns [r n/P, (r+1) n/P) (the first n % P ranks one token more);
* ``zigzag``: the sequence in 2P contiguous chunks (sizes as above); rank r owns chunks r and 2P-1-r;
* ``striped``: rank r owns positions r, r+P, r+2P, ... (Striped Attention, Brandon et al., arXiv:2311.09431).

Every rank's positions are a few arithmetic runs (:class:`Run`) of one stride (1, or P for striped), so the number
of unmasked (query, key) pairs of a block has a closed form (:func:`pair_count`, O(runs^2)): with a causal mask
by global position, key ``c + s j`` is visible to query ``a + s i`` iff ``j <= i + floor((a - c) / s)``.
On a cached prefix (:func:`prefix_runs`) the C cached tokens were laid out by the same layout when they were
prefilled, so rank r holds the cache of its share of positions 0..C-1 (``layout_runs(layout, C, P)``), and the
n new tokens (positions C..C+n-1) are laid out again over the P ranks (``layout_runs(layout, n, P)`` shifted by
C): rank r's queries are its new positions, its keys its cached then its new positions (in that storage order).
Pure: numpy only for positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from simulator.workloads.shape import shard_bounds

__all__ = ["LAYOUTS", "Run", "imbalance", "layout_runs", "pair_count", "pair_matrix", "positions", "prefix_runs",
           "rank_pairs", "run_tokens"]

LAYOUTS = ("contiguous", "zigzag", "striped")


class Run(NamedTuple):
    """Positions ``start + step * i`` for ``i < size``."""

    start: int
    step: int
    size: int


def layout_runs(layout: str, n: int, p: int) -> list[tuple[Run, ...]]:
    """The runs of positions each of ``p`` ranks owns, ``n`` tokens in all."""
    if layout == "contiguous":
        return [(Run(lo, 1, hi - lo),) for lo, hi in shard_bounds(n, p)]
    if layout == "zigzag":
        chunks = shard_bounds(n, 2 * p)
        return [tuple(Run(lo, 1, hi - lo) for lo, hi in (chunks[r], chunks[2 * p - 1 - r])) for r in range(p)]
    if layout == "striped":
        return [(Run(r, p, len(range(r, n, p))),) for r in range(p)]
    raise ValueError(f"unknown layout {layout!r}; valid: {', '.join(LAYOUTS)}")


def prefix_runs(layout: str, cached: int, n: int, p: int) -> tuple[list[tuple[Run, ...]], list[tuple[Run, ...]]]:
    """(queries, keys) of each of ``p`` ranks on a cached prefix of ``cached`` tokens: its new positions (``n`` new
    tokens after the prefix), and its cached positions then its new ones (module docstring). Without a prefix
    both are ``layout_runs(layout, n, p)``."""
    new = layout_runs(layout, n, p)
    if cached == 0:
        return new, new
    shifted = [tuple(Run(r.start + cached, r.step, r.size) for r in rr) for rr in new]
    old = layout_runs(layout, cached, p)
    keys = [tuple(r for r in o if r.size) + q for o, q in zip(old, shifted, strict=True)]
    return shifted, keys


def positions(runs: Sequence[Run]) -> np.ndarray:
    """The global positions of a rank's rows, in the order it stores them (run by run)."""
    if not runs:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(r.size, dtype=np.int64) * r.step + r.start for r in runs])


def run_tokens(runs: Sequence[Run]) -> int:
    return sum(r.size for r in runs)


def _clamped_prefix(x: int, cap: int) -> int:
    """sum_{y=0}^{x-1} min(y, cap) for x >= 0."""
    if x <= cap + 1:
        return x * (x - 1) // 2
    return cap * (cap + 1) // 2 + (x - cap - 1) * cap


def _run_pairs(q: Run, k: Run) -> int:
    if q.size == 0 or k.size == 0:
        return 0
    if k.size > 1 and q.size > 1 and q.step != k.step:
        raise ValueError("runs of different strides")
    step = k.step if k.size > 1 else q.step  # a run of one position has any stride
    e = (q.start - k.start) // step + 1  # keys visible to query i: clamp(i + e, 0, k.size)
    lo, hi = e, e + q.size - 1
    if hi < 0:
        return 0
    return _clamped_prefix(hi + 1, k.size) - _clamped_prefix(max(lo, 0), k.size)


def pair_count(q: Sequence[Run], k: Sequence[Run], causal: bool) -> int:
    """Unmasked (query, key) pairs of the block (queries ``q``, keys ``k``)."""
    if not causal:
        return run_tokens(q) * run_tokens(k)
    return sum(_run_pairs(a, c) for a in q for c in k)


def pair_matrix(runs: Sequence[Sequence[Run]], causal: bool,
                k_runs: Sequence[Sequence[Run]] | None = None) -> np.ndarray:
    """``pair_count(runs[i], k_runs[j], causal)`` (``k_runs`` default ``runs``) for every pair of ranks (an int64
    array, P x P), by arrays: the same closed forms over every pair of runs at once."""
    keys = runs if k_runs is None else k_runs
    p = len(runs)

    def columns(rr_all: Sequence[Sequence[Run]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        width = max([1, *map(len, rr_all)])
        start, step, size = (np.zeros((p, width), dtype=np.int64) for _ in range(3))
        for r, rr in enumerate(rr_all):
            for j, run in enumerate(rr):
                start[r, j], step[r, j], size[r, j] = run
        return start, step, size

    qcol = columns(runs)
    kcol = qcol if k_runs is None else columns(keys)
    if not causal:
        return np.outer(qcol[2].sum(axis=1), kcol[2].sum(axis=1))
    out = np.zeros((p, p), dtype=np.int64)
    for a in range(qcol[0].shape[1]):  # the queries' run a against the keys' run c
        for c in range(kcol[0].shape[1]):
            qs, qst, qn = qcol[0][:, a, None], qcol[1][:, a, None], qcol[2][:, a, None]
            ks, kst, kn = kcol[0][None, :, c], kcol[1][None, :, c], kcol[2][None, :, c]
            if ((kn > 1) & (qn > 1) & (qst != kst)).any():
                raise ValueError("runs of different strides")
            stride = np.where(kn > 1, kst, qst)
            e = (qs - ks) // np.where(stride == 0, 1, stride) + 1  # keys visible to query i: clamp(i + e, 0, kn)
            lo, hi = e, e + qn - 1
            pairs = _clamped_prefixes(hi + 1, kn) - _clamped_prefixes(np.maximum(lo, 0), kn)
            out += np.where((qn == 0) | (kn == 0) | (hi < 0), 0, pairs)
    return out


def _clamped_prefixes(x: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """:func:`_clamped_prefix` over arrays (x >= 0 where it is used)."""
    return np.where(x <= cap + 1, x * (x - 1) // 2, cap * (cap + 1) // 2 + (x - cap - 1) * cap)


def rank_pairs(q: Sequence[Run], n: int, causal: bool) -> int:
    """Closed form of a rank's pairs against the whole sequence: sum of (position + 1) over its queries (causal),
    or its queries x n."""
    if not causal:
        return run_tokens(q) * n
    return sum(r.size * (r.start + 1) + r.step * r.size * (r.size - 1) // 2 for r in q)


def imbalance(layout: str, n: int, p: int, causal: bool) -> float:
    """Max over mean of the ranks' attention work (unmasked pairs)."""
    work = [rank_pairs(runs, n, causal) for runs in layout_runs(layout, n, p)]
    mean = sum(work) / p
    return max(work) / mean if mean else 1.0
