"""Result rows of ``generate`` points: prefill the prompt once with the workload's prefill schedule, then, for each
decode schedule of ``algorithms``, simulate every decode step (context = prompt + tokens generated so far).

Columns: the stable ones (``algorithm`` the decode schedule, ``context`` the prompt, ``latency_s`` the whole
request, ``compute_s`` the critical ranks' kernel time summed over the prefill and every step, ``comm_s`` the
rest, ``peak_mem_bytes`` the larger of the prefill's and the steps' peaks), then ``phase`` (``generate``),
``sequence`` (the prompt), ``layout``, ``tflops_per_gpu``, ``comm_hidden_frac`` and ``imbalance`` (of the prefill),
``prefill`` (its schedule), ``ttft_s`` (the prefill: time to first token), ``tpot_s`` (mean time per output token),
``new_tokens``, ``scope``.

With ``scope: model`` both phases are the whole model (:func:`simulator.models.step.prefill_model`, then
:func:`~simulator.models.step.model_step` per token, ``tp`` as given), ``tflops_per_gpu`` counts the model's FLOPs,
``comm_hidden_frac`` and ``imbalance`` are one prefill layer's attention's, and the rows add ``model`` and ``tp``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simulator.algorithms import Layout, build_schedule, label, resolve
from simulator.algorithms.prefill import PREFILL_REGISTRY, build_prefill, check_ulysses
from simulator.cluster.topology import Cluster
from simulator.engine.core import SimResult, simulate
from simulator.errors import InputError
from simulator.models.presets import ModelPreset
from simulator.models.step import StepResult, attention_layer, model_step, prefill_model, prefill_model_flops, tp_shape
from simulator.run.kinds.prefill import prefill_timing
from simulator.run.scenario import Point
from simulator.schedule.core import Schedule
from simulator.schedule.memory import timeline_peaks
from simulator.workloads.generate import GenerateWorkload

__all__ = ["check_generate", "generate_rows", "generate_runs"]


def _workload(point: Point) -> GenerateWorkload:
    wl = point.scenario.workload
    assert isinstance(wl, GenerateWorkload)
    return wl


def _schedules(point: Point) -> tuple[tuple[str, dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    """(the prefill schedule, the decode schedules), resolved and located."""
    wl = _workload(point)
    try:
        prefill = resolve(wl.prefill, field="workload.prefill", registry=PREFILL_REGISTRY)
        decode = [resolve(entry, field=f"algorithms.{i}") for i, entry in enumerate(point.scenario.algorithms)]
    except InputError as err:
        raise point.locate(err) from None
    return prefill, decode


def check_generate(point: Point, layout: Layout) -> None:
    """Bad input, located: schedule names, tp, fewer prompt tokens than ranks, Ulysses heads."""
    (name, _), _ = _schedules(point)
    wl = _workload(point)
    shape = wl.prefill_shape()
    try:
        if layout.ranks % wl.tp:
            raise InputError(f"tp ({wl.tp}) must divide the {layout.ranks} GPUs of the topology", field="workload.tp")
        p = layout.ranks // wl.tp  # the context-parallel group
        if shape.sequence < p:
            raise InputError(f"the prompt ({shape.sequence} tokens) must have at least one token per rank "
                             f"({p} ranks)", field="workload.prompt")
        if name == "ulysses":
            check_ulysses(tp_shape(shape, wl.tp), p)
    except InputError as err:
        raise point.locate(err) from None


@dataclass(frozen=True)
class _Phase:
    """One simulated phase (the prefill, or one decode step): what a row sums or takes the maximum of."""

    latency_s: float
    compute_s: float
    bytes_moved: float
    peaks: list[tuple[str, float]]  # (device, bytes)
    events: int
    wall_s: float
    timing: dict[str, float]


def _attention_phase(sched: Schedule, cluster: Cluster) -> _Phase:
    t0 = time.perf_counter()
    result = simulate(sched, cluster)
    wall = time.perf_counter() - t0
    timing = prefill_timing(result, sched.ranks)
    gpus = sched.meta.get("compute_ranks", sched.ranks)  # a switch reducing in the network (NVLS) is no GPU
    peaks = list(zip(sched.placement_on(cluster.ranks), timeline_peaks(sched, result), strict=True))[:gpus]
    return _Phase(result.makespan, timing["compute_s"], result.bytes_sent(), peaks, result.events, wall, timing)


def _model_phase(run: Callable[[], StepResult], cluster: Cluster) -> _Phase:
    t0 = time.perf_counter()
    step = run()
    wall = time.perf_counter() - t0
    assert step.attention is not None
    timing = prefill_timing(step.attention, len(cluster.ranks))
    return _Phase(step.latency_s, step.compute_s, step.bytes_moved, list(zip(cluster.ranks, step.peaks, strict=True)),
                  step.events, wall, timing)


def _prefill(point: Point, cluster: Cluster, layout: Layout, name: str, params: dict[str, Any]) -> _Phase:
    wl = _workload(point)
    shape = wl.prefill_shape()
    try:
        if wl.scope == "model":
            return _model_phase(lambda: prefill_model(wl.model_preset(), name, params, shape, wl.tp, cluster,
                                                      layout.fabric), cluster)
        return _attention_phase(build_prefill(name, params, shape, layout), cluster)
    except InputError as err:
        raise point.locate(err) from None


def _step(wl: GenerateWorkload, cluster: Cluster, layout: Layout, name: str, params: dict[str, Any], i: int
          ) -> _Phase:
    shape = wl.decode_shape(wl.prompt + i)
    if wl.scope == "model":
        return _model_phase(lambda: model_step(wl.model_preset(), name, params, shape, wl.tp, cluster), cluster)
    return _attention_phase(build_schedule(name, params, shape, layout), cluster)


def generate_rows(point: Point, cluster: Cluster, layout: Layout) -> list[dict[str, Any]]:
    """One row per decode schedule of a generate point."""
    check_generate(point, layout)
    wl = _workload(point)
    (pname, pparams), decode = _schedules(point)
    pshape = wl.prefill_shape()
    pre = _prefill(point, cluster, layout, pname, pparams)
    model = wl.model_preset() if wl.scope == "model" else None
    pflops = prefill_model_flops(model, pshape) if model else pshape.model_flops
    rows = []
    for name, params in decode:
        steps = [_step(wl, cluster, layout, name, params, i) for i in range(wl.new_tokens)]
        phases = [pre, *steps]
        flops = pflops + sum(_decode_flops(wl, model, wl.prompt + i) for i in range(wl.new_tokens))
        latency = pre.latency_s + sum(st.latency_s for st in steps)  # (summed in the committed reports' order)
        compute = sum(ph.compute_s for ph in phases)
        peaks = [peak for ph in phases for peak in ph.peaks]
        rows.append({
            "scenario": point.scenario.name, "algorithm": label(name, params), "topology": cluster.name,
            "ranks": layout.ranks, "nodes": len(set(cluster.host_indices([n for n, _ in pre.peaks]))),
            "context": wl.prompt, "batch": pshape.batch, "heads": pshape.heads, "head_dim": pshape.head_dim,
            "dtype": pshape.dtype, "latency_s": latency, "compute_s": compute, "comm_s": latency - compute,
            "bytes_moved": sum(st.bytes_moved for st in steps) + pre.bytes_moved,
            "peak_mem_bytes": max(b for _, b in peaks),
            "oom": any(b > cluster.specs[node].mem_bytes for node, b in peaks),
            "events": sum(ph.events for ph in phases), "sim_wall_s": sum(ph.wall_s for ph in phases),
            "phase": "generate", "sequence": wl.prompt, "layout": wl.layout,
            "tflops_per_gpu": flops / latency / layout.ranks / 1e12,
            "comm_hidden_frac": pre.timing["comm_hidden_frac"], "imbalance": pre.timing["imbalance"],
            "prefill": label(pname, pparams, PREFILL_REGISTRY), "ttft_s": pre.latency_s,
            "tpot_s": sum(st.latency_s for st in steps) / len(steps), "new_tokens": wl.new_tokens,
            "scope": wl.scope, **({"model": wl.model if isinstance(wl.model, str) else "custom", "tp": wl.tp}
                                  if model else {}),
        })
    return rows


def _decode_flops(wl: GenerateWorkload, model: ModelPreset | None, context: int) -> float:
    """Model FLOPs of one decode step over ``context`` cached tokens: attention, and with ``scope: model`` every
    layer's matmuls (2 per weight per sequence) and the LM head."""
    shape = wl.decode_shape(context)
    attend = shape.attend_cost(context)[0]
    if model is None:
        return attend
    return model.layers * (attend + 2.0 * shape.batch * model.layer_weights) + 2.0 * shape.batch * model.head_weights


def generate_runs(point: Point, cluster: Cluster, layout: Layout, record_links: bool = False
                  ) -> list[tuple[str, Schedule, SimResult]]:
    """The prefill and each decode schedule's first step, simulated (for timelines and traces); for
    ``scope: model``, one layer's attention of each."""
    check_generate(point, layout)
    wl = _workload(point)
    (pname, pparams), decode = _schedules(point)
    if wl.scope == "model":
        psched = attention_layer(pname, pparams, wl.prefill_shape(), wl.tp, cluster, build=build_prefill,
                                 fabric=layout.fabric)
    else:
        psched = build_prefill(pname, pparams, wl.prefill_shape(), layout)
    runs = [(f"prefill:{label(pname, pparams, PREFILL_REGISTRY)}", psched, simulate(psched, cluster, record_links))]
    for name, params in decode:
        shape = wl.decode_shape(wl.prompt)
        sched = attention_layer(name, params, shape, wl.tp, cluster) if wl.scope == "model" \
            else build_schedule(name, params, shape, layout)
        runs.append((label(name, params), sched, simulate(sched, cluster, record_links)))
    return runs
