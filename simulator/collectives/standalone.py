"""One collective over every GPU of a cluster, as a schedule of its own (what ``kind: collective`` points, nccl-tests
validation and calibration simulate), and nccl-tests' bus bandwidth factors.

``algbw = bytes / time``; ``busbw = algbw x factor`` with nccl-tests' bus factors (its ``doc/PERFORMANCE.md``):
allreduce 2(n-1)/n; allgather, reduce-scatter, alltoall (n-1)/n; broadcast, reduce 1.
"""

from __future__ import annotations

from simulator.cluster.topology import Cluster
from simulator.collectives import Choice, Fabric, collective
from simulator.schedule.core import Schedule

__all__ = ["bus_factor", "collective_schedule"]


def bus_factor(collective_name: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor of ``collective_name`` on ``n`` ranks."""
    if collective_name == "allreduce":
        return 2 * (n - 1) / n
    if collective_name in ("allgather", "reduce-scatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def collective_schedule(cluster: Cluster, fabric: Fabric, operation: str, n: int, elem_bytes: int, dtype: str,
                        algo: str = "auto", protocol: str = "auto", channels: int | None = None
                        ) -> tuple[Schedule, Choice]:
    """One ``operation`` of ``n`` elements over every GPU of ``cluster`` as a schedule, and the choice it runs with
    (the NVSwitch joins as a rank where NVLS may run)."""
    placement = list(cluster.ranks)
    switch = None
    if fabric.nvls and fabric.nodes == 1 and algo in ("auto", "nvls"):
        switch = len(placement)
        placement.append(fabric.switch[0])
    sched_meta = {} if switch is None else {"compute_ranks": switch}  # the switch is no GPU (the report says so)
    sched = Schedule(len(placement), placement=tuple(placement), name=operation, meta=sched_meta)
    _, choice = collective(sched, operation, list(range(len(cluster.ranks))), "x", n, fabric, algo=algo,
                           protocol=protocol, channels=channels, elem_bytes=elem_bytes, dtype=dtype, tag=operation,
                           deps={}, switch_rank=switch)
    return sched, choice
