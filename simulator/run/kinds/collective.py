"""Rows of a ``collective`` workload point: one collective over every GPU, per algorithm entry, in nccl-tests terms.

``algbw = bytes / time``; ``busbw = algbw x factor`` with nccl-tests' bus factors (``doc/PERFORMANCE.md``):
allreduce 2(n-1)/n; allgather, reduce-scatter, alltoall (n-1)/n; broadcast, reduce 1. An algorithm entry is a
name (``auto``, ``ring``, ``tree``, ``nvls``, ``hierarchical``, ``double-binary-tree``, ``recursive-doubling``,
``pairwise``) or ``{name: ring, protocol: LL128, channels: 4}``; ``chosen`` reports what ran
(``algorithm/protocol``), which for ``auto`` is NCCL's pick by the lowest predicted time. ``time_s`` is the
collective's latency (no ``latency_s`` column: that one means a decode step's).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from simulator.cluster.devices import DTYPE_BYTES
from simulator.cluster.topology import Cluster
from simulator.collectives import COLLECTIVE_ALGORITHMS, Choice, Fabric, collective, fabric_of, operation_algorithm
from simulator.collectives.protocols import PROTOCOLS
from simulator.engine.core import SimResult, simulate
from simulator.errors import InputError
from simulator.run.scenario import Point
from simulator.schedule.core import Schedule
from simulator.workloads.collective import CollectiveWorkload

__all__ = ["bus_factor", "check_collective", "collective_rows", "collective_runs", "collective_schedule"]



def bus_factor(collective_name: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor of ``collective_name`` on ``n`` ranks."""
    if collective_name == "allreduce":
        return 2 * (n - 1) / n
    if collective_name in ("allgather", "reduce-scatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def _entry(raw: str | Mapping[str, Any], field: str) -> tuple[str, str, int | None, str]:
    """(algorithm, protocol, channels, label) of one ``algorithms:`` entry."""
    spec: dict[str, Any] = {"name": raw} if isinstance(raw, str) else dict(raw)
    name = spec.pop("name", None)
    if name not in COLLECTIVE_ALGORITHMS:
        raise InputError(f"unknown collective algorithm {name!r}; valid: {', '.join(COLLECTIVE_ALGORITHMS)}",
                         field=field)
    protocol = spec.pop("protocol", "auto")
    if protocol not in ("auto", *PROTOCOLS):
        raise InputError(f"must be one of auto, {', '.join(PROTOCOLS)}, got {protocol!r}", field=f"{field}.protocol")
    channels = spec.pop("channels", None)
    if channels is not None and (isinstance(channels, bool) or not isinstance(channels, int) or channels < 1):
        raise InputError(f"must be a positive integer, got {channels!r}", field=f"{field}.channels")
    if spec:
        raise InputError(f"unknown key {next(iter(spec))!r}; valid: name, protocol, channels", field=field)
    extra = [f"{k}={v}" for k, v in (("protocol", protocol), ("channels", channels)) if v not in ("auto", None)]
    return name, protocol, channels, f"{name}[{','.join(extra)}]" if extra else name


def check_collective(point: Point, cluster: Cluster) -> None:
    """Fail fast on a bad algorithm entry, or on a cluster too small for a collective."""
    wl = point.scenario.workload
    assert isinstance(wl, CollectiveWorkload)
    fabric = fabric_of(cluster)
    for i, raw in enumerate(point.scenario.algorithms):
        try:
            algo = operation_algorithm(wl.collective, _entry(raw, f"algorithms.{i}")[0])
            if algo == "nvls" and not (fabric.nvls and fabric.nodes == 1):
                raise InputError(f"nvls needs one NVSwitch server with NVLink SHARP (H100, H200); topology "
                                 f"{cluster.name!r} has {fabric.nodes} server(s), NVLink SHARP: {fabric.nvls}")
        except InputError as err:
            raise point.locate(err.located(field=f"algorithms.{i}")) from None
    if len(cluster.ranks) < 2:
        raise point.locate(InputError("a collective needs at least 2 GPUs", field="topology"))


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
    sched = Schedule(len(placement), placement=tuple(placement), name=operation)
    _, choice = collective(sched, operation, list(range(len(cluster.ranks))), "x", n, fabric, algo=algo,
                           protocol=protocol, channels=channels, elem_bytes=elem_bytes, dtype=dtype, tag=operation,
                           deps={}, switch_rank=switch)
    return sched, choice


def collective_runs(point: Point, cluster: Cluster) -> list[tuple[str, Schedule, SimResult, dict[str, Any]]]:
    """Every algorithm entry of a collective point, built and simulated: (label, schedule, result, row)."""
    wl = point.scenario.workload
    assert isinstance(wl, CollectiveWorkload)
    check_collective(point, cluster)
    fabric = fabric_of(cluster)
    elem = DTYPE_BYTES[wl.dtype]
    n = max(1, int(wl.bytes // elem))
    p = len(cluster.ranks)
    out = []
    for i, raw in enumerate(point.scenario.algorithms):
        name, protocol, channels, label = _entry(raw, f"algorithms.{i}")
        try:
            sched, choice = collective_schedule(cluster, fabric, wl.collective, n, elem, wl.dtype, name, protocol,
                                                channels)
        except InputError as err:
            raise point.locate(err.located(field=f"algorithms.{i}")) from None
        except ValueError as err:
            raise point.locate(InputError(str(err), field=f"algorithms.{i}")) from None
        t0 = time.perf_counter()
        result = simulate(sched, cluster)
        wall = time.perf_counter() - t0
        seconds = result.makespan
        nbytes = n * elem
        algbw = nbytes / seconds / 1e9
        row = {"scenario": point.scenario.name, "algorithm": label, "topology": cluster.name, "ranks": p,
               "nodes": fabric.nodes, "dtype": wl.dtype,
               "bytes_moved": result.bytes_sent(), "events": result.events,
               "sim_wall_s": wall, "collective": wl.collective, "bytes": nbytes, "time_s": seconds,
               "algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor(wl.collective, p),
               "protocol": choice.protocol, "channels": choice.channels,
               "chosen": f"{choice.algo}/{choice.protocol}"}
        out.append((label, sched, result, row))
    return out


def collective_rows(point: Point, cluster: Cluster) -> list[dict[str, Any]]:
    """One row per algorithm entry of a collective point (columns: :data:`simulator.run.rows.COLLECTIVE_COLUMNS`)."""
    return [row for _, _, _, row in collective_runs(point, cluster)]
