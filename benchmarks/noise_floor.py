"""Noise floor of a kernel calibration on this machine: the same profiled points, re-timed round after round.

    python benchmarks/noise_floor.py [--seconds 150]

Each round times five fixed points exactly as ``treering calibrate`` profiles them (rank 0's thread CPU time, a
copy of the same call loading the host's other core, repeated until the 95 % confidence interval of the median is
within 3 % or the point's budget is spent: :func:`simulator.distributed.profile_kernels.profile_kernel`). Every
round's median is thus one calibration's figure for that point. The spread of those figures over a few minutes is
how far a prediction made from one calibration can be from a measurement made minutes later, whatever the model:
the floor under ``treering validate``'s errors. Prints each point's median over the rounds, the 10th and 90th
percentiles relative to it, the share of rounds within 10 % of it, and the standard deviation of the log times.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from simulator.distributed.host_load import HostLoad
from simulator.distributed.profile_kernels import ProfileOptions, profile_kernel

POINTS: tuple[tuple[str, str, tuple[float, ...]], ...] = (
    ("attend", "fp32", (2.0**24, 128.0, 4.0)),  # kv_bytes, head_dim, group
    ("attend", "fp32", (2.0**26, 128.0, 4.0)),
    ("attend", "bf16", (2.0**24, 128.0, 4.0)),
    ("attn-fwd", "fp64", (1024.0, 512.0, 128.0, 1.0)),  # row_heads, span, head_dim, density
    ("merge", "fp32", (65536.0,)),  # elems
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=150.0, help="how long to keep re-timing (default 150)")
    args = ap.parse_args()
    if not args.seconds > 0:
        ap.error(f"argument --seconds: must be positive, got {args.seconds:g}")
    torch.set_num_threads(1)
    device = torch.device("cpu")
    times: dict[int, list[float]] = {i: [] for i in range(len(POINTS))}
    end = time.monotonic() + args.seconds
    with HostLoad(2) as load:
        while time.monotonic() < end:
            for i, (kernel, dtype, point) in enumerate(POINTS):
                grid = tuple((x,) for x in point)
                times[i].append(profile_kernel(kernel, dtype, device, grid, ProfileOptions(), load).seconds[0])
    print(f"{len(times[0])} rounds in {args.seconds:g} s")
    print("| kernel | dtype | point | median ms | p10 / median | p90 / median | within 10 % | sd(log) |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (kernel, dtype, point) in enumerate(POINTS):
        xs = times[i]
        med = statistics.median(xs)
        p10, *_, p90 = statistics.quantiles(xs, n=10)
        within = sum(abs(x / med - 1) <= 0.10 for x in xs) / len(xs)
        sd = statistics.pstdev([math.log(x) for x in xs])
        where = ", ".join(f"{x:g}" for x in point)
        print(f"| {kernel} | {dtype} | {where} | {med * 1e3:.3f} | {p10 / med:.2f} | {p90 / med:.2f} | {within:.0%} | "
              f"{sd:.3f} |")


if __name__ == "__main__":
    main()
