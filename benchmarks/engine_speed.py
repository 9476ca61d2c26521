"""Engine speed, beside a raw simpy loop of the same event count.

    python benchmarks/engine_speed.py flows [--sizes 1000 10000 100000] [--concurrency 64] [--nodes 16] [--repeat 3]
    python benchmarks/engine_speed.py decode [--cases ring:8 ring:64 ring:512 ring:1024 tree:8 ... tree:4096]
                                             [--context 1000000] [--batch 1] [--heads 16] [--kv-heads 16] [--repeat 3]
                                             [--force]

Every case runs in a fresh process (forked), so that its ``peak RSS`` (the process's high-water mark of resident
memory, the interpreter and libraries included) is its own, with the collector paused as ``treering run`` pauses it
for a point (here for the whole case: the raw loop and the figure too, which ``treering run`` draws later). Per case
it prints: ops, engine events, the topology's load seconds, build seconds (the schedule), simulate seconds,
post-processing seconds (what ``treering run`` does after the simulation: the result row's numbers, and for decode
the bounded timeline table and its figure), peak RSS, and a raw simpy loop that processes as many bare timeout
events, measured in the same process: ``ratio`` = simulate / raw. Times are medians of ``--repeat`` runs (each in
its own process). matplotlib is set up (fonts loaded) and the compiled engine loaded (numba) once before the cases,
as a long-running process does once; the load time is printed.

``flows``: N flows with random endpoints over a fat tree of ``--nodes`` 8-GPU servers (16: 128 GPUs; 128: 1,024).

Flows start at uniformly random times over a window sized so that about ``--concurrency`` flows are active at
once on average (every start and finish is a max-min reallocation over all active flows, so the cost per event
grows with concurrency).

``decode``: one decode step (16 heads x 128, bf16, b = 1, 1M-token context; ``--batch``, ``--heads``, ``--kv-heads``
change the shape: a larger state makes the tree's allreduces run on more channels) of ring or tree on dgx-h100 with P
GPUs.

    python benchmarks/engine_speed.py prefill [--cases 8 64 256 1024] [--sequence 1048576] [--repeat 3]
                                              [--algorithms ring ring-q usp]

    python benchmarks/engine_speed.py train [--cases 405b-128k 405b-8k] [--repeat 3]

``train``: one training step of Llama 3.1 405B (kind: train, simulator.training.step.train_step) on dgx-h100:
``405b-128k`` TP8 CP16 PP16 DP8 on 16,384 GPUs, 128K tokens per sequence, 16M tokens per step; ``405b-8k`` TP8
PP16 DP64 on 8,192 GPUs, 8K tokens, 16M tokens per step (ZeRO 1, full recomputation, sequence parallelism, ring
attention). Per case: the topology's load seconds, the step's build + simulate seconds (every piece simulated on
the engine, the pipeline and DP composed), their sum, peak RSS, engine events and the step's simulated seconds.
The target is under 10 s for load + step on 2 cores.

``prefill``: ring attention, causal, zigzag, forward + backward (32 heads, 8 KV heads, head_dim 128, bf16, b = 1,
1M tokens) on dgx-h100 with P GPUs: the same columns. ``--algorithms`` takes any prefill schedule; ``ulysses`` runs
with max(32, P) heads (a head or more per GPU) on the contiguous layout.

    python benchmarks/engine_speed.py collective [--cases auto:1000 ring:1000 tree:1000] [--bytes 1GiB]
                                                 [--preset hgx-h200] [--repeat 3] [--force]

``collective``: one allreduce (bf16, ``--bytes`` per rank, nccl-tests' size) over every GPU of ``--preset`` with N
servers, algorithm ``auto``, ``ring`` or ``tree`` as ``kind: collective`` runs it
(:func:`simulator.collectives.standalone.collective_schedule`, then the engine). Per case: the size limit's op
estimate (``est_ops``, :func:`simulator.support.limits.collective_ops` of what runs), the ops built, the topology's
load seconds, build seconds (the ``auto`` tuner's choice included), simulate seconds and peak RSS; ``result`` the
collective's simulated time. A case the size limit refuses is reported so, as ``treering run`` refuses it
(``--force`` runs it: a 1 GiB ring on 1,000 servers is 2.6e9 ops). The target (issue 41): 1 GiB on 1,000
hgx-h200 servers <= 10 s and <= 2 GB each.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import simpy

from simulator.algorithms import build_schedule, resolve
from simulator.algorithms.prefill import build_prefill
from simulator.cluster.topology import load_topology
from simulator.collectives import fabric_of
from simulator.collectives.nccl_tree import tree_parts
from simulator.collectives.standalone import collective_choice, collective_schedule
from simulator.engine.core import simulate
from simulator.engine.warmup import load_compiled
from simulator.report.timeline import gantt, timeline_frame
from simulator.run.prepared import layout_of
from simulator.run.timing import critical_timing, result_numbers
from simulator.schedule.core import Schedule
from simulator.support.gcpause import gc_paused
from simulator.support.limits import MAX_SCHEDULE_OPS, collective_ops
from simulator.training.step import train_step
from simulator.units import parse_bytes
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.shape import DecodeShape
from simulator.workloads.train import TrainWorkload, train_checks

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


Case = dict[str, Any]


def _in_child(fn: Callable[..., Case], *args: Any) -> Case:
    """Run ``fn(*args)`` in a forked process; its result, with the child's peak RSS (bytes)."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        return pool.apply(_measured, (fn, *args))


def _measured(fn: Callable[..., Case], *args: Any) -> Case:
    with gc_paused():  # as `treering run` runs a point (simulator.run.sweep): the collector paused for all of it
        case = fn(*args)
    case["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes
    return case


def _decode_case(algo: str, p: int, context: int, batch: int = 1, heads: int = 16, kv_heads: int = 16,
                 force: bool = False) -> Case:
    shape = DecodeShape(batch=batch, heads=heads, head_dim=128, kv_heads=kv_heads, context=context, dtype="bf16")
    loading = time.perf_counter()
    cluster = load_topology("dgx-h100", {"nodes": max(1, p // 8)}, force=force)
    name, params = resolve(algo)
    t0 = time.perf_counter()
    sched = build_schedule(name, params, shape, layout_of(cluster))
    t1 = time.perf_counter()
    res = simulate(sched, cluster)
    t2 = time.perf_counter()
    numbers = result_numbers(sched, res)
    fig = gantt(timeline_frame([(algo, sched, res)]))
    fig.savefig(io.BytesIO(), format="png", dpi=110)
    t3 = time.perf_counter()
    return {"ops": len(sched.ops), "events": res.events, "build": t1 - t0, "sim": t2 - t1, "post": t3 - t2,
            "raw": raw_simpy(res.events), "latency": numbers["latency_s"], "load": t0 - loading}


def _flows_case(n: int, concurrency: int, nodes: int) -> Case:
    loading = time.perf_counter()
    cluster = load_topology("cluster", {**TOPO, "nodes": nodes})
    t0 = time.perf_counter()
    sched = flows_schedule(n, cluster.ranks, concurrency, np.random.default_rng(n))
    t1 = time.perf_counter()
    res = simulate(sched, cluster)
    t2 = time.perf_counter()
    ends = res.op_ends()
    finish = [ends[op.match] for op in sched.ops if op.kind == "send" and op.match is not None]  # the flow rows
    t3 = time.perf_counter()
    return {"ops": len(sched.ops), "events": res.events, "build": t1 - t0, "sim": t2 - t1, "post": t3 - t2,
            "raw": raw_simpy(res.events), "latency": max(finish, default=0.0), "realloc": res.allocations,
            "load": t0 - loading}


def _median(runs: list[Case]) -> Case:
    out = dict(runs[0])
    for key in ("load", "build", "sim", "post", "raw", "rss"):
        out[key] = statistics.median(r[key] for r in runs)
    return out


HEADER = (f"{'case':>12} {'ops':>9} {'events':>9} {'load_s':>7} {'build_s':>8} {'sim_s':>8} {'post_s':>7} "
          f"{'peak_RSS':>9} "
          f"{'us/op':>6} {'raw_s':>7} {'ratio':>6} {'result':>12}")


def _line(label: str, c: Case, unit: str) -> str:
    scale = 1e3 if unit == "ms" else 1.0
    return (f"{label:>12} {c['ops']:>9} {c['events']:>9} {c['load']:>7.2f} {c['build']:>8.2f} {c['sim']:>8.2f} "
            f"{c['post']:>7.2f} "
            f"{c['rss'] / 2**20:>7.0f}MB {1e6 * (c['build'] + c['sim']) / c['ops']:>6.1f} {c['raw']:>7.2f} "
            f"{c['sim'] / c['raw']:>6.1f} {c['latency'] * scale:>9.3f} {unit}")


def _warm_matplotlib() -> None:
    """Draw once before forking: matplotlib's one-time set-up (fonts) is no case's post-processing."""
    fig = gantt(timeline_frame([]).assign(algorithm=["x"], rank=[0], kind=["compute"], name=["x"], start_s=[0.0],
                                          end_s=[1.0], bytes=[0.0], ops=[1], critical=[True], ranks_total=[1]))
    fig.savefig(io.BytesIO(), format="png", dpi=110)


def _warm_engine() -> None:
    """Load the compiled engine before forking: once per process (numba), no case's simulation."""
    print(f"compiled engine loaded in {load_compiled():.2f} s (once per process, before the cases)")


def bench_decode(cases: list[str], context: int, repeat: int, batch: int = 1, heads: int = 16,
                 kv_heads: int = 16, force: bool = False) -> None:
    _warm_matplotlib()
    _warm_engine()
    print(f"decode step, context {context:,} tokens, batch {batch}, {heads} heads ({kv_heads} KV) x 128; medians of "
          f"{repeat}; us/op = (build + simulate) / ops")
    print(HEADER)
    for case in cases:
        algo, p = case.split(":")
        runs = [_in_child(_decode_case, algo, int(p), context, batch, heads, kv_heads, force) for _ in range(repeat)]
        print(_line(case, _median(runs), "ms"), flush=True)


def _prefill_case(p: int, sequence: int, algo: str = "ring") -> Case:
    uly = algo == "ulysses"  # a head or more per GPU, the sequence in rank order
    shape = PrefillShape(batch=1, heads=max(32, p) if uly else 32, head_dim=128, kv_heads=8, sequence=sequence,
                         dtype="bf16", causal=True, layout="contiguous" if uly else "zigzag", backward=True)
    loading = time.perf_counter()
    cluster = load_topology("dgx-h100", {"nodes": max(1, p // 8)})
    t0 = time.perf_counter()
    sched = build_prefill(algo, {}, shape, layout_of(cluster, p))  # the schedule's defaults (ring: overlapped)
    t1 = time.perf_counter()
    res = simulate(sched, cluster)
    t2 = time.perf_counter()
    numbers = result_numbers(sched, res)
    critical_timing(res, sched.ranks)
    fig = gantt(timeline_frame([(algo, sched, res)]))
    fig.savefig(io.BytesIO(), format="png", dpi=110)
    t3 = time.perf_counter()
    return {"ops": len(sched.ops), "events": res.events, "build": t1 - t0, "sim": t2 - t1, "post": t3 - t2,
            "raw": raw_simpy(res.events), "latency": numbers["latency_s"], "load": t0 - loading}


def bench_prefill(ranks: list[int], sequence: int, repeat: int, algorithms: tuple[str, ...] = ("ring",)) -> None:
    _warm_matplotlib()
    _warm_engine()
    print(f"{', '.join(algorithms)} prefill, causal zigzag (ulysses: contiguous, max(32, P) heads), forward + "
          f"backward, {sequence:,} tokens; medians of {repeat}")
    print(HEADER)
    for algo in algorithms:
        for p in ranks:
            runs = [_in_child(_prefill_case, p, sequence, algo) for _ in range(repeat)]
            print(_line(f"{algo}:{p}", _median(runs), "ms"), flush=True)


TRAIN_CASES = {  # name: (servers, parallel layout, sequence)
    "405b-128k": (2048, {"tp": 8, "cp": 16, "pp": 16, "dp": 8}, 128 * 1024),
    "405b-8k": (1024, {"tp": 8, "pp": 16, "dp": 64}, 8 * 1024),
}


def _train_case(name: str) -> Case:
    nodes, parallel, sequence = TRAIN_CASES[name]
    t0 = time.perf_counter()
    cluster = load_topology("dgx-h100", {"nodes": nodes})
    t1 = time.perf_counter()
    wl = TrainWorkload.model_validate({
        "kind": "train", "model": "llama-3.1-405b", "sequence": sequence, "global_batch": 16 * 2**20,
        "parallel": {**parallel, "sequence_parallel": True}, "zero": 1, "recompute": "full"})
    train_checks(wl, len(cluster.ranks))
    step = train_step(wl, cluster)
    t2 = time.perf_counter()
    return {"load": t1 - t0, "step": t2 - t1, "events": step.events, "latency": step.step_s,
            "gpus": len(cluster.ranks)}


def bench_train(cases: list[str], repeat: int) -> None:
    _warm_engine()
    print(f"training step of llama-3.1-405b on dgx-h100; medians of {repeat}")
    print(f"{'case':>10} {'GPUs':>6} {'load s':>7} {'step s':>7} {'total s':>8} {'RSS':>8} {'events':>8} "
          f"{'step_s':>8}")
    for name in cases:
        runs = [_in_child(_train_case, name) for _ in range(repeat)]
        c = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{name:>10} {int(c['gpus']):>6} {c['load']:>7.2f} {c['step']:>7.2f} {c['load'] + c['step']:>8.2f} "
              f"{c['rss'] / 2**20:>6.0f}MB {int(c['events']):>8} {c['latency']:>8.3f}", flush=True)


def _collective_case(algo: str, nodes: int, nbytes: int, preset: str, force: bool) -> Case:
    t0 = time.perf_counter()
    cluster = load_topology(preset, {"nodes": nodes})
    fabric = fabric_of(cluster)
    t1 = time.perf_counter()
    p = len(cluster.ranks)
    choice = collective_choice(cluster, fabric, "allreduce", nbytes // 2, 2, "bf16", algo)  # the tuner's, kept
    parts = tree_parts(nbytes // 2, 2, choice.channels, choice.protocol, fabric.nodes, p) if choice.algo == "tree" \
        else None
    est = collective_ops(p, choice.channels, choice.algo, "allreduce", p // fabric.nodes, parts)
    case: Case = {"gpus": p, "load": t1 - t0, "chosen": f"{choice.algo}/{choice.protocol}/{choice.channels}",
                  "est": est}
    if est > MAX_SCHEDULE_OPS and not force:  # as `treering run` refuses it (support.limits.check_collective)
        return {**case, "refused": True, "build": time.perf_counter() - t1, "sim": 0.0}
    sched, _ = collective_schedule(cluster, fabric, "allreduce", nbytes // 2, 2, "bf16", algo)
    t2 = time.perf_counter()
    res = simulate(sched, cluster)
    t3 = time.perf_counter()
    return {**case, "ops": len(sched.ops), "events": res.events, "build": t2 - t1, "sim": t3 - t2,
            "latency": res.makespan}


def bench_collective(cases: list[str], nbytes: int, preset: str, repeat: int, force: bool = False) -> None:
    _warm_engine()
    print(f"allreduce of {nbytes / 2**20:g} MiB bf16 on {preset}; medians of {repeat}; build includes the tuner's "
          f"choice; total = build + simulate; a case over the size limit is refused as `treering run` refuses it "
          f"(--force runs it)")
    print(f"{'case':>12} {'GPUs':>6} {'chosen':>18} {'est_ops':>9} {'ops':>9} {'events':>9} {'load_s':>7} "
          f"{'build_s':>8} {'sim_s':>7} {'total_s':>8} {'peak_RSS':>9} {'result':>12}")
    for case in cases:
        algo, nodes = case.split(":")
        runs = [_in_child(_collective_case, algo, int(nodes), nbytes, preset, force) for _ in range(repeat)]
        c = dict(runs[0])
        for key in ("load", "build", "sim", "rss"):
            c[key] = statistics.median(r[key] for r in runs)
        head = f"{case:>12} {c['gpus']:>6} {c['chosen']:>18} {c['est']:>9.3g}"
        if c.get("refused"):
            print(f"{head} refused: over {MAX_SCHEDULE_OPS:,} ops (tuner {c['build']:.2f} s)", flush=True)
            continue
        print(f"{head} {c['ops']:>9} {c['events']:>9} {c['load']:>7.2f} {c['build']:>8.2f} {c['sim']:>7.2f} "
              f"{c['build'] + c['sim']:>8.2f} {c['rss'] / 2**20:>7.0f}MB {c['latency'] * 1e3:>9.3f} ms", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    flows = sub.add_parser("flows")
    flows.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    flows.add_argument("--concurrency", type=int, default=64)
    flows.add_argument("--nodes", type=int, default=TOPO["nodes"], help="8-GPU servers in the fat tree")
    flows.add_argument("--repeat", type=int, default=3)
    decode = sub.add_parser("decode")
    decode.add_argument("--cases", nargs="+", default=["ring:8", "ring:64", "ring:512", "ring:1024", "tree:8",
                                                       "tree:64", "tree:512", "tree:1024", "tree:4096"])
    decode.add_argument("--context", type=int, default=1_000_000)
    decode.add_argument("--batch", type=int, default=1)
    decode.add_argument("--heads", type=int, default=16)
    decode.add_argument("--kv-heads", type=int, default=16)
    decode.add_argument("--repeat", type=int, default=3)
    decode.add_argument("--force", action="store_true", help="clusters over the size limit too (131,072 GPUs)")
    prefill = sub.add_parser("prefill")
    prefill.add_argument("--cases", type=int, nargs="+", default=[8, 64, 256, 1024])
    prefill.add_argument("--sequence", type=int, default=1 << 20)
    prefill.add_argument("--repeat", type=int, default=3)
    prefill.add_argument("--algorithms", nargs="+", default=["ring"], help="prefill schedules (e.g. ring ring-q)")
    train = sub.add_parser("train")
    train.add_argument("--cases", nargs="+", choices=list(TRAIN_CASES), default=list(TRAIN_CASES))
    train.add_argument("--repeat", type=int, default=3)
    coll = sub.add_parser("collective")
    coll.add_argument("--cases", nargs="+", default=["auto:1000", "ring:1000", "tree:1000"],
                      help="algorithm:servers (auto, ring, tree)")
    coll.add_argument("--bytes", default="1GiB", help="bytes per rank (nccl-tests' size)")
    coll.add_argument("--preset", default="hgx-h200")
    coll.add_argument("--repeat", type=int, default=3)
    coll.add_argument("--force", action="store_true", help="run cases over the size limit too")
    args = ap.parse_args()
    if args.what == "collective":
        bench_collective(args.cases, int(parse_bytes(args.bytes)), args.preset, args.repeat, args.force)
        return
    if args.what == "train":
        bench_train(args.cases, args.repeat)
        return
    if args.what == "prefill":
        bench_prefill(args.cases, args.sequence, args.repeat, tuple(args.algorithms))
        return
    if args.what == "decode":
        bench_decode(args.cases, args.context, args.repeat, args.batch, args.heads, args.kv_heads, args.force)
        return
    _warm_engine()
    cluster = load_topology("cluster", {**TOPO, "nodes": args.nodes})
    print(f"fat tree: {len(cluster.ranks)} GPUs, {cluster.graph.number_of_edges()} directed links; "
          f"target mean concurrency {args.concurrency} flows; medians of {args.repeat}")
    print(HEADER)
    for n in args.sizes:
        runs = [_in_child(_flows_case, n, args.concurrency, args.nodes) for _ in range(args.repeat)]
        print(_line(f"flows:{n}", _median(runs), "s"), flush=True)


if __name__ == "__main__":
    main()
