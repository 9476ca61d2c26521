"""The floor of a real run: how far identical runs of the same schedule, in the same invocation, differ.

A prediction can be no closer to a measurement than the measurement is to itself. ``treering validate`` times each
point and algorithm ``--iters`` times; the iterations are identical runs, one after another. :func:`timing` splits
them into their first and second halves, two identical runs of ``iters / 2`` iterations each, and gives
``floor_pct``, the difference of the halves' medians over the median of all of them (the error one run's median
would have as the prediction of the other's). It is a lower bound on the noise: runs minutes apart add the
machine's drift (``benchmarks/validate_floor.py`` compares whole invocations). :func:`floor_lines` puts every error
beside it: the median |error| in multiples of the median floor, and the target of docs/validation.md,
median |error| <= max(10 %, 1.5 x floor). Pure: the standard library and pandas.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import pandas as pd

__all__ = ["FLOOR_COLUMN", "MIN_FLOOR_ITERS", "TARGET_FLOOR_MULTIPLE", "TARGET_PCT", "compared", "floor_lines",
           "timing"]

FLOOR_COLUMN = "floor_pct"
MIN_FLOOR_ITERS = 4  # two halves of at least two iterations each
TARGET_PCT = 10.0  # docs/validation.md: median |error| at most max(10 %, 1.5 x the floor)
TARGET_FLOOR_MULTIPLE = 1.5


def timing(times: Sequence[float]) -> dict[str, float]:
    """``measured_s`` (the median iteration), its quartiles and ``floor_pct`` (NaN under
    :data:`MIN_FLOOR_ITERS` iterations) of one point's timed iterations, in the order they ran."""
    if not times:
        raise ValueError("no timed iterations")
    measured = statistics.median(times)
    q1, _, q3 = statistics.quantiles(times, n=4) if len(times) > 1 else (measured,) * 3
    floor = math.nan
    if len(times) >= MIN_FLOOR_ITERS and measured > 0:
        half = len(times) // 2
        first, second = statistics.median(times[:half]), statistics.median(times[half:])
        floor = 100.0 * abs(first - second) / measured
    return {"measured_s": measured, "measured_q1_s": q1, "measured_q3_s": q3, FLOOR_COLUMN: floor}


def compared(stats: dict[str, float], predicted: float) -> dict[str, float]:
    """A row's ``measured_s`` (from :func:`timing`'s ``stats``), ``predicted_s`` and ``error_pct`` (of the
    prediction against the measurement)."""
    measured = stats["measured_s"]
    return {"measured_s": measured, "predicted_s": predicted, "error_pct": 100 * (predicted - measured) / measured}


def floor_lines(frame: pd.DataFrame) -> list[str]:
    """The summary's lines on the floor: its median and 90th percentile, the median |error| in multiples of it,
    the rows whose |error| is within 1.5 x their own floor, and the target met or not. Nothing without floors."""
    if FLOOR_COLUMN not in frame or frame[FLOOR_COLUMN].isna().all():
        return [f"- floor of identical runs: not measured (it needs --iters >= {MIN_FLOOR_ITERS})"]
    rows = frame.dropna(subset=[FLOOR_COLUMN])
    floor, err = rows[FLOOR_COLUMN], rows["error_pct"].abs()
    med_floor, med_err = float(floor.median()), float(err.median())
    within = int((err <= TARGET_FLOOR_MULTIPLE * floor).sum())
    multiple = f"{med_err / med_floor:.1f} x the floor" if med_floor > 0 else "the floor is 0"
    target = max(TARGET_PCT, TARGET_FLOOR_MULTIPLE * med_floor)
    verdict = "met" if med_err <= target else "not met"
    return [f"- floor of identical runs (the two halves of each point's timed iterations): median {med_floor:.1f} %, "
            f"90th percentile {float(floor.quantile(0.9)):.1f} %; median |error| {med_err:.1f} % = {multiple}; "
            f"|error| within {TARGET_FLOOR_MULTIPLE:g} x its own row's floor at {within} of {len(rows)}",
            f"- target median |error| <= max({TARGET_PCT:g} %, {TARGET_FLOOR_MULTIPLE:g} x floor) = {target:.1f} %: "
            f"{verdict}"]
