"""The floor under ``treering validate``'s errors: identical validate runs, each one's measurements taken as the
prediction of another's.

    treering validate SCENARIO --random 12 --seed S --procs 2 --topology T -o out/floor-a   (then -o out/floor-b, ...)
    python benchmarks/validate_floor.py out/floor-a out/floor-b out/floor-c

No model can predict a run closer than the runs agree with each other. For every ordered pair of runs (A, B), the
rows' |A - B| / B (the error of "predicting" B by A's measurement), how often A's fastest algorithm at a point is
B's (or B's quartiles overlap: a measured tie, as ``validate`` counts it) and the model's own median and 90th
percentile |error| on B; then over all pairs, and what an ideal predictor (each row's expected time) would score if
the runs' noise is independent and of one size: the pairs' figures over sqrt 2.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import pandas as pd

KEY = ["algorithm", "context", "random.batch", "random.heads", "random.kv_heads", "random.head_dim", "random.dtype"]


def _load(folder: str) -> pd.DataFrame:
    frame = pd.read_csv(Path(folder) / "validation.csv")
    missing = [c for c in (*KEY, "measured_s", "measured_q1_s", "measured_q3_s", "error_pct") if c not in frame]
    if missing:
        raise SystemExit(f"{folder}/validation.csv: not a validate --random result (no column {missing[0]!r})")
    return frame.set_index(KEY)


def _faster(pred: pd.DataFrame, meas: pd.DataFrame) -> tuple[int, int, int]:
    """(points where pred's fastest algorithm is meas's, more where meas's quartiles overlap them, points)."""
    right = ties = points = 0
    for _, group in meas.groupby(level=KEY[1:]):
        a, b = pred.loc[group.index].measured_s.idxmin(), group.measured_s.idxmin()
        points += 1
        if a == b:
            right += 1
        elif not group.measured_q1_s[a] > group.measured_q3_s[b]:
            ties += 1
    return right, ties, points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="validate output folders of the same command")
    args = ap.parse_args()
    if len(args.runs) < 2:
        ap.error("needs at least two runs")
    runs = [_load(f) for f in args.runs]
    if any(set(r.index) != set(runs[0].index) for r in runs):
        raise SystemExit("the runs hold different rows: not the same validate command (seed, algorithms, procs)")
    print("| predicted from | measured | median |error| | p90 | faster right (or tie) | model's median / p90 on it |")
    print("|---|---|---|---|---|---|")
    pairs = []
    for i, j in itertools.permutations(range(len(runs)), 2):
        a, b = runs[i], runs[j].loc[runs[i].index]
        err = (100 * (a.measured_s - b.measured_s) / b.measured_s).abs()
        pairs.append(err)
        right, ties, points = _faster(a, b)
        model = b.error_pct.abs()
        print(f"| {args.runs[i]} | {args.runs[j]} | {err.median():.1f} % | {err.quantile(0.9):.1f} % | {right} "
              f"({right + ties}) of {points} | {model.median():.1f} % / {model.quantile(0.9):.1f} % |")
    every = pd.concat(pairs)
    print(f"\nall pairs ({len(every)} rows): median |error| {every.median():.1f} %, p90 {every.quantile(0.9):.1f} %; "
          f"an ideal predictor (/ sqrt 2): median {every.median() / 2 ** 0.5:.1f} %, p90 "
          f"{every.quantile(0.9) / 2 ** 0.5:.1f} %")


if __name__ == "__main__":
    main()
