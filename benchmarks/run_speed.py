"""How fast default runs return, their report included (issue 41, target 3): the quickstart warm <= 1.5 s; ring
decode on 1,024 GPUs at 5.12M tokens and tree decode on 16,384 GPUs each <= 2.5 s and <= 1 GB.

    python benchmarks/run_speed.py [--repeat 3] [--cases quickstart ring-1024 tree-16384]

Each case is ``treering run`` in a fresh interpreter (``python -m simulator.cli run ... -o DIR --force``, as the
``treering`` script runs it; the compiled engine already in numba's cache: one run first, not counted), report on.
Per case: the median wall seconds, the median CPU seconds (user + system, of the run and the processes it waited
for: its pool workers, its figure drawer) and the largest peak RSS of one process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RING = str(ROOT / "benchmarks" / "ring-1024.yaml")
CASES: dict[str, tuple[list[str], float]] = {  # the run's arguments, the wall-time target (s)
    "quickstart": ([], 1.5),
    "ring-1024": ([RING], 2.5),
    "tree-16384": ([RING, "--set", "algorithms=[tree]", "--set", "topology_params.nodes=2048"], 2.5),
}
MEMORY_TARGET_MB = 1000.0


def _once(argv: list[str], out: str) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "simulator.cli", "run", *argv, "-o", out, "--force"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"treering run {' '.join(argv)} failed")
    # wait4's accounting: the run's CPU with that of the processes it reaped (pool workers, its figure drawer), and
    # the largest peak of one of them
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases:
            argv, target = CASES[name]
            out = str(Path(tmp) / name)
            _once(argv, out)  # the compiled engine in the cache, the files in the page cache
            runs = [_once(argv, out) for _ in range(args.repeat)]
            wall = statistics.median(w for w, _, _ in runs)
            cpu = statistics.median(c for _, c, _ in runs)
            peak = max(m for _, _, m in runs)
            over = ([f"over the {target:g} s target"] if wall > target else []) + \
                ([f"over {MEMORY_TARGET_MB:g} MB"] if peak > MEMORY_TARGET_MB else [])
            flag = f"  ({'; '.join(over)})" if over else ""
            print(f"treering run {name:<11} median of {args.repeat}: {wall:.2f} s wall, {cpu:.2f} s CPU, "
                  f"peak {peak:.0f} MB{flag}")


if __name__ == "__main__":
    main()
