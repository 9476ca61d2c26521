"""Wall time of a 1,000-point sweep (P <= 128) with the local process pool.

    python benchmarks/sweep_speed.py [--jobs 2]

Runs ``treering run benchmarks/sweep-1000.yaml --jobs N --no-report`` and prints wall seconds, points/s and the
slowest points (from the rows' own ``sim_wall_s``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "simulator.cli", "run", str(HERE / "sweep-1000.yaml"), "-o", tmp,
                        "--jobs", str(args.jobs), "--no-report"], check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        df = pd.read_csv(Path(tmp) / "results.csv")
    points = df["point"].nunique()
    print(f"{points} points ({len(df)} rows), --jobs {args.jobs}: {wall:.1f} s wall, {points / wall:.1f} points/s")
    by_algo = df.groupby("algorithm")["sim_wall_s"].agg(["sum", "max"])
    print("simulation seconds by algorithm (sum over points, slowest point):")
    print(by_algo.to_string(float_format=lambda x: f"{x:.2f}"))


if __name__ == "__main__":
    main()
