"""One path through a sweep point: prepare it once (every point-level check, located), run it, derive its rows.

:func:`prepare_point` turns a :class:`Point` into everything a run needs (the cluster, the workload shape, the
labelled schedules to run) and is the only place where point-level checks happen and errors get their file:line.
``check_points`` (fail fast before a sweep), :func:`run_point` (the sweep), :func:`point_runs` (timeline and
trace), ``plan`` and ``validate`` all start from it.

Decode rows carry the stable columns (docs/architecture.md, :mod:`simulator.run.rows`). ``compute_s`` and
``comm_s`` describe the critical rank (the one that finishes last): its kernel time, and the rest of the latency,
i.e. time spent waiting on transfers (and on other ranks) that its compute did not hide.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from simulator.algorithms import Layout, build_schedule, label, resolve
from simulator.cluster import Cluster, load_topology
from simulator.cluster.topology import override_devices
from simulator.collectives.fabric import fabric_of
from simulator.engine import SimResult, simulate
from simulator.errors import InputError
from simulator.models.step import attention_layer, model_step
from simulator.numeric.decode import make_inputs, run_numeric
from simulator.report.timeline import timeline_frame
from simulator.run.kinds.collective import check_collective, collective_runs
from simulator.run.kinds.generate import check_generate, generate_rows, generate_runs
from simulator.run.kinds.prefill import check_prefill, prefill_rows, prefill_runs
from simulator.run.rows import COLUMNS, make_row
from simulator.run.scenario import DecodeWorkload, FlowsWorkload, Point
from simulator.schedule.core import Schedule
from simulator.schedule.memory import timeline_peaks
from simulator.support.gcpause import gc_paused
from simulator.support.limits import check_schedule
from simulator.workloads import CollectiveWorkload, GenerateWorkload, PrefillWorkload
from simulator.workloads.shape import DecodeShape

__all__ = ["NUMERIC_MAX_ELEMS", "Algorithm", "PointOutcome", "PreparedPoint", "RunResult", "check_points",
           "cluster_for", "flows_schedule", "layout_of", "point_runs", "prepare_point", "result_numbers",
           "run_algorithm", "run_point", "simulate_point"]

NUMERIC_MAX_ELEMS = 200_000_000  # numeric mode holds q, K and V in memory

_CLUSTERS: dict[tuple[str, str, str, str], Cluster] = {}


def cluster_for(point: Point) -> Cluster:
    """The point's cluster (cached per topology and parameters); errors located in the scenario file."""
    sc = point.scenario
    devices = {name: o.model_dump(exclude_none=True) for name, o in sc.devices.items()}
    key = (sc.topology, json.dumps(sc.topology_params, sort_keys=True), str(point.base_dir),
           json.dumps(devices, sort_keys=True))  # plain scalars: never repr() an unbounded value
    if key not in _CLUSTERS:
        try:
            _CLUSTERS[key] = override_devices(load_topology(sc.topology, sc.topology_params, point.base_dir,
                                                            point.force), devices)
        except InputError as err:
            raise point.locate(err) from None
    return _CLUSTERS[key]


@dataclass(frozen=True)
class Algorithm:
    """One schedule of a point: its registry name, validated parameters and result label."""

    name: str
    params: dict[str, Any]
    label: str


@dataclass(frozen=True)
class PreparedPoint:
    """A checked sweep point: its cluster, workload shape (decode) and the algorithms to run.

    ``kind`` is the workload's kind; ``flows`` the flows workload's schedule (built once, while checking its
    endpoints). Collective, prefill and generate points are checked by their own modules
    (:mod:`simulator.run.kinds.collective`, :mod:`simulator.run.kinds.prefill`, :mod:`simulator.run.kinds.generate`).
    """

    point: Point
    cluster: Cluster
    numeric: bool
    shape: DecodeShape | None = None
    algorithms: tuple[Algorithm, ...] = ()
    flows: Schedule | None = None
    kind: str = "decode"

    @property
    def workload(self) -> Any:
        return self.point.scenario.workload

    def capacity(self, node: str) -> float:
        """Bytes a device may use before the point is out of memory: its memory x the scenario's mem_fraction."""
        return self.cluster.specs[node].mem_bytes * self.point.scenario.mem_fraction

    def schedule(self, algo: Algorithm) -> Schedule:
        """The attention schedule of ``algo`` (for ``scope: model``, one layer's attention)."""
        wl, shape = self.workload, self.shape
        assert isinstance(wl, DecodeWorkload) and shape is not None
        if wl.tp > 1:
            return attention_layer(algo.name, algo.params, shape, wl.tp, self.cluster)
        return build_schedule(algo.name, algo.params, shape, layout_of(self.cluster))


def prepare_point(point: Point, numeric: bool = False) -> PreparedPoint:
    """Check ``point`` and everything it names; raise a located :class:`InputError` on bad input."""
    cluster = cluster_for(point)
    wl = point.scenario.workload
    try:
        if isinstance(wl, FlowsWorkload):
            if numeric:
                raise InputError("--numeric needs a decode workload", field="workload.kind")
            return PreparedPoint(point, cluster, numeric, flows=flows_schedule(wl, cluster), kind="flows")
        if isinstance(wl, CollectiveWorkload) and numeric:
            raise InputError("--numeric needs a decode workload", field="workload.kind")
        if isinstance(wl, GenerateWorkload) and numeric:
            raise InputError("--numeric checks decode and prefill workloads, not generate", field="workload.kind")
    except InputError as err:
        raise point.locate(err) from None
    if isinstance(wl, CollectiveWorkload):
        check_collective(point, cluster)  # located there
        return PreparedPoint(point, cluster, numeric, kind="collective")
    if isinstance(wl, PrefillWorkload):
        check_prefill(point, layout_of(cluster), numeric)  # located there
        return PreparedPoint(point, cluster, numeric, kind="prefill")
    if isinstance(wl, GenerateWorkload):
        check_generate(point, layout_of(cluster))  # located there
        return PreparedPoint(point, cluster, numeric, kind="generate")
    try:
        assert isinstance(wl, DecodeWorkload)
        algos = []
        for i, entry in enumerate(point.scenario.algorithms):
            name, params = resolve(entry, field=f"algorithms.{i}")
            algos.append(Algorithm(name, params, label(name, params)))
        labels = [a.label for a in algos]
        if point.scenario.baseline is not None and point.scenario.baseline not in labels:
            raise InputError(f"must be one of the algorithms ({', '.join(labels)}), got {point.scenario.baseline!r}",
                             field="baseline")
        for i, algo in enumerate(algos):
            check_schedule(algo.name, len(cluster.ranks) // wl.tp, f"algorithms.{i}", point.force)
        for spec in {cluster.specs[n].name: cluster.specs[n] for n in cluster.ranks}.values():  # each GPU kind
            try:
                spec.flops_for(wl.dtype)
            except InputError as err:
                raise err.located(field="workload.dtype") from None
        shape = wl.shape()
        _check_decode(wl, shape, cluster, numeric)
    except InputError as err:
        raise point.locate(err) from None
    return PreparedPoint(point, cluster, numeric, shape, tuple(algos))


def _check_decode(wl: DecodeWorkload, shape: DecodeShape, cluster: Cluster, numeric: bool) -> None:
    if len(cluster.ranks) % wl.tp:
        raise InputError(f"tp ({wl.tp}) must divide the {len(cluster.ranks)} GPUs of the topology", field="workload.tp")
    if not numeric:
        return
    if wl.tp > 1 or wl.scope == "model":
        raise InputError("--numeric checks one attention layer without tensor parallelism (tp: 1, scope: attention)",
                         field="workload.scope")
    elems = shape.batch * shape.context * shape.kv_heads * shape.head_dim
    if elems > NUMERIC_MAX_ELEMS:
        raise InputError(f"--numeric holds K and V in memory: batch x context x kv_heads x head_dim = {elems:.3g} "
                         f"elements is over {NUMERIC_MAX_ELEMS:.0e}; shrink it, e.g. --set workload.context=65536",
                         field="workload.context")


def check_points(points: Sequence[Point], numeric: bool = False) -> list[PreparedPoint]:
    """Fail fast on bad input in any point (topology, algorithm names, numeric size), before simulating."""
    return [prepare_point(point, numeric) for point in points]


def flows_schedule(workload: FlowsWorkload, cluster: Cluster) -> Schedule:
    """One matched send/recv per flow; ranks are the distinct endpoints in order of first use."""
    compute_nodes = {n for n, k in cluster.graph.nodes(data="kind") if k in ("gpu", "cpu")}
    names: list[str] = []
    index: dict[str, int] = {}
    for i, flow in enumerate(workload.flows):
        for end in ("src", "dst"):
            node = getattr(flow, end)
            if node not in compute_nodes:
                sample = ", ".join(cluster.ranks[:3])
                raise InputError(f"unknown device {node!r} in topology {cluster.name!r} (devices such as {sample})",
                                 field=f"workload.flows.{i}.{end}")
            if node not in index:
                index[node] = len(names)
                names.append(node)
    sched = Schedule(len(names), placement=tuple(names), name="flows")
    for i, flow in enumerate(workload.flows):
        sched.add_transfer(index[flow.src], index[flow.dst], flow.bytes, f"flow{i}", not_before_s=flow.start)
    return sched


def layout_of(cluster: Cluster, ranks: int | None = None) -> Layout:
    """Ranks on the cluster's first ``ranks`` GPUs, with their server indices and the fabric their collectives run
    on as NCCL runs them; ranks that share host CPU cores (``host_cores``: processes talking over loopback, as gloo
    does in validation) run collectives as plain decompositions, without NCCL's channels and protocols."""
    fabric = None if cluster.host_cores else fabric_of(cluster)
    return Layout(cluster.host_indices(cluster.ranks[: ranks or len(cluster.ranks)]), fabric)


@dataclass(frozen=True)
class RunResult:
    """What one algorithm of a decode point gave: a decode step (one layer's attention, or the whole model)."""

    algorithm: str
    ranks: int
    nodes: int
    latency_s: float
    compute_s: float
    bytes_moved: float
    peaks: tuple[float, ...]  # per rank, bytes
    capacities: tuple[float, ...]  # per rank: its device's memory x mem_fraction, bytes
    events: int
    sim_wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)  # max_abs_err; model and tp for scope: model

    @property
    def comm_s(self) -> float:
        return self.latency_s - self.compute_s

    @property
    def peak_mem_bytes(self) -> float:
        return max(self.peaks)

    @property
    def oom(self) -> bool:
        return any(peak > cap for peak, cap in zip(self.peaks, self.capacities, strict=True))


def run_algorithm(prep: PreparedPoint, algo: Algorithm, seed: int = 0) -> RunResult:
    """Simulate one algorithm of a prepared decode point."""
    return _simulate(prep, algo, seed)[0]


def _simulate(prep: PreparedPoint, algo: Algorithm, seed: int = 0, record_links: bool = False
              ) -> tuple[RunResult, tuple[Schedule, SimResult] | None]:
    """The run's result, and the attention schedule with its simulation (None for ``scope: model``)."""
    wl, shape, cluster = prep.workload, prep.shape, prep.cluster
    assert isinstance(wl, DecodeWorkload) and shape is not None
    if wl.scope == "model":
        t0 = time.perf_counter()
        step = model_step(wl.model_preset(), algo.name, algo.params, shape, wl.tp, cluster, wl.weight_dtype)
        wall = time.perf_counter() - t0
        return RunResult(algo.label, len(cluster.ranks), cluster.num_hosts, step.latency_s, step.compute_s,
                         step.bytes_moved, tuple(step.peaks), tuple(prep.capacity(n) for n in cluster.ranks),
                         step.events, wall, {"model": wl.model_name, "tp": wl.tp}), None
    sched = prep.schedule(algo)
    t0 = time.perf_counter()
    result = simulate(sched, cluster, record_links)
    wall = time.perf_counter() - t0
    gpus = sched.meta.get("compute_ranks", sched.ranks)  # a switch reducing in the network (NVLS) is no GPU
    place = sched.placement_on(cluster.ranks)[:gpus]
    numbers = result_numbers(sched, result)
    peaks, compute_s = numbers["peaks"][:gpus], numbers["compute_s"]
    extra = {"max_abs_err": _numeric_error(sched, shape, seed)} if prep.numeric else {}
    if "allreduce" in sched.meta:  # what NCCL's rule picked for the schedule's allreduces
        extra["allreduce"] = sched.meta["allreduce"]
    run = RunResult(algo.label, gpus, len(set(cluster.host_indices(place))), result.makespan, compute_s,
                    numbers["bytes_moved"], tuple(peaks), tuple(prep.capacity(n) for n in place),
                    result.events, wall, extra)
    return run, (sched, result)


def result_numbers(sched: Schedule, result: SimResult) -> dict[str, Any]:
    """What a row takes from one simulated schedule: latency_s, compute_s and comm_s (the critical rank's),
    bytes_moved and the per-rank memory ``peaks``."""
    with gc_paused():  # millions of live ops and records: a collection would walk them all for nothing
        peaks = timeline_peaks(sched, result)
        compute_s, comm_s = result.critical_split()
        moved = result.bytes_sent()
    return {"latency_s": result.makespan, "compute_s": compute_s, "comm_s": comm_s, "bytes_moved": moved,
            "peaks": peaks}


def _numeric_error(sched: Schedule, shape: DecodeShape, seed: int) -> float:
    dtype = np.float64 if shape.dtype == "fp64" else np.float32
    inp = make_inputs(np.random.default_rng(seed), shape.batch, shape.heads, shape.kv_heads, shape.head_dim,
                      shape.context, dtype)
    return run_numeric(sched, inp).max_abs_err


def _decode_row(prep: PreparedPoint, run: RunResult) -> dict[str, Any]:
    sc, shape = prep.point.scenario, prep.shape
    assert shape is not None
    values = {"scenario": sc.name, "algorithm": run.algorithm, "topology": prep.cluster.name, "ranks": run.ranks,
              "nodes": run.nodes, "context": shape.context, "batch": shape.batch, "heads": shape.heads,
              "head_dim": shape.head_dim, "dtype": shape.dtype, "latency_s": run.latency_s,
              "compute_s": run.compute_s, "comm_s": run.comm_s, "bytes_moved": run.bytes_moved,
              "peak_mem_bytes": run.peak_mem_bytes, "oom": run.oom, "events": run.events,
              "sim_wall_s": run.sim_wall_s}
    return make_row("decode", values, run.extra, prep.point.columns())


def _phase_row(prep: PreparedPoint, row: dict[str, Any]) -> dict[str, Any]:
    """A prefill or generate row on the documented columns, out of memory against the usable memory."""
    columns = COLUMNS[prep.kind]
    values = {c: row[c] for c in columns}
    values["oom"] = row["peak_mem_bytes"] > min(prep.capacity(n) for n in prep.cluster.ranks)
    return make_row(prep.kind, values, {k: v for k, v in row.items() if k not in columns}, prep.point.columns())


def _flow_rows(prep: PreparedPoint, result: SimResult) -> list[dict[str, Any]]:
    wl, sched = prep.workload, prep.flows
    assert isinstance(wl, FlowsWorkload) and sched is not None
    recv_of = [op.id for op in sched.ops if op.kind == "recv"]  # flow i's receive, in flow order
    ends = result.end[recv_of].tolist()
    return [make_row("flows", {"flow": i, "src": f.src, "dst": f.dst, "bytes": f.bytes, "start_s": f.start,
                               "finish_s": ends[i]}, swept=prep.point.columns())
            for i, f in enumerate(wl.flows)]


@dataclass(frozen=True)
class PointOutcome:
    """The rows of one point and, when asked for, the per-rank timelines of its schedules (one simulation each)."""

    rows: list[dict[str, Any]]
    timeline: pd.DataFrame | None = None


def simulate_point(point: Point | PreparedPoint, numeric: bool = False, timeline: bool = False) -> PointOutcome:
    """Simulate every algorithm of one point once: its rows (one extra column per swept key) and, with
    ``timeline``, the timelines of the same simulations (for ``scope: model``, one layer's attention)."""
    prep = point if isinstance(point, PreparedPoint) else prepare_point(point, numeric)
    if prep.kind in ("prefill", "generate"):
        make = prefill_rows if prep.kind == "prefill" else generate_rows
        args = (prep.numeric,) if prep.kind == "prefill" else ()
        rows = [_phase_row(prep, row) for row in make(prep.point, prep.cluster, layout_of(prep.cluster), *args)]
        return PointOutcome(rows, timeline_frame(point_runs(prep)) if timeline else None)
    if prep.kind == "collective":
        done = collective_runs(prep.point, prep.cluster)
        rows = [make_row("collective", values, swept=prep.point.columns()) for _, _, _, values in done]
        frame = timeline_frame((lab, sched, res) for lab, sched, res, _ in done) if timeline else None
        return PointOutcome(rows, frame)
    if prep.flows is not None:
        result = simulate(prep.flows, prep.cluster)
        runs = [("flows", prep.flows, result)]
        return PointOutcome(_flow_rows(prep, result), timeline_frame(runs) if timeline else None)
    rows, runs = [], []
    for algo in prep.algorithms:
        run, sim = _simulate(prep, algo)
        rows.append(_decode_row(prep, run))
        if timeline:
            sched, result = sim if sim is not None else _attention_run(prep, algo)
            runs.append((algo.label, sched, result))
    return PointOutcome(rows, timeline_frame(runs) if timeline else None)


def run_point(point: Point | PreparedPoint, numeric: bool = False) -> list[dict[str, Any]]:
    """Simulate one sweep point; its rows carry one extra column per swept key."""
    return simulate_point(point, numeric).rows


def _attention_run(prep: PreparedPoint, algo: Algorithm, record_links: bool = False) -> tuple[Schedule, SimResult]:
    sched = prep.schedule(algo)
    return sched, simulate(sched, prep.cluster, record_links)


def point_runs(prep: PreparedPoint, record_links: bool = False) -> list[tuple[str, Schedule, SimResult]]:
    """Every algorithm of one point simulated with its schedule and full result (for traces); for ``scope: model``,
    one layer's attention."""
    if prep.kind == "prefill":
        return prefill_runs(prep.point, prep.cluster, layout_of(prep.cluster), record_links)
    if prep.kind == "generate":
        return generate_runs(prep.point, prep.cluster, layout_of(prep.cluster), record_links)
    if prep.kind == "collective":
        return [(lab, sched, simulate(sched, prep.cluster, True) if record_links else result)
                for lab, sched, result, _ in collective_runs(prep.point, prep.cluster)]
    if prep.flows is not None:
        return [("flows", prep.flows, simulate(prep.flows, prep.cluster, record_links))]
    return [(algo.label, *_attention_run(prep, algo, record_links)) for algo in prep.algorithms]
