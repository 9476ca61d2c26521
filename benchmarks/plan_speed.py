"""How fast plans answer (issue 41: the two plans below <= 5 s each, the worst shipped plan search <= 20 s).

    python benchmarks/plan_speed.py [--repeat 3] [--worst] [--before /path/to/an/older/checkout]

Each plan runs in a fresh interpreter (``python -m simulator.cli plan ...``, as the ``treering`` script runs it), from
the repository root; per plan: the median wall and CPU seconds (user + system) of the process, and the plan's own
count of the configurations it simulated. ``--worst`` adds the exhaustive tree-p2p search of docs/planning.md
(``--tbt 10ms`` at 4M tokens: latencies that are not monotone in the node count). ``--before DIR`` runs each plan
from an older checkout too (its ``simulator``, ``scenarios`` and ``topologies``), alternating with this
checkout's run, and checks that both print the same rows (the count line aside).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLANS = {
    "decode 70B 1M 30ms": ["plan", "--model", "llama-3.1-70b", "--context", "1M", "--tbt", "30ms"],
    "ttft 256K 5s/20ms": ["plan", "scenarios/plan-ttft.yaml", "--ttft", "5s", "--tbt", "20ms", "--max-nodes", "16"],
}
WORST = {"decode 70B 4M 10ms": ["plan", "--model", "llama-3.1-70b", "--context", "4M", "--tbt", "10ms",
                                "--algorithms", "tree,tree-p2p"]}
TARGETS = {"decode 70B 1M 30ms": 5.0, "ttft 256K 5s/20ms": 5.0, "decode 70B 4M 10ms": 20.0}


def _once(argv: list[str], path: str | None) -> tuple[float, float, list[str]]:
    """(wall s, CPU s, the lines printed) of one plan in a fresh interpreter, run from ``path`` (another
    checkout, with its scenarios) or this one (``python -m`` imports the package of the folder it runs in)."""
    where = path or str(ROOT)
    env = dict(os.environ, PYTHONPATH=where)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "simulator.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, cwd=where, env=env, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"treering {' '.join(argv)} failed")
    return wall, usage.ru_utime + usage.ru_stime, out.splitlines()


def _rows(lines: list[str]) -> list[str]:
    """The plan's answer without its count line (what --before compares)."""
    return [line for line in lines if not (line.startswith("(") and "configurations" in line)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--worst", action="store_true", help="add the exhaustive tree-p2p search (minutes before)")
    ap.add_argument("--before", help="an older checkout to time alternately (its PYTHONPATH)")
    args = ap.parse_args()
    plans = {**PLANS, **(WORST if args.worst else {})}
    for name, argv in plans.items():
        runs: dict[str, list[tuple[float, float, list[str]]]] = {"after": []}
        if args.before:
            runs["before"] = []
        for _ in range(args.repeat):  # alternated: the machine's load falls on both alike
            for which in runs:
                runs[which].append(_once(argv, args.before if which == "before" else None))
        for which, got in runs.items():
            wall = statistics.median(w for w, _, _ in got)
            cpu = statistics.median(c for _, c, _ in got)
            count = next((line for line in got[-1][2] if line.startswith("(") and "configurations" in line), "")
            flag = "" if which == "before" or wall <= TARGETS[name] else f"  (over the {TARGETS[name]:g} s target)"
            label = f"{name} ({which})" if args.before else name
            print(f"{label:<32} median of {args.repeat}: {wall:6.2f} s wall, {cpu:6.2f} s CPU {count}{flag}")
        if args.before and _rows(runs["before"][-1][2]) != _rows(runs["after"][-1][2]):
            print(f"{name}: the rows differ from --before's")
            sys.exit(1)


if __name__ == "__main__":
    main()
