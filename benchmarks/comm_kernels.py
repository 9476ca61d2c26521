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
* **point-to-point kernels on one stream or a stream per peer**: the engine runs a GPU's sends and receives issued
  back to back as one kernel (``p2p: batched``: one ``batch_isend_irecv`` on the group's communicator) and a rank's
  kernels one after another on its stream, or (``p2p: per-peer``: unbatched ``isend``/``irecv``, PyTorch's
  ``ProcessGroupNCCL`` giving each pair of ranks a communicator and stream of its own) each end as a kernel on its
  pair's stream. Printed: each schedule's makespan both ways, and how many groups (batched) start at the end of
  the rank's previous group, later than they would on a stream of their own: what one stream delays.
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


def held_back(sched: Schedule, cluster: Cluster) -> tuple[int, int, float, float]:
    """(point-to-point groups, those that one stream holds back, the makespan batched, per-peer): a group held back
    starts where the rank's previous group ended, later than the same group starts per peer."""
    res = simulate(sched, cluster)
    sched.p2p = "per-peer"
    free = simulate(sched, cluster)
    sched.p2p = "batched"
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
    groups = held = 0
    for rank_groups in per_rank.values():
        for before, ids in zip([None, *rank_groups], rank_groups, strict=False):
            groups += 1
            start = float(res.start[ids].min())
            if before is not None and start == float(res.end[before].max()) and start > float(free.start[ids].min()):
                held += 1
    return groups, held, res.makespan, free.makespan


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
    print("\npoint-to-point kernels: one stream per rank (p2p: batched) against a stream per peer (per-peer)")
    for label, sched in rows:
        groups, held, batched, per_peer = held_back(sched, cluster)
        print(f"{label:26s} {batched * 1e3:10.3f} ms batched, {per_peer * 1e3:10.3f} ms per peer "
              f"({batched / per_peer - 1:+7.2%}); {held:5d} of {groups:5d} groups held back by the stream")

if __name__ == "__main__":
    main()
