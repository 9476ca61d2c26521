"""Run sweep points: build the cluster and the schedule of each point, simulate, derive result rows.

Decode rows carry the stable columns of design.md. ``compute_s`` and ``comm_s`` describe the critical rank (the
one that finishes last): its kernel time, and the rest of the latency, i.e. time spent waiting on transfers (and
on other ranks) that its compute did not hide.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from simulator.algorithms import Layout, build_schedule, label, resolve
from simulator.cluster.topology import Cluster, load_topology
from simulator.engine.core import SimResult, simulate
from simulator.errors import InputError
from simulator.gcpause import gc_paused
from simulator.memory import peak_memory
from simulator.models import PRESETS
from simulator.modelstep import attention_layer, model_step
from simulator.numeric import make_inputs, run_numeric
from simulator.scenario import DecodeWorkload, FlowsWorkload, Point
from simulator.schedule import COMPUTE_KINDS, Schedule
from simulator.workloads.shape import DecodeShape

__all__ = ["DECODE_COLUMNS", "FLOW_COLUMNS", "NUMERIC_MAX_ELEMS", "cluster_for", "decode_rows", "flows_schedule",
           "point_runs", "result_numbers", "run_point"]

FLOW_COLUMNS = ["flow", "src", "dst", "bytes", "start_s", "finish_s"]
DECODE_COLUMNS = ["scenario", "algorithm", "topology", "ranks", "nodes", "context", "batch", "heads", "head_dim",
                  "dtype", "latency_s", "compute_s", "comm_s", "bytes_moved", "peak_mem_bytes", "oom", "events",
                  "sim_wall_s"]
NUMERIC_MAX_ELEMS = 200_000_000  # numeric mode holds q, K and V in memory

_CLUSTERS: dict[tuple[str, str, str], Cluster] = {}


def cluster_for(point: Point) -> Cluster:
    """The point's cluster (cached per topology and parameters); errors located in the scenario file."""
    sc = point.scenario
    key = (sc.topology, repr(sorted(sc.topology_params.items())), str(point.base_dir))
    if key not in _CLUSTERS:
        try:
            _CLUSTERS[key] = load_topology(sc.topology, sc.topology_params, point.base_dir)
        except InputError as err:
            raise point.locate(err) from None
    return _CLUSTERS[key]


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
    """Ranks on the cluster's first ``ranks`` GPUs, with their server indices."""
    nodes = cluster.ranks[: ranks or len(cluster.ranks)]
    index: dict[str, int] = {}
    return Layout(tuple(index.setdefault(cluster.host_of(n), len(index)) for n in nodes))


def _critical_split(result: SimResult) -> tuple[float, float]:
    """(compute_s, comm_s) of the rank that finishes last."""
    if not result.end_time:
        return 0.0, 0.0
    rank = result.critical_rank()
    compute = sum(rec.end - rec.start for rec in result.timeline if rec.rank == rank and rec.kind in COMPUTE_KINDS)
    return compute, result.end_time[rank] - compute


def result_numbers(sched: Schedule, result: SimResult, cluster: Cluster) -> dict[str, Any]:
    """latency_s, compute_s, comm_s, bytes_moved, peak_mem_bytes and oom of one simulated schedule."""
    with gc_paused():  # millions of live ops and records: a collection would walk them all for nothing
        held = {op.id for op in sched.ops if op.alloc or op.free}  # the ops whose times memory needs
        times = {rec.op: (rec.start, rec.end) for rec in result.timeline if rec.op in held}
        peaks = peak_memory(sched, times)
    place = sched.placement_on(cluster.ranks)
    compute_s, comm_s = _critical_split(result)
    return {"latency_s": result.makespan, "compute_s": compute_s, "comm_s": comm_s,
            "bytes_moved": sum(rec.nbytes for rec in result.timeline if rec.kind == "send"),
            "peak_mem_bytes": max(peaks),
            "oom": any(peak > cluster.specs[place[r]].mem_bytes for r, peak in enumerate(peaks))}


def decode_rows(point: Point, cluster: Cluster, numeric: bool = False, seed: int = 0) -> list[dict[str, Any]]:
    """One row per algorithm of a decode point."""
    sc = point.scenario
    wl = sc.workload
    assert isinstance(wl, DecodeWorkload)
    shape = wl.shape()
    _check_decode(point, cluster, numeric)
    layout = layout_of(cluster)
    rows = []
    for i, entry in enumerate(sc.algorithms):
        try:
            name, params = resolve(entry, field=f"algorithms.{i}")
        except InputError as err:
            raise point.locate(err) from None
        if wl.scope == "model":
            rows.append(_model_row(point, cluster, name, params, shape))
            continue
        sched = (attention_layer(name, params, shape, wl.tp, cluster) if wl.tp > 1
                 else build_schedule(name, params, shape, layout))
        t0 = time.perf_counter()
        result = simulate(sched, cluster)
        wall = time.perf_counter() - t0
        place = sched.placement_on(cluster.ranks)
        row: dict[str, Any] = {
            "scenario": sc.name, "algorithm": label(name, params), "topology": cluster.name, "ranks": sched.ranks,
            "nodes": len({cluster.host_of(n) for n in place}), "context": shape.context, "batch": shape.batch,
            "heads": shape.heads, "head_dim": shape.head_dim, "dtype": shape.dtype,
            **result_numbers(sched, result, cluster), "events": result.events, "sim_wall_s": wall,
        }
        if numeric:
            row["max_abs_err"] = _numeric_error(sched, shape, seed)
        rows.append(row)
    return rows


def _check_decode(point: Point, cluster: Cluster, numeric: bool) -> None:
    wl = point.scenario.workload
    assert isinstance(wl, DecodeWorkload)
    if len(cluster.ranks) % wl.tp:
        raise point.locate(InputError(f"tp ({wl.tp}) must divide the {len(cluster.ranks)} GPUs of the topology",
                                      field="workload.tp"))
    if numeric and (wl.tp > 1 or wl.scope == "model"):
        raise point.locate(InputError("--numeric checks one attention layer without tensor parallelism (tp: 1, "
                                      "scope: attention)", field="workload.scope"))


def _model_row(point: Point, cluster: Cluster, name: str, params: dict[str, Any], shape: DecodeShape
               ) -> dict[str, Any]:
    wl = point.scenario.workload
    assert isinstance(wl, DecodeWorkload) and isinstance(wl.model, str)
    t0 = time.perf_counter()
    step = model_step(PRESETS[wl.model], name, params, shape, wl.tp, cluster)
    wall = time.perf_counter() - t0
    return {
        "scenario": point.scenario.name, "algorithm": label(name, params), "topology": cluster.name,
        "ranks": len(cluster.ranks), "nodes": cluster.num_hosts, "context": shape.context, "batch": shape.batch,
        "heads": shape.heads, "head_dim": shape.head_dim, "dtype": shape.dtype, "latency_s": step.latency_s,
        "compute_s": step.compute_s, "comm_s": step.latency_s - step.compute_s, "bytes_moved": step.bytes_moved,
        "peak_mem_bytes": max(step.peaks),
        "oom": any(peak > cluster.specs[n].mem_bytes for n, peak in zip(cluster.ranks, step.peaks, strict=True)),
        "events": step.events, "sim_wall_s": wall, "model": wl.model, "tp": wl.tp,
    }


def _check_numeric_size(shape: DecodeShape) -> None:
    elems = shape.batch * shape.context * shape.kv_heads * shape.head_dim
    if elems > NUMERIC_MAX_ELEMS:
        raise InputError(f"--numeric holds K and V in memory: batch x context x kv_heads x head_dim = {elems:.3g} "
                         f"elements is over {NUMERIC_MAX_ELEMS:.0e}; shrink it, e.g. --set workload.context=65536",
                         field="workload.context")


def _numeric_error(sched: Schedule, shape: DecodeShape, seed: int) -> float:
    _check_numeric_size(shape)
    dtype = np.float64 if shape.dtype == "fp64" else np.float32
    inp = make_inputs(np.random.default_rng(seed), shape.batch, shape.heads, shape.kv_heads, shape.head_dim,
                      shape.context, dtype)
    return run_numeric(sched, inp).max_abs_err


def flow_rows(point: Point, cluster: Cluster) -> list[dict[str, Any]]:
    wl = point.scenario.workload
    assert isinstance(wl, FlowsWorkload)
    try:
        sched = flows_schedule(wl, cluster)
    except InputError as err:
        raise point.locate(err) from None
    ends = simulate(sched, cluster).op_ends()
    return [{"flow": i, "src": f.src, "dst": f.dst, "bytes": f.bytes, "start_s": f.start, "finish_s": ends[2 * i + 1]}
            for i, f in enumerate(wl.flows)]


def run_point(point: Point, numeric: bool = False) -> list[dict[str, Any]]:
    """Simulate one sweep point; its rows carry one extra column per swept key."""
    cluster = cluster_for(point)
    if isinstance(point.scenario.workload, FlowsWorkload):
        if numeric:
            raise InputError("--numeric needs a decode workload", field="workload.kind")
        rows = flow_rows(point, cluster)
    else:
        rows = decode_rows(point, cluster, numeric)
    swept = dict(point.swept)
    return [{**row, **swept} for row in rows]


def check_points(points: Sequence[Point], numeric: bool = False) -> None:
    """Fail fast on bad input in any point (topology, algorithm names, numeric size), before simulating."""
    for point in points:
        cluster_for(point)
        wl = point.scenario.workload
        if not isinstance(wl, DecodeWorkload):
            if numeric:
                raise InputError("--numeric needs a decode workload", file=point.source, field="workload.kind")
            try:
                flows_schedule(wl, cluster_for(point))  # every endpoint exists
            except InputError as err:
                raise point.locate(err) from None
            continue
        for i, entry in enumerate(point.scenario.algorithms):
            try:
                resolve(entry, field=f"algorithms.{i}")
            except InputError as err:
                raise point.locate(err) from None
        _check_decode(point, cluster_for(point), numeric)
        if numeric:
            try:
                _check_numeric_size(wl.shape())
            except InputError as err:
                raise point.locate(err) from None


def point_runs(point: Point, record_links: bool = False) -> list[tuple[str, Schedule, SimResult]]:
    """Every algorithm of one point simulated again, with its schedule and full result (for timelines, traces)."""
    cluster = cluster_for(point)
    wl = point.scenario.workload
    if isinstance(wl, FlowsWorkload):
        sched = flows_schedule(wl, cluster)
        return [("flows", sched, simulate(sched, cluster, record_links))]
    shape, layout = wl.shape(), layout_of(cluster)
    runs = []
    for entry in point.scenario.algorithms:  # for scope: model, one layer's attention
        name, params = resolve(entry)
        sched = (attention_layer(name, params, shape, wl.tp, cluster) if wl.tp > 1
                 else build_schedule(name, params, shape, layout))
        runs.append((label(name, params), sched, simulate(sched, cluster, record_links)))
    return runs
