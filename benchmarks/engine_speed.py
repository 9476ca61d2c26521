"""Engine speed: N flows with random endpoints over a fat tree, beside a raw simpy loop of the same event count.

    python benchmarks/engine_speed.py [--sizes 1000 10000 100000] [--concurrency 64] [--repeat 3]

Flows start at uniformly random times over a window sized so that about ``--concurrency`` flows are active at
once on average (every start and finish is a max-min reallocation over all active flows, so the cost per event
grows with concurrency). Prints wall seconds (median of ``--repeat``), simpy events, events/s, and the same
figures for a raw simpy loop that processes as many bare timeout events.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import simpy

from simulator.engine import simulate
from simulator.schedule import Schedule
from simulator.topology import load_topology

TOPO = {"nodes": 16, "gpus_per_node": 8, "inter": "fat-tree", "nodes_per_leaf": 4, "spines": 4,
        "oversubscription": 2}


def flows_schedule(n: int, ranks: tuple[str, ...], concurrency: int, rng: np.random.Generator) -> Schedule:
    sizes = rng.lognormal(mean=np.log(16e6), sigma=1.0, size=n)  # ~16 MB median
    mean_drain = float(sizes.mean()) / 25e9  # rough per-flow time under contention
    window = n * mean_drain / concurrency
    starts = np.sort(rng.uniform(0, window, size=n))
    src = rng.integers(0, len(ranks), size=n)
    dst = (src + rng.integers(1, len(ranks), size=n)) % len(ranks)
    sched = Schedule(len(ranks), placement=ranks, name="random-flows")
    for i in range(n):
        sched.add_transfer(int(src[i]), int(dst[i]), float(sizes[i]), f"f{i}", not_before_s=float(starts[i]))
    return sched


def raw_simpy(events: int) -> float:
    env = simpy.Environment()
    count = [0]

    def tick(_ev: object) -> None:
        count[0] += 1
        if count[0] < events:
            env.timeout(1e-6).callbacks.append(tick)

    t0 = time.perf_counter()
    env.timeout(0).callbacks.append(tick)
    env.run()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cluster = load_topology("cluster", TOPO)
    print(f"fat tree: {len(cluster.ranks)} GPUs, {cluster.graph.number_of_edges()} directed links; "
          f"target mean concurrency {args.concurrency} flows")
    print(f"{'flows':>8} {'events':>9} {'realloc':>8} {'wall_s':>8} {'events/s':>10} {'raw_s':>7} "
          f"{'raw ev/s':>10} {'ratio':>6}")
    for n in args.sizes:
        sched = flows_schedule(n, cluster.ranks, args.concurrency, np.random.default_rng(n))
        walls, raws = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            res = simulate(sched, cluster)
            walls.append(time.perf_counter() - t0)
            raws.append(raw_simpy(res.events))
        wall, raw = statistics.median(walls), statistics.median(raws)
        print(f"{n:>8} {res.events:>9} {res.allocations:>8} {wall:>8.3f} {res.events / wall:>10.0f} {raw:>7.3f} "
              f"{res.events / raw:>10.0f} {wall / raw:>6.1f}")


if __name__ == "__main__":
    main()
