"""What posting GPU point-to-point ends in stream order would change (a measurement; the engine does not do it).

    python benchmarks/stream_order.py [--nodes 2] [--sequence 128K] [--algorithms ring ring-q usp]
                                      [--layouts zigzag contiguous striped]

PyTorch's ``ProcessGroupNCCL`` makes NCCL's stream wait for the work queued on the current stream before it
enqueues a send or a receive: a point-to-point kernel starts only once every kernel its rank enqueued before it, in
program order, has ended. The engine starts an end when its own dependencies are met. This script gives every
point-to-point end of a GPU rank one more dependency, the last kernel (``compute`` or ``merge``) before it in its
rank's op order, and simulates each prefill schedule (causal, 32 heads, 8 KV heads, head_dim 128, bf16, batch 1) on
``--nodes`` DGX H100 servers both ways: the makespan as built, with the stream-order dependencies, their ratio, and
how many ends gained one.

What it tells apart: where a schedule's op order is the program a real implementation runs (ring is
ring-flash-attention's loop: post the next shard, attend, wait), the stream order adds nothing; where the builder's
op order is not a program order, the added dependencies serialize what the schedule overlaps (the script measures
by how much, before a builder's order is made a program order on purpose and the engine posts in stream order).
"""

from __future__ import annotations

import argparse

from simulator.algorithms.prefill import build_prefill
from simulator.cluster.topology import load_topology
from simulator.engine.core import simulate
from simulator.run.prepared import layout_of
from simulator.schedule.core import Schedule
from simulator.schedule.oplist import OpList
from simulator.units import parse_tokens
from simulator.workloads.prefill_shape import PrefillShape

KERNELS = ("compute", "merge")


def stream_ordered(sched: Schedule) -> int:
    """Give each point-to-point end (a send or receive outside a collective) the last kernel before it in its rank's
    op order as a dependency; returns how many ends gained one."""
    last: dict[int, int] = {}
    ops, added = [], 0
    for op in sched.ops:
        if op.kind in KERNELS:
            last[op.rank] = op.id
        elif op.kind in ("send", "recv") and not op.coll:
            k = last.get(op.rank)
            if k is not None and k not in op.deps:
                op = op._replace(deps=(*op.deps, k))
                added += 1
        ops.append(op)
    sched.ops = OpList(ops)
    return added


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--sequence", default="128K", help="tokens (128K = 131,072)")
    ap.add_argument("--algorithms", nargs="+", default=["ring", "ring-q", "usp"])
    ap.add_argument("--layouts", nargs="+", default=["zigzag", "contiguous", "striped"])
    args = ap.parse_args()
    sequence = parse_tokens(args.sequence)
    cluster = load_topology("dgx-h100", {"nodes": args.nodes})
    print(f"prefill of {sequence:,} tokens on {len(cluster.ranks)} H100s (dgx-h100 x {args.nodes}): makespan as "
          "built -> with stream-order posting")
    for algo in args.algorithms:
        for layout in args.layouts:
            for backward in (False, True):
                shape = PrefillShape(batch=1, heads=32, head_dim=128, kv_heads=8, sequence=sequence, dtype="bf16",
                                     layout=layout, backward=backward)
                built = build_prefill(algo, {}, shape, layout_of(cluster))
                ends = sum(1 for op in built.ops if op.kind in ("send", "recv") and not op.coll)
                before = simulate(built, cluster).makespan
                ordered = build_prefill(algo, {}, shape, layout_of(cluster))
                added = stream_ordered(ordered)
                after = simulate(ordered, cluster).makespan
                print(f"{algo:8s} {layout:10s} {'fwd+bwd' if backward else 'fwd':7s} {before * 1e3:9.3f} ms -> "
                      f"{after * 1e3:9.3f} ms  {100 * (after / before - 1):+7.2f} %  ({added} of {ends} "
                      "point-to-point ends gained a dependency)")


if __name__ == "__main__":
    main()
