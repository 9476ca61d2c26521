"""Engine speed, beside a raw simpy loop of the same event count.

    python benchmarks/engine_speed.py flows [--sizes 1000 10000 100000] [--concurrency 64] [--repeat 3]
    python benchmarks/engine_speed.py decode [--cases ring:8 ring:64 ring:512 ring:1024 tree:8 ... tree:4096]

``flows``: N flows with random endpoints over a 128-GPU fat tree.

Flows start at uniformly random times over a window sized so that about ``--concurrency`` flows are active at
once on average (every start and finish is a max-min reallocation over all active flows, so the cost per event
grows with concurrency). Prints wall seconds (median of ``--repeat``), engine events, events/s, and the same
figures for a raw simpy loop that processes as many bare timeout events.

``decode``: one decode step (16 heads x 128, bf16, b = 1, 1M-token context) of ring or tree on dgx-h100 with P GPUs:
schedule build seconds, simulation seconds, ops, engine events, events/s, and the raw simpy loop.

    python benchmarks/engine_speed.py prefill [--cases 8 64 256 1024] [--sequence 1048576]

``prefill``: ring attention, causal, zigzag, forward + backward (32 heads, 8 KV heads, head_dim 128, bf16, b = 1,
1M tokens) on dgx-h100 with P GPUs: the same columns.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np
import simpy

from simulator.algorithms import build_schedule, resolve
from simulator.algorithms.prefill import build_prefill
from simulator.cluster.topology import load_topology
from simulator.engine.core import simulate
from simulator.points import layout_of
from simulator.schedule import Schedule
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.shape import DecodeShape

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


def bench_decode(cases: list[str]) -> None:
    print(f"{'case':>10} {'build_s':>8} {'sim_s':>8} {'ops':>9} {'events':>9} {'events/s':>10} {'raw_s':>7} "
          f"{'raw ev/s':>10} {'ratio':>6} {'latency':>12}")
    shape = DecodeShape(batch=1, heads=16, head_dim=128, kv_heads=16, context=1_000_000, dtype="bf16")
    for case in cases:
        gc.collect()  # the previous case's millions of ops are not this one's cost
        algo, p = case.split(":")
        cluster = load_topology("dgx-h100", {"nodes": max(1, int(p) // 8)})
        name, params = resolve(algo)
        t0 = time.perf_counter()
        sched = build_schedule(name, params, shape, layout_of(cluster))
        t1 = time.perf_counter()
        res = simulate(sched, cluster)
        t2 = time.perf_counter()
        raw = raw_simpy(res.events)
        sim = t2 - t1
        print(f"{case:>10} {t1 - t0:>8.2f} {sim:>8.2f} {len(sched.ops):>9} {res.events:>9} {res.events / sim:>10.0f} "
              f"{raw:>7.2f} {res.events / raw:>10.0f} {sim / raw:>6.1f} {res.makespan * 1e3:>9.3f} ms")
        del sched, res  # freed here, not inside the next case's timing


def bench_prefill(ranks: list[int], sequence: int) -> None:
    print(f"{'P':>6} {'build_s':>8} {'sim_s':>8} {'ops':>9} {'events':>9} {'events/s':>10} {'raw_s':>7} "
          f"{'raw ev/s':>10} {'ratio':>6} {'latency':>12}")
    shape = PrefillShape(batch=1, heads=32, head_dim=128, kv_heads=8, sequence=sequence, dtype="bf16", causal=True,
                         layout="zigzag", backward=True)
    for p in ranks:
        gc.collect()
        cluster = load_topology("dgx-h100", {"nodes": max(1, p // 8)})
        t0 = time.perf_counter()
        sched = build_prefill("ring", {"overlap": True}, shape, layout_of(cluster, p))
        t1 = time.perf_counter()
        res = simulate(sched, cluster)
        t2 = time.perf_counter()
        raw = raw_simpy(res.events)
        sim = t2 - t1
        print(f"{p:>6} {t1 - t0:>8.2f} {sim:>8.2f} {len(sched.ops):>9} {res.events:>9} {res.events / sim:>10.0f} "
              f"{raw:>7.2f} {res.events / raw:>10.0f} {sim / raw:>6.1f} {res.makespan * 1e3:>9.3f} ms")
        del sched, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    flows = sub.add_parser("flows")
    flows.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    flows.add_argument("--concurrency", type=int, default=64)
    flows.add_argument("--repeat", type=int, default=3)
    decode = sub.add_parser("decode")
    decode.add_argument("--cases", nargs="+", default=["ring:8", "ring:64", "ring:512", "ring:1024", "tree:8",
                                                       "tree:64", "tree:512", "tree:1024", "tree:4096"])
    prefill = sub.add_parser("prefill")
    prefill.add_argument("--cases", type=int, nargs="+", default=[8, 64, 256, 1024])
    prefill.add_argument("--sequence", type=int, default=1 << 20)
    args = ap.parse_args()
    if args.what == "prefill":
        bench_prefill(args.cases, args.sequence)
        return
    if args.what == "decode":
        bench_decode(args.cases)
        return
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
