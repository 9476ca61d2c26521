"""What stream-order posting changes: each prefill schedule simulated as the engine runs it and as if its op order
were not a program.

    python benchmarks/stream_order.py [--nodes 2] [--sequence 128K] [--algorithms ring ring-q usp]
                                      [--layouts zigzag contiguous striped]

PyTorch's ``ProcessGroupNCCL`` makes NCCL's stream wait for the work queued on the current stream before it enqueues
a send, a receive or a collective: that kernel starts only once every kernel its rank enqueued before it, in program
order, has ended, and a point-to-point kernel holds its SMs from its launch while it waits for its peer. The engine
runs a schedule so (``Schedule.program_order``, the default; :mod:`simulator.engine.core`). This script simulates
each prefill schedule (causal, 32 heads, 8 KV heads, head_dim 128, bf16, batch 1) on ``--nodes`` DGX H100 servers
both ways: with ``program_order`` false (an end posted when its own dependencies are met, holding SMs only while its
transfer runs) and as the engine runs it, their ratio, and how many point-to-point ends and collective launches the
stream order gave a dependency.

Where a schedule's op order is the program a real implementation runs and transfers are posted before the kernels
they overlap (ring is ring-flash-attention's loop: post the next shard, attend, wait), the difference is small;
where a builder's op order puts a kernel that waits on a transfer before the next post, the stream order serializes
what the schedule meant to overlap.
"""

from __future__ import annotations

import argparse

import numpy as np

from simulator.algorithms.prefill import build_prefill
from simulator.cluster.topology import Cluster, load_topology
from simulator.engine.core import simulate, stream_ranks
from simulator.run.prepared import layout_of
from simulator.schedule.colpass import stream_ordered
from simulator.schedule.core import Schedule
from simulator.units import parse_tokens
from simulator.workloads.prefill_shape import PrefillShape


def free_of_stream_order(sched: Schedule) -> Schedule:
    """The same ops, run as if their op order were not a program (no stream order; SMs held from a transfer's
    start)."""
    sched.program_order = False
    return sched


def added_dependencies(sched: Schedule, cluster: Cluster) -> int:
    """How many point-to-point ends and launches the engine's stream order gives a dependency."""
    cols = sched.ops.columns()
    specs = [cluster.specs.get(node) for node in sched.placement_on(cluster.ranks)]
    return stream_ordered(cols.dep_count, cols.parents, cols.kind, cols.rank, cols.match, cols.coll,
                          stream_ranks(sched, specs, np.zeros(sched.ranks, dtype=bool)), sched.p2p)[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--sequence", default="128K", help="tokens (128K = 131,072)")
    ap.add_argument("--algorithms", nargs="+", default=["ring", "ring-q", "usp"])
    ap.add_argument("--layouts", nargs="+", default=["zigzag", "contiguous", "striped"])
    args = ap.parse_args()
    sequence = parse_tokens(args.sequence)
    cluster = load_topology("dgx-h100", {"nodes": args.nodes})
    print(f"prefill of {sequence:,} tokens on {len(cluster.ranks)} H100s (dgx-h100 x {args.nodes}): makespan "
          "without stream order -> as the engine runs it (stream order)")
    for algo in args.algorithms:
        for layout in args.layouts:
            for backward in (False, True):
                shape = PrefillShape(batch=1, heads=32, head_dim=128, kv_heads=8, sequence=sequence, dtype="bf16",
                                     layout=layout, backward=backward)
                built = build_prefill(algo, {}, shape, layout_of(cluster))
                ends = sum(1 for op in built.ops
                           if op.kind == "launch" or (op.kind in ("send", "recv") and not op.coll))
                added = added_dependencies(built, cluster)
                ordered = simulate(built, cluster).makespan
                free = simulate(free_of_stream_order(build_prefill(algo, {}, shape, layout_of(cluster))),
                                cluster).makespan
                print(f"{algo:8s} {layout:10s} {'fwd+bwd' if backward else 'fwd':7s} {free * 1e3:9.3f} ms -> "
                      f"{ordered * 1e3:9.3f} ms  {100 * (ordered / free - 1):+7.2f} %  ({added} of {ends} "
                      "point-to-point ends and launches gained a dependency)")


if __name__ == "__main__":
    main()
