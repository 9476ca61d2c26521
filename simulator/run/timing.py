"""What a row reads off one simulated schedule: the critical rank's compute and communication, the share of its
transfers its compute hid, the ranks' imbalance, the bytes moved and the per-rank memory peaks.

The critical rank is the one that finishes last. ``compute_s`` is its kernel time; ``comm_s`` the rest of its
time (waiting on transfers, and on other ranks, that its compute did not hide); ``comm_hidden_frac`` the share of
its transfer time (the union of its sends' and receives' intervals) during which it was computing (NaN when it
transfers nothing); ``imbalance`` max / mean of the ranks' kernel time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from simulator.engine.core import SimResult
from simulator.schedule.core import COMPUTE_KINDS, Schedule
from simulator.schedule.memory import timeline_peaks
from simulator.support.gcpause import gc_paused

__all__ = ["critical_timing", "result_numbers"]

_TRANSFERS = frozenset({"send", "recv"})


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        elif b > a:
            merged.append((a, b))
    return merged


def _overlap(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    total, j = 0.0, 0
    for a, b in xs:
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            total += max(0.0, min(b, ys[k][1]) - max(a, ys[k][0]))
            k += 1
    return total


def critical_timing(result: SimResult, ranks: int) -> dict[str, float]:
    """compute_s, comm_s, comm_hidden_frac of the critical rank; imbalance over all ranks; and the share of the
    critical rank's transfer time that ran under its kernels (``comm_under_compute_frac``: ``comm_hidden_frac``
    before what those transfers cost the kernels by holding SMs is taken off it)."""
    kernels = result.ended(COMPUTE_KINDS)
    # every rank's kernel seconds, each added in timeline order (bincount adds its weights in array order); the time
    # contention added to a kernel (its rank's transfers holding SMs) counts as communication, not compute
    busy = result.end[kernels] - result.start[kernels]
    if result.slowed is not None:
        busy = busy - result.slowed[kernels]
    compute = np.bincount(result.rank_of[kernels], weights=busy, minlength=ranks).astype(float).tolist()
    crit = result.critical_rank()

    def spans(ids: np.ndarray) -> list[tuple[float, float]]:
        return list(zip(result.start[ids].tolist(), result.end[ids].tolist(), strict=True))

    transfers = _union(spans(result.ended(_TRANSFERS, (crit,))))
    moved = sum(b - a for a, b in transfers)
    mine = result.ended(COMPUTE_KINDS, (crit,))
    under = _overlap(transfers, _union(spans(mine)))
    overlap = under
    if result.slowed is not None:  # a transfer did not hide behind the compute it slowed down
        overlap = max(0.0, overlap - float(result.slowed[mine].sum()))
    hidden = overlap / moved if moved > 0 else math.nan
    mean = sum(compute) / ranks
    return {"compute_s": compute[crit], "comm_s": result.end_time.get(crit, 0.0) - compute[crit],
            "comm_hidden_frac": hidden, "imbalance": max(compute) / mean if mean > 0 else 1.0,
            "comm_under_compute_frac": under / moved if moved > 0 else math.nan}


def result_numbers(sched: Schedule, result: SimResult) -> dict[str, Any]:
    """What a decode row takes from one simulated schedule: latency_s, compute_s and comm_s (the critical rank's,
    :meth:`SimResult.critical_split`), bytes_moved and the per-rank memory ``peaks``."""
    with gc_paused():  # millions of live ops and records: a collection would walk them all for nothing
        peaks = timeline_peaks(sched, result)
        compute_s, comm_s = result.critical_split()
        moved = result.bytes_sent()
    return {"latency_s": result.makespan, "compute_s": compute_s, "comm_s": comm_s, "bytes_moved": moved,
            "peaks": peaks}
