"""Result rows of ``prefill`` points: one per algorithm, the stable columns plus the prefill ones (design.md).

* ``phase``: ``prefill`` (forward only) or ``train`` (forward + backward);
* ``sequence``, ``layout``: the workload's (``context`` repeats ``sequence``);
* ``tflops_per_gpu``: model FLOPs (masked pairs not counted; backward 2.5x the forward) / latency / GPUs, in TFLOP/s;
* ``comm_hidden_frac``: of the critical rank's (the last to finish) transfer time (the union of its sends' and
  receives' intervals), the share during which it was computing; NaN when it transfers nothing;
* ``imbalance``: max / mean of the ranks' compute time.

With ``scope: model`` (:func:`simulator.models.step.prefill_model`) a row is the whole prefill: ``latency_s`` every
layer's dense part and attention and the LM head, ``tflops_per_gpu`` the model's FLOPs
(:func:`~simulator.models.step.prefill_model_flops`), ``comm_hidden_frac`` and ``imbalance`` those of one layer's
attention; the extra columns ``scope``, ``model`` and ``tp`` say so (``scope`` is in every prefill row).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from simulator.algorithms import Layout, label, resolve
from simulator.algorithms.prefill import PREFILL_REGISTRY, build_prefill, check_ulysses
from simulator.cluster.topology import Cluster
from simulator.engine.core import SimResult, simulate
from simulator.errors import InputError
from simulator.models.step import attention_layer, prefill_model, prefill_model_flops, tp_shape
from simulator.numeric.prefill import make_prefill_inputs, run_prefill_numeric
from simulator.run.scenario import Point
from simulator.schedule.core import COMPUTE_KINDS, Schedule
from simulator.schedule.memory import timeline_peaks
from simulator.support.limits import check_schedule
from simulator.workloads.prefill import PrefillWorkload
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["NUMERIC_MAX_SCORES", "PREFILL_COLUMNS", "check_prefill", "prefill_rows", "prefill_runs", "prefill_timing"]

_TRANSFERS = frozenset({"send", "recv"})

PREFILL_COLUMNS = ["phase", "sequence", "layout", "tflops_per_gpu", "comm_hidden_frac", "imbalance"]
NUMERIC_MAX_SCORES = 50_000_000  # the dense reference holds batch x heads x sequence^2 scores


def _workload(point: Point) -> PrefillWorkload:
    wl = point.scenario.workload
    assert isinstance(wl, PrefillWorkload)
    return wl


def _algorithms(point: Point) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for i, entry in enumerate(point.scenario.algorithms):
        try:
            out.append(resolve(entry, field=f"algorithms.{i}", registry=PREFILL_REGISTRY))
        except InputError as err:
            raise point.locate(err) from None
    return out


def check_prefill(point: Point, layout: Layout, numeric: bool = False) -> None:
    """Bad input, located: unknown algorithms, fewer tokens than ranks, Ulysses heads, tp, numeric size."""
    wl = _workload(point)
    shape = wl.shape()
    try:
        if layout.ranks % wl.tp:
            raise InputError(f"tp ({wl.tp}) must divide the {layout.ranks} GPUs of the topology", field="workload.tp")
        if numeric and wl.scope == "model":
            raise InputError("--numeric checks one attention layer (scope: attention)", field="workload.scope")
        p = layout.ranks // wl.tp  # the context-parallel group
        if shape.sequence < p:
            raise InputError(f"the sequence ({shape.sequence} tokens) must have at least one token per rank ({p} "
                             f"ranks)", field="workload.sequence")
        for i, (name, _) in enumerate(_algorithms(point)):
            if name == "ulysses":
                check_ulysses(tp_shape(shape, wl.tp), p)
            check_schedule(f"prefill:{name}", p, f"algorithms.{i}", point.force)
        scores = shape.batch * shape.heads * shape.sequence ** 2
        if numeric and scores > NUMERIC_MAX_SCORES:
            raise InputError(f"--numeric checks against dense attention: batch x heads x sequence^2 = {scores:.3g} "
                             f"scores is over {NUMERIC_MAX_SCORES:.0e}; shrink it, e.g. --set workload.sequence=1024",
                             field="workload.sequence")
    except InputError as err:
        raise point.locate(err) from None


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        elif b > a:
            merged.append((a, b))
    return merged


def _overlap(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    total, j = 0.0, 0
    for a, b in xs:
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            total += max(0.0, min(b, ys[k][1]) - max(a, ys[k][0]))
            k += 1
    return total


def prefill_timing(result: SimResult, ranks: int) -> dict[str, float]:
    """compute_s, comm_s, comm_hidden_frac of the critical rank; imbalance over all ranks."""
    kernels = result.ended(COMPUTE_KINDS)
    # every rank's kernel seconds, each added in timeline order (bincount adds its weights in array order)
    compute = np.bincount(result.rank_of[kernels], weights=result.end[kernels] - result.start[kernels],
                          minlength=ranks).astype(float).tolist()  # (float even when none ended)
    crit = result.critical_rank()

    def spans(ids: np.ndarray) -> list[tuple[float, float]]:
        return list(zip(result.start[ids].tolist(), result.end[ids].tolist(), strict=True))

    transfers = _union(spans(result.ended(_TRANSFERS, (crit,))))
    moved = sum(b - a for a, b in transfers)
    hidden = _overlap(transfers, _union(spans(result.ended(COMPUTE_KINDS, (crit,))))) / moved if moved > 0 else math.nan
    mean = sum(compute) / ranks
    return {"compute_s": compute[crit], "comm_s": result.end_time.get(crit, 0.0) - compute[crit],
            "comm_hidden_frac": hidden, "imbalance": max(compute) / mean if mean > 0 else 1.0}


def _schedule(point: Point, name: str, params: dict[str, Any], shape: PrefillShape, layout: Layout) -> Schedule:
    try:
        return build_prefill(name, params, shape, layout)
    except InputError as err:
        raise point.locate(err) from None


def prefill_rows(point: Point, cluster: Cluster, layout: Layout, numeric: bool = False, seed: int = 0
                 ) -> list[dict[str, Any]]:
    """One row per algorithm of a prefill point (the cluster's GPUs as ``layout``)."""
    check_prefill(point, layout, numeric)
    wl = _workload(point)
    shape = wl.shape()
    if wl.scope == "model":
        return [_model_row(point, cluster, layout, name, params) for name, params in _algorithms(point)]
    rows = []
    for name, params in _algorithms(point):
        sched = _schedule(point, name, params, shape, layout)
        t0 = time.perf_counter()
        result = simulate(sched, cluster)
        wall = time.perf_counter() - t0
        peaks = timeline_peaks(sched, result)
        place = sched.placement_on(cluster.ranks)
        timing = prefill_timing(result, sched.ranks)
        row: dict[str, Any] = {
            "scenario": point.scenario.name, "algorithm": label(name, params, PREFILL_REGISTRY),
            "topology": cluster.name, "ranks": sched.ranks, "nodes": len(set(cluster.host_indices(place))),
            "context": shape.sequence, "batch": shape.batch, "heads": shape.heads, "head_dim": shape.head_dim,
            "dtype": shape.dtype, "latency_s": result.makespan, "compute_s": timing["compute_s"],
            "comm_s": timing["comm_s"], "bytes_moved": result.bytes_sent(),
            "peak_mem_bytes": max(peaks),
            "oom": any(peak > cluster.specs[place[r]].mem_bytes for r, peak in enumerate(peaks)),
            "events": result.events, "sim_wall_s": wall,
            "phase": "train" if shape.backward else "prefill", "sequence": shape.sequence, "layout": shape.layout,
            "tflops_per_gpu": shape.model_flops / result.makespan / sched.ranks / 1e12 if result.makespan else 0.0,
            "comm_hidden_frac": timing["comm_hidden_frac"], "imbalance": timing["imbalance"], "scope": "attention",
        }
        if numeric:
            dtype = np.float64 if shape.dtype == "fp64" else np.float32
            inp = make_prefill_inputs(np.random.default_rng(seed), shape.batch, shape.heads, shape.kv_heads,
                                      shape.head_dim, shape.sequence, shape.causal, dtype)
            res = run_prefill_numeric(sched, inp)
            row["max_abs_err"] = res.max_abs_err
            if shape.backward:
                row["max_grad_err"] = res.max_grad_err
        rows.append(row)
    return rows


def _model_row(point: Point, cluster: Cluster, layout: Layout, name: str, params: dict[str, Any]
               ) -> dict[str, Any]:
    """The row of a whole prefill (``scope: model``)."""
    wl = _workload(point)
    shape = wl.shape()
    t0 = time.perf_counter()
    try:
        step = prefill_model(wl.model_preset(), name, params, shape, wl.tp, cluster, layout.fabric)
    except InputError as err:
        raise point.locate(err) from None
    wall = time.perf_counter() - t0
    assert step.attention is not None
    p = len(cluster.ranks)
    timing = prefill_timing(step.attention, p)
    return {
        "scenario": point.scenario.name, "algorithm": label(name, params, PREFILL_REGISTRY),
        "topology": cluster.name, "ranks": p, "nodes": cluster.num_hosts, "context": shape.sequence,
        "batch": shape.batch, "heads": shape.heads, "head_dim": shape.head_dim, "dtype": shape.dtype,
        "latency_s": step.latency_s, "compute_s": step.compute_s, "comm_s": step.latency_s - step.compute_s,
        "bytes_moved": step.bytes_moved, "peak_mem_bytes": max(step.peaks),
        "oom": any(peak > cluster.specs[n].mem_bytes for n, peak in zip(cluster.ranks, step.peaks, strict=True)),
        "events": step.events, "sim_wall_s": wall, "phase": "prefill", "sequence": shape.sequence,
        "layout": shape.layout, "tflops_per_gpu": prefill_model_flops(wl.model_preset(), shape) / step.latency_s / p
        / 1e12, "comm_hidden_frac": timing["comm_hidden_frac"], "imbalance": timing["imbalance"], "scope": "model",
        "model": wl.model if isinstance(wl.model, str) else "custom", "tp": wl.tp,
    }


def prefill_runs(point: Point, cluster: Cluster, layout: Layout, record_links: bool = False
                 ) -> list[tuple[str, Schedule, SimResult]]:
    """Every algorithm of a prefill point simulated, with its schedule and full result (timelines, traces); for
    ``scope: model``, one layer's attention."""
    check_prefill(point, layout)
    wl = _workload(point)
    shape = wl.shape()
    runs = []
    for name, params in _algorithms(point):
        if wl.scope == "model":
            sched = attention_layer(name, params, shape, wl.tp, cluster, build=build_prefill, fabric=layout.fabric)
        else:
            sched = _schedule(point, name, params, shape, layout)
        runs.append((label(name, params, PREFILL_REGISTRY), sched, simulate(sched, cluster, record_links)))
    return runs
