"""Cold start: the quickstart's first ``treering run`` in a fresh copy of the source (no compiled code cached).

    python benchmarks/cold_start.py [--repeat 3] [--compare REV] [--rev REV] [-- RUN ARGS...]

Each run copies the package into a new temporary folder, as a fresh clone has it (the working tree's files, edits
included, that git tracks or does not ignore; or, with ``--rev``, a commit's, by ``git archive``), with no
``__pycache__`` and so no numba cache, and times ``python -m simulator.cli run -o TMP`` there (the quickstart,
``--jobs`` the CPUs) with this interpreter and its packages (``NUMBA_CACHE_DIR`` unset: numba caches beside the
copy's modules). Per run: wall seconds, the CPU seconds of the run and every process it waited for (user + system,
less sensitive than wall to other work on the machine), when its first line came on stderr, and whether it said it
was compiling. Then the same command again in the same copy (the compiled code cached). ``--compare REV`` alternates
runs of commit REV and of the working tree and prints the ratios of the medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 30.0  # issue 41: a fresh install's first run returns within this


@dataclass
class Timing:
    wall: float
    cpu: float
    first_line: float  # seconds to the first line on stderr (inf: none)
    said_compiling: bool
    warm_wall: float
    warm_cpu: float


def _copy_tree(dest: Path, rev: str | None) -> None:
    """The source as a fresh clone has it: a commit's files, or the working tree's (tracked or not ignored)."""
    dest.mkdir(parents=True)
    if rev is not None:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in files:
        src = REPO / name
        if not name or "__pycache__" in Path(name).parts or not src.is_file():
            continue  # (a tracked file deleted in the working tree)
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / name)


def _run(cwd: Path, argv: list[str], env: dict[str, str]) -> tuple[float, float, float, str]:
    """(wall s, CPU s of the process and the processes it waited for, s to the first stderr line, stderr)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "simulator.cli", *argv], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = [float("inf")]
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if not lines:
                first[0] = time.perf_counter() - t0
            lines.append(line)

    reader = threading.Thread(target=read)
    reader.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join()
    err = "".join(lines)
    if proc.returncode != 0:
        raise SystemExit(f"treering {' '.join(argv)} exited {proc.returncode} in {cwd}:\n{err}")
    return wall, usage.ru_utime + usage.ru_stime, first[0], err


def cold_start(rev: str | None, run_args: list[str], verbose: bool) -> Timing:
    with tempfile.TemporaryDirectory(prefix="treering-cold-") as tmp:
        src = Path(tmp) / "treering"
        _copy_tree(src, rev)
        env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}
        env["PYTHONPATH"] = str(src)
        where = subprocess.run([sys.executable, "-c", "import simulator; print(simulator.__file__)"], cwd=src,
                               env=env, check=True, capture_output=True, text=True).stdout.strip()
        if not Path(where).resolve().is_relative_to(src.resolve()):
            raise SystemExit(f"the copy's package is not the one imported ({where})")
        argv = ["run", "-o", str(Path(tmp) / "out"), *run_args]
        wall, cpu, first, err = _run(src, argv, env)
        if verbose:
            sys.stderr.write("".join(f"    | {line}" for line in err.splitlines(keepends=True)))
        shutil.rmtree(Path(tmp) / "out")
        warm_wall, warm_cpu, _, _ = _run(src, argv, env)
        return Timing(wall, cpu, first, "compiling" in err, warm_wall, warm_cpu)


def _line(label: str, t: Timing) -> str:
    return (f"{label:>14}: cold {t.wall:6.1f} s wall {t.cpu:6.1f} s CPU, first stderr line at {t.first_line:5.1f} s"
            f"{' (says it compiles)' if t.said_compiling else ''}; then warm {t.warm_wall:5.1f} s wall "
            f"{t.warm_cpu:5.1f} s CPU")


def _summary(label: str, runs: list[Timing]) -> dict[str, float]:
    med = {key: statistics.median(getattr(t, key) for t in runs)
           for key in ("wall", "cpu", "first_line", "warm_wall", "warm_cpu")}
    print(f"{label}: median of {len(runs)}: cold {med['wall']:.1f} s wall, {med['cpu']:.1f} s CPU, first stderr line "
          f"at {med['first_line']:.1f} s; warm {med['warm_wall']:.1f} s wall, {med['warm_cpu']:.1f} s CPU"
          f"{'' if med['wall'] <= TARGET_S else f'  (over the {TARGET_S:g} s target)'}")
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="cold runs of each tree (default 3)")
    ap.add_argument("--rev", default=None, help="time this commit instead of the working tree")
    ap.add_argument("--compare", default=None, metavar="REV", help="alternate with runs of commit REV (before)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each cold run's stderr")
    ap.add_argument("run_args", nargs="*", help="more arguments of treering run (after --)")
    args = ap.parse_args()
    trees = ([(f"{args.compare} (before)", args.compare)] if args.compare else []) + \
        [(args.rev or "working tree", args.rev)]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; treering run {' '.join(args.run_args)}".rstrip())
    runs: dict[str, list[Timing]] = {label: [] for label, _ in trees}
    for i in range(args.repeat):
        for label, rev in trees:
            t = cold_start(rev, args.run_args, args.verbose)
            runs[label].append(t)
            print(_line(f"{label} #{i + 1}", t), flush=True)
    meds = {label: _summary(label, r) for label, r in runs.items()}
    if args.compare:
        before, after = (meds[label] for label, _ in trees)
        print(f"after / before: cold wall {after['wall'] / before['wall']:.2f}x, CPU "
              f"{after['cpu'] / before['cpu']:.2f}x ({before['wall'] / after['wall']:.1f} times faster)")


if __name__ == "__main__":
    main()
