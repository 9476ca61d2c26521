"""``kind: decode`` points: one decode step of one attention layer, or of a whole model (``scope: model``), per
decode schedule of ``algorithms``.

Rows carry the stable columns (:data:`simulator.run.rows.STABLE`); ``compute_s`` and ``comm_s`` describe the
critical rank (the one that finishes last): its kernel time, and the rest of the latency, i.e. time spent waiting
on transfers (and on other ranks) that its compute did not hide. With ``scope: model`` a row is the whole step
(every layer's projections and MLP, TP collectives, attention, LM head: :func:`simulator.models.step.model_step`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from simulator.algorithms import AlgorithmSpec, build_schedule, label, resolve
from simulator.cluster.topology import Cluster
from simulator.engine import simulate
from simulator.errors import InputError
from simulator.models.precision import PARTS
from simulator.models.step import attention_layer, model_step
from simulator.numeric.decode import make_inputs, run_numeric
from simulator.run.prepared import Algorithm, Kind, PreparedPoint, Run, layout_of
from simulator.run.rows import Column, make_row, pick
from simulator.run.scenario import Point
from simulator.run.timing import result_numbers
from simulator.schedule.core import Schedule
from simulator.schedule.memory import out_of_memory
from simulator.support.limits import check_schedule
from simulator.workloads.decode import DecodeWorkload, weights_of
from simulator.workloads.shape import DecodeShape

__all__ = ["COLUMNS", "KIND", "NUMERIC_MAX_ELEMS", "algorithms_of", "check_weight_rates"]

NUMERIC_MAX_ELEMS = 200_000_000  # numeric mode holds q, K and V in memory

COLUMNS: tuple[Column, ...] = (
    *pick("scenario", "algorithm", "topology", "ranks", "nodes", "context", "batch", "heads", "head_dim", "dtype",
          "latency_s", "compute_s", "comm_s", "bytes_moved", "peak_mem_bytes", "oom", "events", "sim_wall_s",
          "max_abs_err"),
    Column("allreduce", "", "tree: the algorithm and protocol NCCL's tuning picks for its max and sum all-reduces",
           required=False),
    *pick("model", "tp"),
)


def algorithms_of(point: Point, registry: Mapping[str, AlgorithmSpec] | None = None) -> tuple[Algorithm, ...]:
    """The point's ``algorithms:`` resolved in ``registry`` (default: the decode schedules), labelled; the
    ``baseline:`` checked against their labels. Errors are the caller's to locate."""
    algos = []
    for i, entry in enumerate(point.scenario.algorithms):
        name, params = resolve(entry, field=f"algorithms.{i}", registry=registry)
        algos.append(Algorithm(name, params, label(name, params, registry)))
    labels = [a.label for a in algos]
    if point.scenario.baseline is not None and point.scenario.baseline not in labels:
        raise InputError(f"must be one of the algorithms ({', '.join(labels)}), got {point.scenario.baseline!r}",
                         field="baseline")
    return tuple(algos)


def check_weight_rates(weight_dtype: Any, dtype: str, cluster: Cluster) -> None:
    """A part with FP8 weights runs FP8 matmuls: every GPU kind must have an FP8 rate (an error located at the
    part, e.g. ``workload.weight_dtype.mlp``)."""
    prec = weights_of(weight_dtype, dtype)
    parts = [p for p in PARTS if prec.of(p) == "fp8"]
    if not parts or dtype == "fp8":  # fp8 activations are checked as the workload's dtype
        return
    for spec in {cluster.specs[n].name: cluster.specs[n] for n in cluster.ranks}.values():
        if "fp8" not in spec.peak_flops:
            where = "workload.weight_dtype" if isinstance(weight_dtype, str) else f"workload.weight_dtype.{parts[0]}"
            raise InputError(f"FP8 weights run FP8 matmuls, and device {spec.name!r} has no FP8 rate (has: "
                             f"{', '.join(sorted(spec.peak_flops))}); use bf16 weights on it", field=where)


def _prepare(point: Point, cluster: Cluster, numeric: bool) -> PreparedPoint:
    wl = point.scenario.workload
    assert isinstance(wl, DecodeWorkload)
    try:
        algos = algorithms_of(point)
        for i, algo in enumerate(algos):
            check_schedule(algo.name, len(cluster.ranks) // wl.tp, f"algorithms.{i}", point.force)
        for spec in {cluster.specs[n].name: cluster.specs[n] for n in cluster.ranks}.values():  # each GPU kind
            try:
                spec.flops_for(wl.dtype)
            except InputError as err:
                raise err.located(field="workload.dtype") from None
        check_weight_rates(wl.weight_dtype, wl.dtype, cluster)
        shape = wl.shape()
        _check(wl, shape, cluster, numeric)
    except InputError as err:
        raise point.locate(err) from None
    return PreparedPoint(point, cluster, "decode", numeric, algos, shape, layout_of(cluster))


def _check(wl: DecodeWorkload, shape: DecodeShape, cluster: Cluster, numeric: bool) -> None:
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


def _schedule(prep: PreparedPoint, algo: Algorithm) -> Schedule:
    """The attention schedule of ``algo`` (for ``scope: model``, one layer's attention)."""
    wl, shape = prep.workload, prep.shape
    if wl.tp > 1:
        return attention_layer(algo.name, algo.params, shape, wl.tp, prep.cluster)
    assert prep.layout is not None
    return build_schedule(algo.name, algo.params, shape, prep.layout)


def _row(prep: PreparedPoint, algo: Algorithm) -> tuple[dict[str, Any], Run | None]:
    """One algorithm's row, and its attention schedule with its simulation (None for ``scope: model``)."""
    wl, shape, cluster = prep.workload, prep.shape, prep.cluster
    common = {"scenario": prep.point.scenario.name, "algorithm": algo.label, "topology": cluster.name,
              "context": shape.context, "batch": shape.batch, "heads": shape.heads, "head_dim": shape.head_dim,
              "dtype": shape.dtype}
    if wl.scope == "model":
        t0 = time.perf_counter()
        step = model_step(wl.model_preset(), algo.name, algo.params, shape, wl.tp, cluster, wl.weights())
        wall = time.perf_counter() - t0
        values = {**common, "ranks": len(cluster.ranks), "nodes": cluster.num_hosts, "latency_s": step.latency_s,
                  "compute_s": step.compute_s, "comm_s": step.latency_s - step.compute_s,
                  "bytes_moved": step.bytes_moved, "peak_mem_bytes": max(step.peaks),
                  "oom": out_of_memory(zip(step.peaks, map(prep.capacity, cluster.ranks), strict=True)),
                  "events": step.events, "sim_wall_s": wall, "model": wl.model_name, "tp": wl.tp}
        return make_row("decode", COLUMNS, values, prep.point.columns()), None
    sched = _schedule(prep, algo)
    t0 = time.perf_counter()
    result = simulate(sched, cluster)
    wall = time.perf_counter() - t0
    gpus = sched.meta.get("compute_ranks", sched.ranks)  # a switch reducing in the network (NVLS) is no GPU
    place = sched.placement_on(cluster.ranks)[:gpus]
    numbers = result_numbers(sched, result)
    peaks = numbers["peaks"][:gpus]
    values = {**common, "ranks": gpus, "nodes": len(set(cluster.host_indices(place))), "latency_s": result.makespan,
              "compute_s": numbers["compute_s"], "comm_s": result.makespan - numbers["compute_s"],
              "bytes_moved": numbers["bytes_moved"], "peak_mem_bytes": max(peaks),
              "oom": out_of_memory(zip(peaks, map(prep.capacity, place), strict=True)), "events": result.events,
              "sim_wall_s": wall}
    if prep.numeric:
        values["max_abs_err"] = _numeric_error(sched, shape)
    if "allreduce" in sched.meta:  # what NCCL's rule picked for the schedule's allreduces
        values["allreduce"] = sched.meta["allreduce"]
    return make_row("decode", COLUMNS, values, prep.point.columns()), (algo.label, sched, result)


def _numeric_error(sched: Schedule, shape: DecodeShape, seed: int = 0) -> float:
    dtype = np.float64 if shape.dtype == "fp64" else np.float32
    inp = make_inputs(np.random.default_rng(seed), shape.batch, shape.heads, shape.kv_heads, shape.head_dim,
                      shape.context, dtype)
    return run_numeric(sched, inp).max_abs_err


def _simulate(prep: PreparedPoint, keep_runs: bool) -> tuple[list[dict[str, Any]], list[Run] | None]:
    rows, runs = [], []
    for algo in prep.algorithms:
        row, run = _row(prep, algo)
        rows.append(row)
        if keep_runs:
            runs.append(run if run is not None else _attention_run(prep, algo))
    return rows, runs if keep_runs else None


def _attention_run(prep: PreparedPoint, algo: Algorithm, record_links: bool = False) -> Run:
    sched = _schedule(prep, algo)
    return algo.label, sched, simulate(sched, prep.cluster, record_links)


def _runs(prep: PreparedPoint, record_links: bool) -> list[Run]:
    return [_attention_run(prep, algo, record_links) for algo in prep.algorithms]


KIND = Kind("decode", COLUMNS, _prepare, _simulate, _runs)
