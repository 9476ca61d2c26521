"""``kind: collective`` points: one collective over every GPU, per algorithm entry, in nccl-tests terms.

``algbw = bytes / time``; ``busbw = algbw x factor`` with nccl-tests' bus factors
(:func:`simulator.collectives.standalone.bus_factor`). An algorithm entry is a name (``auto``, ``ring``, ``tree``,
``nvls``, ``hierarchical``, ``double-binary-tree``, ``recursive-doubling``, ``pairwise``) or ``{name: ring,
protocol: LL128, channels: 4}``; ``chosen`` reports what ran (``algorithm/protocol``), which for ``auto`` is NCCL's
pick by the lowest predicted time. ``time_s`` is the collective's latency (no ``latency_s`` column: that one means
a decode step's).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from simulator.cluster.topology import Cluster
from simulator.collectives import COLLECTIVE_ALGORITHMS, fabric_of, operation_algorithm
from simulator.collectives.channels import Choice
from simulator.collectives.fabric import MAX_CHANNELS, Fabric
from simulator.collectives.nccl_tree import tree_parts
from simulator.collectives.protocols import PROTOCOLS
from simulator.collectives.standalone import bus_factor, collective_candidates, collective_choice, collective_schedule
from simulator.engine.core import simulate
from simulator.errors import InputError, excerpt
from simulator.run.prepared import Algorithm, Kind, PreparedPoint, Run
from simulator.run.rows import Column, make_row, pick
from simulator.run.scenario import Point
from simulator.support.limits import MAX_SCHEDULE_OPS, check_collective, collective_ops
from simulator.units import DTYPE_BYTES
from simulator.workloads.collective import CollectiveWorkload

__all__ = ["COLUMNS", "KIND"]

COLUMNS = (
    *pick("scenario", "algorithm", "topology", "ranks", "nodes", "dtype", "bytes_moved", "events", "sim_wall_s"),
    Column("collective", "", "the operation: allreduce, allgather, reduce-scatter, alltoall, broadcast, reduce"),
    Column("bytes", "bytes", "the message size (nccl-tests' size: elements x dtype bytes)"),
    Column("time_s", "s", "the collective's simulated time"),
    Column("algbw_GBps", "GB/s", "bytes / time_s (nccl-tests' algbw; GB = 1e9 bytes)"),
    Column("busbw_GBps", "GB/s", "algbw x nccl-tests' bus factor (allreduce 2(n-1)/n; allgather, reduce-scatter, "
                                 "alltoall (n-1)/n; broadcast, reduce 1)"),
    Column("protocol", "", "the NCCL protocol it ran with: LL, LL128 or Simple"),
    Column("channels", "", "NCCL channels it ran on"),
    Column("chosen", "", "what ran, algorithm/protocol (for auto: NCCL's pick by the lowest predicted time)"),
)


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
        raise InputError(f"must be a positive integer, got {excerpt(channels)}", field=f"{field}.channels")
    if channels is not None and channels > MAX_CHANNELS:
        raise InputError(f"must be at most {MAX_CHANNELS} (NCCL's MAXCHANNELS), got {excerpt(channels)}",
                         field=f"{field}.channels")
    if spec:
        raise InputError(f"unknown key {next(iter(spec))!r}; valid: name, protocol, channels", field=field)
    extra = [f"{k}={v}" for k, v in (("protocol", protocol), ("channels", channels)) if v not in ("auto", None)]
    return name, protocol, channels, f"{name}[{','.join(extra)}]" if extra else name


def _prepare(point: Point, cluster: Cluster, numeric: bool) -> PreparedPoint:
    """Fail fast on a bad algorithm entry, or on a cluster too small for a collective."""
    wl = point.scenario.workload
    assert isinstance(wl, CollectiveWorkload)
    fabric = fabric_of(cluster)
    algos = []
    for i, raw in enumerate(point.scenario.algorithms):
        try:
            name, protocol, channels, label = _entry(raw, f"algorithms.{i}")
            algo = operation_algorithm(wl.collective, name)
            if algo == "nvls" and not (fabric.nvls and fabric.nodes == 1):
                raise InputError(f"nvls needs one NVSwitch server with NVLink SHARP (H100, H200); topology "
                                 f"{cluster.name!r} has {fabric.nodes} server(s), NVLink SHARP: {fabric.nvls}")
            _check_size(wl, cluster, fabric, name, protocol, channels, point.force)
        except InputError as err:
            raise point.locate(err.located(field=f"algorithms.{i}")) from None
        except ValueError as err:
            raise point.locate(InputError(str(err), field=f"algorithms.{i}")) from None
        algos.append(Algorithm(name, {"protocol": protocol, "channels": channels}, label))
    if len(cluster.ranks) < 2:
        raise point.locate(InputError("a collective needs at least 2 GPUs", field="topology"))
    return PreparedPoint(point, cluster, "collective", numeric, tuple(algos), extra={"fabric": fabric})


def _elements(wl: CollectiveWorkload) -> tuple[int, int]:
    """(elements, bytes per element) of the workload's buffer."""
    elem = DTYPE_BYTES[wl.dtype]
    return max(1, int(wl.bytes // elem)), elem


def _check_size(wl: CollectiveWorkload, cluster: Cluster, fabric: Fabric, name: str, protocol: str,
                channels: int | None, force: bool) -> None:
    """Refuse an entry whose collective would have too many ops (:func:`~simulator.support.limits.
    check_collective`) with the algorithm and channels it runs with: ``auto``'s, the tuner's pick, which is asked
    only where some of its candidates are over the limit and some are not (a tuner's prediction can cost seconds on
    thousands of GPUs; where all are over, the smallest is refused)."""
    p = len(cluster.ranks)
    if p < 2 or force:
        return
    n, elem = _elements(wl)
    sizes = {len(g) for g in fabric.groups(range(p))}
    gpn = sizes.pop() if len(sizes) == 1 else p  # servers of different sizes: hierarchical runs a plain ring

    def parts(c: Choice) -> int | None:
        return tree_parts(n, elem, c.channels, c.protocol, fabric.nodes, p) if c.algo == "tree" else None

    def ops(c: Choice) -> float:
        return collective_ops(p, c.channels, c.algo, wl.collective, gpn, parts(c))

    options = collective_candidates(cluster, fabric, wl.collective, n, elem, name, protocol, channels)
    if not options or all(ops(c) <= MAX_SCHEDULE_OPS for c in options):
        return
    choice = min(options, key=ops)
    if ops(choice) <= MAX_SCHEDULE_OPS:  # some fit: the one that runs decides
        choice = collective_choice(cluster, fabric, wl.collective, n, elem, wl.dtype, name, protocol, channels)
    check_collective(p, choice.channels, None, force, choice.algo, wl.collective, gpn, parts(choice))


def _run(prep: PreparedPoint, i: int, algo: Algorithm) -> tuple[Run, dict[str, Any]]:
    """One algorithm entry built and simulated: (its run, its row)."""
    wl, cluster, fabric = prep.workload, prep.cluster, prep.extra["fabric"]
    n, elem = _elements(wl)
    p = len(cluster.ranks)
    try:
        sched, choice = collective_schedule(cluster, fabric, wl.collective, n, elem, wl.dtype, algo.name,
                                            algo.params["protocol"], algo.params["channels"])
    except InputError as err:
        raise prep.point.locate(err.located(field=f"algorithms.{i}")) from None
    except ValueError as err:
        raise prep.point.locate(InputError(str(err), field=f"algorithms.{i}")) from None
    t0 = time.perf_counter()
    result = simulate(sched, cluster)
    wall = time.perf_counter() - t0
    seconds = result.makespan
    nbytes = n * elem
    algbw = nbytes / seconds / 1e9
    values = {"scenario": prep.point.scenario.name, "algorithm": algo.label, "topology": cluster.name, "ranks": p,
              "nodes": fabric.nodes, "dtype": wl.dtype, "bytes_moved": result.bytes_sent(), "events": result.events,
              "sim_wall_s": wall, "collective": wl.collective, "bytes": nbytes, "time_s": seconds,
              "algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor(wl.collective, p), "protocol": choice.protocol,
              "channels": choice.channels, "chosen": f"{choice.algo}/{choice.protocol}"}
    return (algo.label, sched, result), make_row("collective", COLUMNS, values, prep.point.columns())


def _simulate(prep: PreparedPoint, keep_runs: bool) -> tuple[list[dict[str, Any]], list[Run] | None]:
    done = [_run(prep, i, algo) for i, algo in enumerate(prep.algorithms)]
    return [row for _, row in done], [run for run, _ in done] if keep_runs else None


def _runs(prep: PreparedPoint, record_links: bool) -> list[Run]:
    runs = [run for run, _ in (_run(prep, i, algo) for i, algo in enumerate(prep.algorithms))]
    if not record_links:
        return runs
    return [(lab, sched, simulate(sched, prep.cluster, True)) for lab, sched, _ in runs]


KIND = Kind("collective", COLUMNS, _prepare, _simulate, _runs, numeric="--numeric needs a decode workload")
