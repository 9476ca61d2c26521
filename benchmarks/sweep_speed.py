"""Wall time of a 1,000-point sweep (P <= 128), or of the 10,000-point one, on the local process pool or Dask.

    python benchmarks/sweep_speed.py [--jobs 2] [--scenario 1000|10000|FILE] [--report] [--executor process|dask]

Runs ``treering run benchmarks/sweep-1000.yaml --jobs N --no-report`` (``--scenario 10000``:
``benchmarks/sweep-10000.yaml``; ``--report``: with its report; ``--executor dask``: on a local Dask cluster of
N workers) and prints wall seconds, points/s, the peak RSS of the largest process (the run's own or one of its
workers) and the slowest points (from the rows' own ``sim_wall_s``).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
SCENARIOS = {"1000": HERE / "sweep-1000.yaml", "10000": HERE / "sweep-10000.yaml"}


def command(scenario: Path, out: str, jobs: int, report: bool, executor: str) -> list[str]:
    """The ``treering run`` command line the benchmark times."""
    return [sys.executable, "-m", "simulator.cli", "run", str(scenario), "-o", out, "--jobs", str(jobs),
            *([] if executor == "process" else ["--executor", executor]), *([] if report else ["--no-report"])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--scenario", default="1000", help="1000, 10000 or a scenario file (default: 1000)")
    ap.add_argument("--report", action="store_true", help="write the report too (default: --no-report)")
    ap.add_argument("--executor", choices=("process", "dask"), default="process")
    args = ap.parse_args()
    scenario = SCENARIOS.get(args.scenario, Path(args.scenario))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        code = subprocess.run(command(scenario, tmp, args.jobs, args.report, args.executor),
                              stdout=subprocess.DEVNULL).returncode
        if code:  # (treering said why, in one line)
            raise SystemExit(code)
        wall = time.perf_counter() - t0
        # the largest resident set of any process of the run (ru_maxrss: KiB on Linux, bytes on macOS)
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        df = pd.read_csv(Path(tmp) / "results.csv")
        reported = (Path(tmp) / "report.md").is_file()
    points = df["point"].nunique()
    print(f"{scenario.name}: {points} points ({len(df)} rows), --jobs {args.jobs}, {args.executor}"
          f"{', with its report' if reported else ''}: {wall:.1f} s wall, {points / wall:.1f} points/s, "
          f"peak RSS {peak / 2**20:.0f} MiB")
    by_algo = df.groupby("algorithm")["sim_wall_s"].agg(["sum", "max"])
    print("simulation seconds by algorithm (sum over points, slowest point):")
    print(by_algo.to_string(float_format=lambda x: f"{x:.2f}"))


if __name__ == "__main__":
    main()
