"""Variability's speed: trials of one decode schedule (simulator.engine.trials), the schedule built once.

    python benchmarks/variability_speed.py [--nodes 32] [--trials 100] [--algorithm ring] [--cv 0.05]

Ring decode (16 heads x 128, bf16, b = 1, 1M-token context) on ``--nodes`` DGX H100 servers (32: P = 256), the
issue's case: ``--trials`` trials with kernel and link CVs of ``--cv``. Prints the schedule's ops, the seconds to
build it, one plain simulation, and the trials (columns built once, then one compiled run per trial), and the
trials' p50 / p99 against the plain latency. The target: 100 trials at P = 256 in under 10 s on 2 cores. The
compiled engine is loaded first (its one-time compilation is not timed).
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from simulator.algorithms import build_schedule
from simulator.engine import simulate
from simulator.engine.trials import trial_makespans
from simulator.engine.warmup import load_compiled
from simulator.run.prepare import prepare_point
from simulator.run.scenario import scenario_points
from simulator.support.paths import SCENARIO_DIR

TARGET_S = 10.0


def _cpu() -> float:
    """CPU seconds of this process and of its children that ended."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--algorithm", default="ring")
    parser.add_argument("--cv", type=float, default=0.05)
    args = parser.parse_args()
    load_compiled()
    tree = {"name": "variability", "topology": "dgx-h100", "topology_params": {"nodes": args.nodes},
            "workload": {"kind": "decode", "model": {"heads": 16, "head_dim": 128}, "batch": 1,
                         "context": 1_048_576, "dtype": "bf16"},
            "algorithms": [args.algorithm]}
    (point,) = scenario_points(tree, "<benchmark>", SCENARIO_DIR)
    prep = prepare_point(point)
    assert prep.layout is not None
    algo = prep.algorithms[0]
    t0 = time.perf_counter()
    sched = build_schedule(algo.name, algo.params, prep.shape, prep.layout)
    t1 = time.perf_counter()
    plain = simulate(sched, prep.cluster).makespan
    t2 = time.perf_counter()
    cpu0 = _cpu()
    times = trial_makespans(sched, prep.cluster, args.trials, args.cv, args.cv, seed=1)
    t3 = time.perf_counter()
    cpu = _cpu() - cpu0
    p50, p99 = np.percentile(times, [50, 99]).tolist()
    flag = "" if t3 - t2 <= TARGET_S else f"  (over the {TARGET_S:g} s target)"
    print(f"{args.algorithm} decode, P = {len(prep.cluster.ranks)}: {len(sched.ops):,} ops; build {t1 - t0:.3f} s, "
          f"one simulation {t2 - t1:.3f} s, {args.trials} trials {t3 - t2:.2f} s wall{flag}, {cpu:.2f} s CPU "
          f"(this process and its forked workers)")
    print(f"latency {plain * 1e3:.3f} ms; trials (cv {args.cv:g}): p50 {p50 * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
