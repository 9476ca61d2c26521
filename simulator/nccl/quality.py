"""The quality of a fit of :mod:`simulator.nccl.fit`: measured against fitted per size, the scores, the refusal of a
poor fit, and the split of a log into the sizes fitted and the sizes held out (the check on data not fitted)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.cluster.topology import Cluster
from simulator.collectives.standalone import bus_factor
from simulator.errors import InputError
from simulator.nccl.fit import Sample, simulated
from simulator.nccl.validate import OPERATIONS

__all__ = ["HOLD_OUT", "MAX_MEDIAN_ERROR_PCT", "MIN_R2", "check_fit", "quality", "scores", "split"]

MAX_MEDIAN_ERROR_PCT = 15.0  # a fit whose median |busbw error| exceeds this is refused
MIN_R2 = 0.95  # ... or whose R^2 of log time is below this
HOLD_OUT = "every-other"


def quality(cluster: Cluster, samples: Sequence[Sample], part: str) -> pd.DataFrame:
    """Measured against the fitted topology's engine, per sample: busbw (GB/s), time, error (%)."""
    times, chosen = simulated(cluster, samples)
    rows = []
    for s, t, c in zip(samples, times, chosen, strict=True):
        factor = bus_factor(s.operation, s.ranks) * s.nbytes / 1e9
        measured, fitted = factor / s.time_s, factor / t
        rows.append({"log": Path(s.log).name, "collective": s.operation, "ranks": s.ranks, "bytes": s.nbytes,
                     "part": part,
                     "measured_time_s": s.time_s, "fitted_time_s": float(t), "measured_busbw_GBps": measured,
                     "fitted_busbw_GBps": fitted, "error_pct": 100.0 * (fitted - measured) / measured,
                     "chosen": c})
    return pd.DataFrame(rows)


def scores(frame: pd.DataFrame) -> dict[str, float]:
    """Median and max |error| of the bus bandwidth (%), and R^2 of log time."""
    err = frame["error_pct"].abs()
    lm, lf = np.log(frame["measured_time_s"].to_numpy()), np.log(frame["fitted_time_s"].to_numpy())
    total = float(np.sum((lm - lm.mean()) ** 2))
    r2 = 1.0 - float(np.sum((lm - lf) ** 2)) / total if total > 0 else math.nan
    return {"median": float(statistics.median(err)), "max": float(err.max()), "r2": r2, "sizes": float(len(frame))}


def check_fit(frame: pd.DataFrame, where: Sample) -> dict[str, float]:
    """:func:`scores`, or an :class:`InputError` when the fit leaves too large a residual."""
    sc = scores(frame)
    if sc["median"] > MAX_MEDIAN_ERROR_PCT or not sc["r2"] >= MIN_R2:
        raise InputError(f"the fit leaves a large residual: median |error| of the bus bandwidth {sc['median']:.1f} % "
                         f"(at most {MAX_MEDIAN_ERROR_PCT:g} % accepted), max {sc['max']:.1f} %, R^2 of log time "
                         f"{sc['r2']:.3f} (at least {MIN_R2:g}): the topology's mechanism does not describe this log; "
                         f"nothing written", file=where.log, line=where.line, field="--from-nccl-tests")
    return sc


def split(samples: Sequence[Sample], hold_out: str) -> tuple[list[Sample], list[Sample]]:
    """(fitted, held out): ``every-other`` size of each run held out, a collective's sizes, or ``none``."""
    if hold_out == "none":
        return list(samples), []
    if hold_out == HOLD_OUT:
        by_run: dict[tuple[str, str], list[Sample]] = {}
        for s in samples:
            by_run.setdefault((s.log, s.operation), []).append(s)
        fit, held = [], []
        for group in by_run.values():
            ordered = sorted(group, key=lambda s: s.nbytes)
            fit += ordered[::2]
            held += ordered[1::2]
        return fit, held
    if hold_out not in OPERATIONS:
        raise InputError(f"must be {HOLD_OUT}, none or a collective ({', '.join(OPERATIONS)}), got {hold_out!r}",
                         field="--hold-out")
    held = [s for s in samples if s.operation == hold_out]
    if not held:
        raise InputError(f"the logs have no {hold_out} run to hold out", field="--hold-out")
    return [s for s in samples if s.operation != hold_out], held
