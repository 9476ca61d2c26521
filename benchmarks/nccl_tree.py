"""Engine time against the tuner's prediction for NCCL's ring and tree allreduce (issue 12's tree defect).

For every topology, size and (algorithm, protocol): the simulated makespan of the schedule the builders emit, the
``auto`` tuner's prediction for the same choice, their ratio, and the busbw each implies.

    PYTHONPATH=. python benchmarks/nccl_tree.py [--sizes 1MiB,16MiB,...] [--protocols Simple,LL128,LL]
"""

from __future__ import annotations

import argparse

from simulator.cluster.topology import load_topology
from simulator.collective_rows import collective_schedule
from simulator.collectives import fabric_of
from simulator.collectives.tuner import predict
from simulator.engine.core import simulate
from simulator.units import parse_bytes

TOPOLOGIES = (("dgx-a100", 1), ("dgx-h100", 1), ("dgx-h100", 2), ("dgx-h100", 4), ("mi300x", 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1MiB,16MiB,256MiB,1GiB")
    ap.add_argument("--protocols", default="Simple,LL128,LL")
    ap.add_argument("--algos", default="ring,tree")
    args = ap.parse_args()
    sizes = [int(parse_bytes(s)) for s in args.sizes.split(",")]
    print(f"{'topology':12} {'bytes':>11} {'choice':14} {'ch':>3} {'engine_ms':>10} {'tuner_ms':>10} "
          f"{'eng/tun':>8} {'busbw_eng':>9} {'busbw_tun':>9}")
    for name, nodes in TOPOLOGIES:
        cluster = load_topology(name, {"nodes": nodes})
        fabric = fabric_of(cluster)
        p = len(cluster.ranks)
        for nbytes in sizes:
            n = nbytes // 2
            for algo in args.algos.split(","):
                for proto in args.protocols.split(","):
                    sched, choice = collective_schedule(cluster, fabric, "allreduce", n, 2, "bf16", algo, proto)
                    t = simulate(sched, cluster).makespan
                    pred = predict("allreduce", list(range(p)), n, choice, fabric, elem_bytes=2, dtype="bf16")
                    bus = 2 * (p - 1) / p * nbytes / 1e9
                    print(f"{name + ' x' + str(nodes):12} {nbytes:>11} {choice.algo + '/' + proto:14} "
                          f"{choice.channels:>3} {t * 1e3:>10.4f} {pred * 1e3:>10.4f} {t / pred:>8.3f} "
                          f"{bus / t:>9.1f} {bus / pred:>9.1f}")


if __name__ == "__main__":
    main()
