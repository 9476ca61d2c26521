"""The floor a calibration puts under ``treering validate``'s errors: calibrations of one machine, point by point.

    treering calibrate --procs 2 -o out/cal-a.yaml   (then -o out/cal-b.yaml, ...)
    python benchmarks/calibration_floor.py out/cal-a.yaml out/cal-b.yaml [...]

A prediction is only as stable as the kernel profiles it reads: where two calibrations of the same machine, minutes
apart, time the same grid point differently, a model calibrated by either predicts the same run differently. For
every pair of topologies (A, B) and every kernel profile both hold (same kernel, dtype and grid), the times' ratios
B / A over the grid points: their median (the profile's level moved), the median and 90th percentile of |B / A - 1|
(as a prediction error would read it), and the median distance from the level (how much of the move is not one
factor for the whole profile). The last lines pool every profile's points: the big kernels (those a schedule's time
is mostly made of: ``attend``, ``attn-fwd``, ``attn-bwd``), then all.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
from pathlib import Path

from simulator.cluster.topology import load_topology
from simulator.errors import InputError
from simulator.kernels.profiles import KernelProfile

BIG = ("attend", "attn-fwd", "attn-bwd")


def _profiles(path: str) -> dict[tuple[str, str], KernelProfile]:
    try:
        cluster = load_topology(path)
    except (InputError, OSError) as err:
        raise SystemExit(f"{path}: {err}") from None
    kernels = cluster.specs[cluster.ranks[0]].kernels
    if not kernels:
        raise SystemExit(f"{path}: no kernel profiles (kernels:) in this topology")
    return dict(kernels)


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _row(name: str, logs: list[float]) -> str:
    level = statistics.median(logs)
    off = [math.exp(abs(x)) - 1 for x in logs]
    p90 = statistics.quantiles(off, n=10)[8] if len(off) > 1 else off[0]
    around = math.exp(statistics.median(abs(x - level) for x in logs)) - 1
    return (f"| {name} | {len(logs)} | {math.exp(level):.3f} | {_pct(statistics.median(off))} | {_pct(p90)} "
            f"| {_pct(around)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("topologies", nargs="+", help="topology YAML files written by treering calibrate")
    args = ap.parse_args()
    if len(args.topologies) < 2:
        ap.error("needs at least two calibrations")
    cals = [(Path(p).name, _profiles(p)) for p in args.topologies]
    print("| profile | points | level (median B / A) | median |B / A - 1| | p90 | median distance from the level |")
    print("|---|---|---|---|---|---|")
    pooled: dict[str, list[float]] = {"big kernels": [], "all": []}
    for (na, a), (nb, b) in itertools.combinations(cals, 2):
        for key in sorted(a.keys() & b.keys()):
            pa, pb = a[key], b[key]
            if pa.grid != pb.grid:
                print(f"| {na} -> {nb}: {key[0]} {key[1]} | grids differ: skipped | | | | |")
                continue
            logs = [math.log(y / x) for x, y in zip(pa.seconds, pb.seconds, strict=True)]
            print(_row(f"{na} -> {nb}: {key[0]} {key[1]}", logs))
            pooled["all"] += logs
            if key[0] in BIG:
                pooled["big kernels"] += logs
    for name, logs in pooled.items():
        if logs:
            print(_row(f"every pair, {name}", logs))


if __name__ == "__main__":
    main()
