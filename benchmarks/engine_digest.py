"""A digest of what the engine computes on a fixed set of collective and decode cases, to compare two trees.

    PYTHONPATH=. python benchmarks/engine_digest.py [--links]

Per case: ops, engine events, rate allocations and a SHA-256 of every record's (op, start, end) as exact floats
(``float.hex``); with ``--links``, also of the link loads a ``record_links`` simulation writes. An engine change
meant to leave the answers alone (a cache, a faster search) prints the same lines before and after: run it in a
worktree of the old commit (with ``PYTHONPATH`` set to that worktree) and in this one, and ``diff`` the outputs.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Iterator

from simulator.algorithms import build_schedule, resolve
from simulator.cluster.topology import Cluster, load_topology
from simulator.collectives import fabric_of
from simulator.collectives.standalone import collective_schedule
from simulator.engine.core import simulate
from simulator.run.prepared import layout_of
from simulator.schedule.core import Schedule
from simulator.workloads.shape import DecodeShape

COLLECTIVES = ((4, "tree", 1.0, "allreduce"), (2, "ring", 0.25, "allreduce"), (2, "auto", 0.001, "allreduce"),
               (1, "auto", 1.0, "allgather"), (2, "ring", 0.1, "reduce-scatter"), (2, "auto", 0.05, "alltoall"),
               (2, "ring", 0.3, "broadcast"))
DECODES = (("dgx-h100", 8, "ring", 200_000), ("dgx-h100", 4, "tree", 300_000), ("dgx-a100", 2, "tree-p2p", 100_000),
           ("mi300x", 1, "ring-q", 50_000))


def cases() -> Iterator[tuple[str, Schedule, Cluster]]:
    for nodes, algo, gib, operation in COLLECTIVES:
        cluster = load_topology("dgx-h100", {"nodes": nodes})
        sched, _ = collective_schedule(cluster, fabric_of(cluster), operation, int(gib * 2**30) // 2, 2, "bf16",
                                       algo)
        yield f"{operation}:{algo}:dgx-h100x{nodes}:{gib:g}GiB", sched, cluster
    for preset, nodes, algo, context in DECODES:
        cluster = load_topology(preset, {"nodes": nodes})
        shape = DecodeShape(batch=2, heads=16, head_dim=128, kv_heads=16, context=context, dtype="bf16")
        name, params = resolve(algo)
        yield f"decode:{algo}:{preset}x{nodes}", build_schedule(name, params, shape, layout_of(cluster)), cluster


def _digest(items: Iterator[tuple[object, ...]]) -> str:
    h = hashlib.sha256()
    for item in items:
        h.update(repr(tuple(x.hex() if isinstance(x, float) else x for x in item)).encode())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--links", action="store_true", help="also digest the link loads (a second simulation)")
    args = ap.parse_args()
    print(f"{'case':40} {'ops':>7} {'events':>7} {'allocs':>6} {'records':>16}" + (f" {'links':>16}" if args.links
                                                                                   else ""))
    for label, sched, cluster in cases():
        res = simulate(sched, cluster)
        line = (f"{label:40} {len(sched.ops):>7} {res.events:>7} {res.allocations:>6} "
                f"{_digest((r.op, r.start, r.end) for r in res.timeline):>16}")
        if args.links:
            line += f" {_digest(iter(simulate(sched, cluster, True).link_load)):>16}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
