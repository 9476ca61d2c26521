"""How fast the light verbs answer: ``treering --help``, ``topo list`` and ``schema`` (issue 41: <= 0.3 s each).

    python benchmarks/cli_speed.py [--repeat 7]

Each command runs in a fresh interpreter (``python -m simulator.cli ...``, as the ``treering`` script runs it); per
command: the median wall seconds and the median CPU seconds (user + system) of the process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = (["--help"], ["topo", "list"], ["schema"])
TARGET_S = 0.3


def _once(argv: list[str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "simulator.cli", *argv], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"treering {' '.join(argv)} failed")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    _once(["--help"])  # the interpreter's files in the page cache
    for argv in COMMANDS:
        runs = [_once(argv) for _ in range(args.repeat)]
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        flag = "" if wall <= TARGET_S else f"  (over the {TARGET_S:g} s target)"
        print(f"treering {' '.join(argv):<10} median of {args.repeat}: {wall:.3f} s wall, {cpu:.3f} s CPU{flag}")


if __name__ == "__main__":
    main()
