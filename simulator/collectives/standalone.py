"""One collective over every GPU of a cluster, as a schedule of its own (what ``kind: collective`` points, nccl-tests
validation and calibration simulate), and nccl-tests' bus bandwidth factors.

``algbw = bytes / time``; ``busbw = algbw x factor`` with nccl-tests' bus factors (its ``doc/PERFORMANCE.md``):
allreduce 2(n-1)/n; allgather, reduce-scatter, alltoall (n-1)/n; broadcast, reduce 1.
"""

from __future__ import annotations

from simulator.cluster.topology import Cluster
from simulator.collectives import Choice, Fabric, choose_for, collective, operation_algorithm
from simulator.collectives.tuner import candidates
from simulator.schedule.core import Schedule

__all__ = ["bus_factor", "collective_candidates", "collective_choice", "collective_schedule"]


def bus_factor(collective_name: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor of ``collective_name`` on ``n`` ranks."""
    if collective_name == "allreduce":
        return 2 * (n - 1) / n
    if collective_name in ("allgather", "reduce-scatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def _switch_joins(fabric: Fabric, algo: str) -> bool:
    """Whether the NVSwitch joins a collective over every GPU as a rank (NVLS may run: one NVLS server)."""
    return fabric.nvls and fabric.nodes == 1 and algo in ("auto", "nvls")


def collective_candidates(cluster: Cluster, fabric: Fabric, operation: str, n: int, elem_bytes: int,
                          algo: str = "auto", protocol: str = "auto", channels: int | None = None) -> list[Choice]:
    """Every choice :func:`collective_choice` picks from (no prediction made: cheap at any size)."""
    return candidates(operation, operation_algorithm(operation, algo), protocol, list(range(len(cluster.ranks))),
                      fabric, channels, n * elem_bytes, switch=_switch_joins(fabric, algo))


def collective_choice(cluster: Cluster, fabric: Fabric, operation: str, n: int, elem_bytes: int, dtype: str,
                      algo: str = "auto", protocol: str = "auto", channels: int | None = None) -> Choice:
    """The choice :func:`collective_schedule` runs with, without building it (what the size limits read: the
    tuner's pick for ``auto``, kept per fabric, so that the build asks it again for nothing)."""
    ranks = list(range(len(cluster.ranks)))
    root = ranks[0] if operation in ("broadcast", "reduce") else None
    return choose_for(operation, ranks, n, fabric, algo=algo, protocol=protocol, channels=channels,
                      elem_bytes=elem_bytes, dtype=dtype, root=root, switch=_switch_joins(fabric, algo))


def collective_schedule(cluster: Cluster, fabric: Fabric, operation: str, n: int, elem_bytes: int, dtype: str,
                        algo: str = "auto", protocol: str = "auto", channels: int | None = None
                        ) -> tuple[Schedule, Choice]:
    """One ``operation`` of ``n`` elements over every GPU of ``cluster`` as a schedule, and the choice it runs with
    (the NVSwitch joins as a rank where NVLS may run)."""
    placement = list(cluster.ranks)
    switch = None
    if _switch_joins(fabric, algo):
        switch = len(placement)
        placement.append(fabric.switch[0])
    sched_meta = {} if switch is None else {"compute_ranks": switch}  # the switch is no GPU (the report says so)
    sched = Schedule(len(placement), placement=tuple(placement), name=operation, meta=sched_meta)
    _, choice = collective(sched, operation, list(range(len(cluster.ranks))), "x", n, fabric, algo=algo,
                           protocol=protocol, channels=channels, elem_bytes=elem_bytes, dtype=dtype, tag=operation,
                           deps={}, switch_rank=switch)
    return sched, choice
