"""Predict a ``treering validate --random`` round's decode rows again: on another topology (a later calibration, or
one with a profile changed), and with every kernel profile scaled by the row's ``drift`` (the machine's speed right
before the row's runs, now / calibrated). What part of a round's error a calibration, or the machine's own move,
accounts for, on the same measurements.

    python benchmarks/repredict.py TOPOLOGY ROUND_DIR [ROUND_DIR ...] [--rows]

Per group (all, each round, each algorithm, each dtype): the median and 90th percentile |error| as re-predicted on
TOPOLOGY, and with the kernels scaled by drift, and the signed medians. ``--rows`` prints every row. Where TOPOLOGY is
the round's own, the re-prediction is the round's ``predicted_s`` (the ``same`` column says how close).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import NoReturn

import numpy as np
import pandas as pd

from simulator.algorithms import Layout, build_schedule, resolve
from simulator.cluster.topology import Cluster, load_topology
from simulator.engine.core import simulate
from simulator.errors import InputError
from simulator.workloads.shape import DecodeShape

NEEDS = ["algorithm", "ranks", "context", "measured_s", "predicted_s", "drift", "random.batch", "random.heads",
         "random.kv_heads", "random.head_dim", "random.dtype"]


def scaled(cluster: Cluster, factor: float) -> Cluster:
    """``cluster`` with every device's kernel profiles' times multiplied by ``factor``."""
    specs = {node: None if spec is None else dataclasses.replace(spec, kernels={
        key: dataclasses.replace(p, seconds=tuple(s * factor for s in p.seconds)) for key, p in spec.kernels.items()})
        for node, spec in cluster.specs.items()}
    return dataclasses.replace(cluster, specs=specs)


def _refuse(message: str) -> NoReturn:
    print(f"repredict: {message}", file=sys.stderr)
    raise SystemExit(2)


def repredict(topology: Cluster, round_dir: Path) -> pd.DataFrame:
    path = round_dir / "validation.csv"
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:  # missing, unreadable, not a CSV
        _refuse(f"{path}: cannot read it ({exc.__class__.__name__}: {exc})")
    missing = [c for c in NEEDS if c not in frame]
    if missing:
        _refuse(f"{path}: column {missing[0]!r} missing: not a decode round of validate --random")
    out = []
    for _, r in frame.iterrows():
        shape = DecodeShape(batch=int(r["random.batch"]), heads=int(r["random.heads"]),
                            kv_heads=int(r["random.kv_heads"]), head_dim=int(r["random.head_dim"]),
                            context=int(r["context"]), dtype=str(r["random.dtype"]))
        name, params = resolve(str(r["algorithm"]))
        sched = build_schedule(name, params, shape, Layout(tuple(0 for _ in range(int(r["ranks"])))))
        again = simulate(sched, topology).makespan
        drift = float(r["drift"]) if pd.notna(r["drift"]) else 1.0
        moved = simulate(sched, scaled(topology, drift)).makespan
        measured = float(r["measured_s"])
        out.append({"round": round_dir.name, "algorithm": r["algorithm"], "dtype": shape.dtype,
                    "measured_ms": 1e3 * measured, "drift": drift, "error_pct": 100 * (again - measured) / measured,
                    "error_drift_pct": 100 * (moved - measured) / measured,
                    "same": abs(again - float(r["predicted_s"])) / again})
    return pd.DataFrame(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("topology")
    ap.add_argument("rounds", nargs="+", type=Path)
    ap.add_argument("--rows", action="store_true", help="print every row")
    args = ap.parse_args()
    try:
        topology = load_topology(args.topology)
    except InputError as exc:
        _refuse(str(exc))
    rows = pd.concat([repredict(topology, d) for d in args.rounds], ignore_index=True)
    if args.rows:
        print(rows.round(3).to_string(index=False))
    print(f"re-predicted on {args.topology}: the round's own predicted_s within {rows['same'].max():.1e} relative"
          if rows["same"].max() < 1e-9 else f"re-predicted on {args.topology} (not the rounds' own calibration)")
    groups = [("all", rows), *rows.groupby("round"), *rows.groupby("algorithm"), *rows.groupby("dtype")]
    for label, g in groups:
        a, b = g["error_pct"].abs(), g["error_drift_pct"].abs()
        print(f"{label}: {len(g)} rows; median / p90 |error| {a.median():.1f} / {np.percentile(a, 90):.1f} %, "
              f"kernels scaled by drift {b.median():.1f} / {np.percentile(b, 90):.1f} %; signed median "
              f"{g['error_pct'].median():+.1f} / {g['error_drift_pct'].median():+.1f} %")


if __name__ == "__main__":
    main()
