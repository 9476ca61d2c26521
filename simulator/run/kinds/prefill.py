"""``kind: prefill`` points: one prefill (forward) or training step (forward + backward) of one attention layer, or of
a whole model (``scope: model``), per prefill schedule of ``algorithms`` (docs/reference.md).

Rows add to the stable columns:

* ``phase``: ``prefill`` (forward only) or ``train`` (forward + backward);
* ``sequence``, ``layout``: the workload's (``context`` repeats ``sequence``);
* ``tflops_per_gpu``: model FLOPs (masked pairs not counted; backward 2.5x the forward) / latency / GPUs, in TFLOP/s;
* ``comm_hidden_frac``, ``imbalance``: :func:`simulator.run.timing.critical_timing`'s.

With ``scope: model`` (:func:`simulator.models.step.prefill_model`) a row is the whole prefill: ``latency_s`` every
layer's dense part and attention and the LM head, ``tflops_per_gpu`` the model's FLOPs
(:func:`~simulator.models.step.prefill_model_flops`), ``comm_hidden_frac`` and ``imbalance`` those of one layer's
attention; the optional columns ``scope``, ``model`` and ``tp`` say so (``scope`` is in every prefill row).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from simulator.algorithms import Layout, resolve
from simulator.algorithms.prefill import PREFILL_REGISTRY, build_prefill, check_prefill, check_ulysses, usp_degrees
from simulator.algorithms.prefill.rule import AUTO_CANDIDATES
from simulator.cluster.topology import Cluster
from simulator.engine.core import simulate
from simulator.errors import InputError
from simulator.models.step import attention_layer, prefill_model, prefill_model_flops, tp_shape
from simulator.numeric.prefill import make_prefill_inputs, run_prefill_numeric
from simulator.run.kinds.decode import algorithms_of, check_weight_rates
from simulator.run.prepared import Algorithm, Kind, PreparedPoint, Run, layout_of
from simulator.run.rows import STABLE, Column, make_row, pick
from simulator.run.scenario import Point
from simulator.run.timing import critical_timing
from simulator.schedule.core import Schedule
from simulator.schedule.memory import out_of_memory, timeline_peaks
from simulator.support.limits import check_schedule
from simulator.workloads.prefill import PrefillWorkload

__all__ = ["COLUMNS", "KIND", "NUMERIC_MAX_SCORES", "PHASE_COLUMNS", "candidates", "cp_layout"]

NUMERIC_MAX_SCORES = 50_000_000  # the dense reference holds batch x heads x sequence^2 scores

# the columns a prefill adds to the stable ones (a generate row has them too)
PHASE_COLUMNS: tuple[Column, ...] = (
    Column("phase", "", "prefill (forward only), train (forward + backward) or generate"),
    Column("sequence", "tokens", "the prompt's tokens (prefill: the sequence)"),
    Column("layout", "", "how the sequence is laid out over the ranks: contiguous, zigzag or striped"),
    Column("tflops_per_gpu", "TFLOP/s", "model FLOPs (masked pairs not counted; a backward 2.5x the forward; "
                                        "scope: model, every layer's) / latency / GPUs"),
    Column("comm_hidden_frac", "", "of the critical rank's transfer time, the share during which it was computing, "
                                   "less what the transfers added to those kernels by holding SMs (NaN when it "
                                   "transfers nothing; scope: model, one layer's attention)"),
    Column("imbalance", "", "max / mean of the ranks' kernel time (scope: model, one layer's attention)"),
)

COLUMNS: tuple[Column, ...] = (
    *pick(*STABLE), *PHASE_COLUMNS, *pick("scope", "model", "tp", "max_abs_err"),
    Column("max_grad_err", "", "--numeric with backward: largest |difference| of dQ, dK, dV from dense attention's",
           required=False),
    Column("cached", "tokens", "tokens already in the KV cache before the sequence (a prefill on a cached prefix)",
           required=False),
    Column("chosen", "", "auto: the schedule it ran, the faster by simulation of ring (pass-KV) and ring-q (pass-Q)",
           required=False),
    Column("other_latency_s", "s", "auto: the latency of the schedule it did not choose (why it chose)",
           required=False),
    Column("degrees", "", "usp: its Ulysses degree (GPUs of a group) x ring degree (groups)", required=False),
)


def _prepare(point: Point, cluster: Cluster, numeric: bool) -> PreparedPoint:
    """Bad input, located: unknown algorithms, fewer tokens than ranks, Ulysses heads, tp, numeric size."""
    wl = point.scenario.workload
    assert isinstance(wl, PrefillWorkload)
    shape = wl.shape()
    layout = layout_of(cluster)
    try:
        algos = algorithms_of(point, PREFILL_REGISTRY)
        if layout.ranks % wl.tp:
            raise InputError(f"tp ({wl.tp}) must divide the {layout.ranks} GPUs of the topology", field="workload.tp")
        if numeric and wl.scope == "model":
            raise InputError("--numeric checks one attention layer (scope: attention)", field="workload.scope")
        p = layout.ranks // wl.tp  # the context-parallel group
        if shape.sequence < p:
            raise InputError(f"the sequence ({shape.sequence} tokens) must have at least one token per rank ({p} "
                             f"ranks)", field="workload.sequence")
        if wl.scope == "model":
            check_weight_rates(wl.weight_dtype, wl.dtype, cluster)
        for i, algo in enumerate(algos):
            if algo.name == "ulysses":
                check_ulysses(tp_shape(shape, wl.tp), p)
            check_prefill(algo.name, shape)
            if algo.name == "usp":
                usp_degrees(tp_shape(shape, wl.tp), cp_layout(cluster, wl.tp), algo.params["ulysses"],
                            f"algorithms.{i}")
            check_schedule(f"prefill:{algo.name}", p, f"algorithms.{i}", point.force)
        scores = shape.batch * shape.heads * shape.keys ** 2
        if numeric and scores > NUMERIC_MAX_SCORES:
            raise InputError(f"--numeric checks against dense attention: batch x heads x (cached + sequence)^2 = "
                             f"{scores:.3g} "
                             f"scores is over {NUMERIC_MAX_SCORES:.0e}; shrink it, e.g. --set workload.sequence=1024",
                             field="workload.sequence")
    except InputError as err:
        raise point.locate(err) from None
    return PreparedPoint(point, cluster, "prefill", numeric, algos, shape, layout)


def _schedule(prep: PreparedPoint, algo: Algorithm) -> Schedule:
    assert prep.layout is not None
    try:
        return build_prefill(algo.name, algo.params, prep.shape, prep.layout)
    except InputError as err:
        raise prep.point.locate(err) from None


def candidates(algo: Algorithm) -> list[Algorithm]:
    """The schedules a row simulates for ``algo``: itself, or for ``auto`` pass-KV and pass-Q
    (:data:`~simulator.algorithms.prefill.rule.AUTO_CANDIDATES`, their default parameters but ``auto``'s ``p2p``)."""
    if algo.name != "auto":
        return [algo]
    return [Algorithm(*resolve({"name": name, "p2p": algo.params["p2p"]}, registry=PREFILL_REGISTRY), name)
            for name in AUTO_CANDIDATES]


def _attention_row(prep: PreparedPoint, algo: Algorithm) -> tuple[dict[str, Any], Run]:
    cluster, shape = prep.cluster, prep.shape
    wall, tried = 0.0, []
    for cand in candidates(algo):  # auto: the faster of pass-KV and pass-Q, by simulation
        sched = _schedule(prep, cand)
        t0 = time.perf_counter()
        result = simulate(sched, cluster)
        wall += time.perf_counter() - t0
        tried.append((result.makespan, cand.name, sched, result))
    _, chosen, sched, result = min(tried, key=lambda t: t[0])
    other = min((t[0] for t in tried if t[1] != chosen), default=None)
    peaks = timeline_peaks(sched, result)
    place = sched.placement_on(cluster.ranks)
    timing = critical_timing(result, sched.ranks)
    values: dict[str, Any] = {
        "scenario": prep.point.scenario.name, "algorithm": algo.label, "topology": cluster.name,
        "ranks": sched.ranks, "nodes": len(set(cluster.host_indices(place))), "context": shape.sequence,
        "batch": shape.batch, "heads": shape.heads, "head_dim": shape.head_dim, "dtype": shape.dtype,
        "latency_s": result.makespan, "compute_s": timing["compute_s"], "comm_s": timing["comm_s"],
        "bytes_moved": result.bytes_sent(), "peak_mem_bytes": max(peaks),
        "oom": out_of_memory(zip(peaks, map(prep.capacity, place), strict=True)), "events": result.events,
        "sim_wall_s": wall,
        "phase": "train" if shape.backward else "prefill", "sequence": shape.sequence, "layout": shape.layout,
        "tflops_per_gpu": shape.model_flops / result.makespan / sched.ranks / 1e12 if result.makespan else 0.0,
        "comm_hidden_frac": timing["comm_hidden_frac"], "imbalance": timing["imbalance"], "scope": "attention",
        **_extra(prep, algo, chosen, other),
    }
    if prep.numeric:
        dtype = np.float64 if shape.dtype == "fp64" else np.float32
        inp = make_prefill_inputs(np.random.default_rng(0), shape.batch, shape.heads, shape.kv_heads,
                                  shape.head_dim, shape.keys, shape.causal, dtype)  # a cached prefix's too
        res = run_prefill_numeric(sched, inp)
        values["max_abs_err"] = res.max_abs_err
        if shape.backward:
            values["max_grad_err"] = res.max_grad_err
    return make_row("prefill", COLUMNS, values, prep.point.columns()), (algo.label, sched, result)


def _model_row(prep: PreparedPoint, algo: Algorithm) -> dict[str, Any]:
    """The row of a whole prefill (``scope: model``)."""
    wl, cluster, shape, layout = prep.workload, prep.cluster, prep.shape, prep.layout
    assert layout is not None
    t0 = time.perf_counter()
    try:  # auto: the faster whole prefill of pass-KV and pass-Q
        tried = [(prefill_model(wl.model_preset(), cand.name, cand.params, shape, wl.tp, cluster, layout.fabric,
                                wl.weights()), cand.name) for cand in candidates(algo)]
        step, chosen = min(tried, key=lambda t: t[0].latency_s)
    except InputError as err:
        raise prep.point.locate(err) from None
    wall = time.perf_counter() - t0
    assert step.attention is not None
    p = len(cluster.ranks)
    timing = critical_timing(step.attention, p)
    values = {
        "scenario": prep.point.scenario.name, "algorithm": algo.label, "topology": cluster.name, "ranks": p,
        "nodes": cluster.num_hosts, "context": shape.sequence, "batch": shape.batch, "heads": shape.heads,
        "head_dim": shape.head_dim, "dtype": shape.dtype, "latency_s": step.latency_s, "compute_s": step.compute_s,
        "comm_s": step.latency_s - step.compute_s, "bytes_moved": step.bytes_moved, "peak_mem_bytes": max(step.peaks),
        "oom": out_of_memory(zip(step.peaks, map(prep.capacity, cluster.ranks), strict=True)), "events": step.events,
        "sim_wall_s": wall, "phase": "prefill", "sequence": shape.sequence, "layout": shape.layout,
        "tflops_per_gpu": prefill_model_flops(wl.model_preset(), shape) / step.latency_s / p / 1e12,
        "comm_hidden_frac": timing["comm_hidden_frac"], "imbalance": timing["imbalance"], "scope": "model",
        "model": wl.model if isinstance(wl.model, str) else "custom", "tp": wl.tp,
        **_extra(prep, algo, chosen, min((s.latency_s for s, name in tried if name != chosen), default=None)),
    }
    return make_row("prefill", COLUMNS, values, prep.point.columns())


def _extra(prep: PreparedPoint, algo: Algorithm, chosen: str, other: float | None = None) -> dict[str, Any]:
    """The optional columns: a cached prefix's tokens, what ``auto`` chose and the latency of what it did not,
    ``usp``'s degrees."""
    shape, wl = prep.shape, prep.workload
    out: dict[str, Any] = {"cached": shape.cached} if shape.cached else {}
    if algo.name == "auto":
        out["chosen"] = chosen
        if other is not None:
            out["other_latency_s"] = other
    if algo.name == "usp":
        u, r = usp_degrees(tp_shape(shape, wl.tp), cp_layout(prep.cluster, wl.tp), algo.params["ulysses"])
        out["degrees"] = f"ulysses {u} x ring {r}"
    return out


def cp_layout(cluster: Cluster, tp: int) -> Layout:
    """The layout of one context-parallel group: GPU 0 of every group of ``tp`` (the cluster's, with ``tp`` 1)."""
    return Layout(cluster.host_indices(cluster.ranks[::tp]))


def _simulate(prep: PreparedPoint, keep_runs: bool) -> tuple[list[dict[str, Any]], list[Run] | None]:
    if prep.workload.scope == "model":
        rows = [_model_row(prep, algo) for algo in prep.algorithms]
        return rows, _runs(prep, False) if keep_runs else None
    done = [_attention_row(prep, algo) for algo in prep.algorithms]
    return [row for row, _ in done], [run for _, run in done] if keep_runs else None


def _runs(prep: PreparedPoint, record_links: bool) -> list[Run]:
    """Every algorithm of a prefill point simulated, with its schedule and full result (timelines, traces); for
    ``scope: model``, one layer's attention."""
    wl, layout = prep.workload, prep.layout
    assert layout is not None
    runs = []
    for algo in prep.algorithms:
        tried = []
        for cand in candidates(algo):  # auto: the faster one's
            if wl.scope == "model":
                sched = attention_layer(cand.name, cand.params, prep.shape, wl.tp, prep.cluster, build=build_prefill,
                                        fabric=layout.fabric)
            else:
                sched = _schedule(prep, cand)
            result = simulate(sched, prep.cluster, record_links)
            tried.append((result.makespan, sched, result))
        _, sched, result = min(tried, key=lambda t: t[0])
        runs.append((algo.label, sched, result))
    return runs


KIND = Kind("prefill", COLUMNS, _prepare, _simulate, _runs)
