"""What communication kernels the engine leaves free could cost, measured on the shipped schedules.

    python benchmarks/comm_kernels.py [--nodes 2] [--sequence 128K] [--context 1M]

Each prefill schedule (causal, 32 heads, 8 KV heads, head_dim 128, bf16, batch 1, forward and forward + backward,
zigzag; Ulysses contiguous) and each decode schedule (16 heads x 128, ``--context`` tokens) on ``--nodes`` DGX H100
servers, two tables:

* **kernels beside a collective**: NCCL runs a collective as one kernel of a block per channel, each on an SM for
  the collective's whole run (``src/enqueue.cc``, ``ncclLaunchKernel``), so a compute kernel beside it runs on the
  SMs left. The engine gives point-to-point transfers' SMs to the kernels beside them (:mod:`simulator.engine.core`)
  and ``kind: train`` the DP collectives' (:mod:`simulator.training.dp`); a collective inside a schedule holds none.
  Printed: the seconds of kernels (outside collectives) that run while a transfer of a collective on the same rank
  is in flight, against all kernel seconds, summed over ranks: what holding SMs for collectives could slow.
* **point-to-point groups out of stream order**: the sends and receives a rank issues back to back (no kernel
  between them in its op order) taken as one group (one ``batch_isend_irecv``, one NCCL kernel); counted, the groups
  whose transfers start before the previous group's on the same rank have ended, and by how much in all: what
  NCCL's kernels of one stream running one after another would delay, were a rank's groups all on one stream
  (PyTorch's ``ProcessGroupNCCL`` gives unbatched sends and receives a 2-rank communicator per peer pair, each with
  its stream, unless the group was initialised eagerly with a device: then they share its communicator).
"""

from __future__ import annotations

import argparse

import numpy as np

from simulator.algorithms import build_schedule, resolve
from simulator.algorithms.prefill import PREFILL_REGISTRY, build_prefill
from simulator.cluster.topology import Cluster, load_topology
from simulator.engine.core import simulate
from simulator.run.prepared import layout_of
from simulator.schedule.core import Schedule
from simulator.units import parse_tokens
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.shape import DecodeShape


def beside(sched: Schedule, cluster: Cluster) -> tuple[float, float]:
    """(kernel seconds beside a collective's transfer on their rank, all kernel seconds), summed over ranks."""
    res = simulate(sched, cluster)
    kinds = np.array([op.kind for op in sched.ops])
    ranks = np.array([op.rank for op in sched.ops])
    coll = np.array([bool(op.coll) for op in sched.ops])
    kernel = np.isin(kinds, ["compute", "merge"]) & ~coll
    moving = np.isin(kinds, ["send", "recv"]) & coll
    near = total = 0.0
    for rank in np.unique(ranks[kernel]):
        ks = np.flatnonzero(kernel & (ranks == rank))
        xs = np.flatnonzero(moving & (ranks == rank))
        total += float((res.end[ks] - res.start[ks]).sum())
        if not len(xs):
            continue
        x0, x1 = res.start[xs], res.end[xs]
        for k in ks:  # the longest stretch of the kernel beside any one transfer (a lower bound of the union)
            near += float(np.clip(np.minimum(res.end[k], x1) - np.maximum(res.start[k], x0), 0.0, None).max())
    return near, total


def out_of_order(sched: Schedule, cluster: Cluster) -> tuple[int, int, float]:
    """(point-to-point groups, those starting before the previous group on their rank ended, by how many seconds in
    all), the groups as the module docstring takes them."""
    res = simulate(sched, cluster)
    per_rank: dict[int, list[list[int]]] = {}
    current: dict[int, list[int]] = {}
    for op in sched.ops:  # op order is each rank's program order
        if op.kind in ("send", "recv") and not op.coll:
            current.setdefault(op.rank, []).append(op.id)
        elif op.kind in ("compute", "merge", "launch") and current.get(op.rank):
            per_rank.setdefault(op.rank, []).append(current.pop(op.rank))
    for rank, ids in current.items():
        if ids:
            per_rank.setdefault(rank, []).append(ids)
    groups = late = 0
    seconds = 0.0
    for rank_groups in per_rank.values():
        before = -np.inf
        for ids in rank_groups:
            groups += 1
            start, end = float(res.start[ids].min()), float(res.end[ids].max())
            if start < before:
                late += 1
                seconds += before - start
            before = max(before, end)
    return groups, late, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--sequence", default="128K", help="prefill tokens (128K = 131,072)")
    ap.add_argument("--context", default="1M", help="decode context tokens (1M = 1,048,576)")
    args = ap.parse_args()
    cluster = load_topology("dgx-h100", {"nodes": args.nodes})
    layout = layout_of(cluster)
    rows: list[tuple[str, Schedule]] = []
    for algo in PREFILL_REGISTRY:
        if algo in ("single", "auto"):
            continue
        for backward in (False, True):
            shape = PrefillShape(batch=1, heads=32, kv_heads=8, head_dim=128, sequence=parse_tokens(args.sequence),
                                 dtype="bf16", causal=True, backward=backward,
                                 layout="contiguous" if algo == "ulysses" else "zigzag")
            name, params = resolve(algo, registry=PREFILL_REGISTRY)
            rows.append((f"prefill {algo} {'fwd+bwd' if backward else 'fwd'}", build_prefill(name, params, shape,
                                                                                               layout)))
    for algo in ("ring", "ring-q", "tree", "tree-p2p"):
        shape = DecodeShape(batch=1, heads=16, head_dim=128, kv_heads=16, context=parse_tokens(args.context),
                            dtype="bf16")
        name, params = resolve(algo)
        rows.append((f"decode {algo}", build_schedule(name, params, shape, layout)))
    print(f"dgx-h100 x {args.nodes}: kernel seconds beside a collective's transfer on their rank, of all kernel "
          "seconds (summed over ranks)")
    for label, sched in rows:
        near, total = beside(sched, cluster)
        share = near / total if total > 0 else 0.0
        print(f"{label:26s} {near * 1e3:10.3f} ms of {total * 1e3:10.3f} ms  ({share:.2%})")
    print("\npoint-to-point groups (ends issued back to back) starting before their rank's previous group ended")
    for label, sched in rows:
        groups, late, seconds = out_of_order(sched, cluster)
        makespan = simulate(sched, cluster).makespan
        print(f"{label:26s} {late:6d} of {groups:6d} groups, by {seconds * 1e3:10.3f} ms in all (makespan "
              f"{makespan * 1e3:.3f} ms)")


if __name__ == "__main__":
    main()
