"""Result rows of ``generate`` points: prefill the prompt once with the workload's prefill schedule, then, for each
decode schedule of ``algorithms``, simulate every decode step (context = prompt + tokens generated so far).

Columns: the stable ones (``algorithm`` the decode schedule, ``context`` the prompt, ``latency_s`` the whole
request, ``compute_s`` the critical ranks' kernel time summed over the prefill and every step, ``comm_s`` the
rest, ``peak_mem_bytes`` the larger of the prefill's and the steps' peaks), then ``phase`` (``generate``),
``sequence`` (the prompt), ``layout``, ``tflops_per_gpu``, ``comm_hidden_frac`` and ``imbalance`` (of the prefill),
``prefill`` (its schedule), ``ttft_s`` (the prefill: time to first token), ``tpot_s`` (mean time per output token),
``new_tokens``, ``scope``.

With ``turns:`` a row is the whole conversation: each turn's prompt prefilled on the earlier turns' KV cache (a
prefill on a cached prefix), then its decode steps; ``ttft_s`` is the first turn's prefill, ``last_ttft_s`` the last
turn's, ``tpot_s`` the mean over every turn's steps, ``new_tokens`` their sum, ``turns`` their count.

With ``scope: model`` both phases are the whole model (:func:`simulator.models.step.prefill_model`, then
:func:`~simulator.models.step.model_step` per token, ``tp`` as given), ``tflops_per_gpu`` counts the model's FLOPs,
``comm_hidden_frac`` and ``imbalance`` are one prefill layer's attention's, and the rows add ``model`` and ``tp``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simulator.algorithms import build_schedule, label, resolve
from simulator.algorithms.prefill import PREFILL_REGISTRY, build_prefill, check_prefill, check_ulysses, usp_degrees
from simulator.cluster.topology import Cluster
from simulator.engine.core import simulate
from simulator.errors import InputError
from simulator.models.presets import ModelPreset
from simulator.models.step import StepResult, attention_layer, model_step, prefill_model, prefill_model_flops, tp_shape
from simulator.run.kinds.decode import algorithms_of, check_weight_rates
from simulator.run.kinds.prefill import PHASE_COLUMNS, candidates, cp_layout
from simulator.run.prepared import Algorithm, Kind, PreparedPoint, Run, layout_of
from simulator.run.rows import STABLE, Column, make_row, pick
from simulator.run.scenario import Point
from simulator.run.timing import critical_timing
from simulator.schedule.core import Schedule
from simulator.schedule.memory import out_of_memory, timeline_peaks
from simulator.support.limits import check_simulated, schedule_ops
from simulator.workloads.generate import GenerateWorkload

__all__ = ["COLUMNS", "KIND"]

COLUMNS: tuple[Column, ...] = (
    *pick(*STABLE), *PHASE_COLUMNS,
    Column("ttft_s", "s", "time to first token: the prefill's latency"),
    Column("tpot_s", "s", "mean time per output token: the decode steps' mean latency"),
    Column("prefill", "", "the prefill schedule's label", required=False),
    Column("new_tokens", "", "tokens generated after the prompt (turns: over every turn)", required=False),
    *pick("scope", "model", "tp"),
    Column("turns", "", "turns: the conversation's turns, each prompt prefilled on the earlier turns' KV cache",
           required=False),
    Column("last_ttft_s", "s", "turns: the last turn's prefill (its time to first token)", required=False),
)


def _prepare(point: Point, cluster: Cluster, numeric: bool) -> PreparedPoint:
    """Bad input, located: schedule names, tp, fewer prompt tokens than ranks, Ulysses heads."""
    wl = point.scenario.workload
    assert isinstance(wl, GenerateWorkload)
    layout = layout_of(cluster)
    shape = wl.prefill_shape()
    try:
        name, params = resolve(wl.prefill, field="workload.prefill", registry=PREFILL_REGISTRY)
        prefill = Algorithm(name, params, label(name, params, PREFILL_REGISTRY))
        algos = algorithms_of(point)
        if layout.ranks % wl.tp:
            raise InputError(f"tp ({wl.tp}) must divide the {layout.ranks} GPUs of the topology", field="workload.tp")
        p = layout.ranks // wl.tp  # the context-parallel group
        where = "workload.turns" if wl.turns else "workload.prompt"
        for i, (_, prompt, _) in enumerate(wl.conversation()):
            if prompt < p:
                raise InputError(f"the prompt ({prompt} tokens) must have at least one token per rank ({p} ranks)",
                                 field=f"{where}.{i}.prompt" if wl.turns else where)
            if i:  # a later turn's prompt is prefilled on the cache of the earlier ones
                try:
                    check_prefill(name, wl.prefill_shape(i))
                except InputError as err:
                    raise InputError(f"{err.message} (turn {i} is prefilled on the earlier turns' cache)",
                                     field="workload.prefill") from None
        if name == "ulysses":
            check_ulysses(tp_shape(shape, wl.tp), p)
        if name == "usp":
            usp_degrees(tp_shape(shape, wl.tp), cp_layout(cluster, wl.tp), params["ulysses"], "workload.prefill")
        if wl.scope == "model":
            check_weight_rates(wl.weight_dtype, wl.dtype, cluster)
        _check_steps(wl, algos, p, point.force)
    except InputError as err:
        raise point.locate(err) from None
    return PreparedPoint(point, cluster, "generate", numeric, algos, shape, layout, {"prefill": prefill})


def _check_steps(wl: GenerateWorkload, algos: tuple[Algorithm, ...], ranks: int, force: bool) -> None:
    """Refuse ``new_tokens`` decode steps that would take too long (each step is a schedule simulated on its own;
    a whole model's step adds its dense layers, about 20 ops per rank)."""
    per_step = wl.tp * sum(schedule_ops(a.name, ranks) for a in algos)  # tp head groups of ``ranks`` each
    if wl.scope == "model":
        per_step += 20.0 * ranks * wl.tp * len(algos)
    steps = sum(new for _, _, new in wl.conversation())
    check_simulated(steps * per_step, f"{steps:,} decode steps x {len(algos)} schedule(s) on "
                    f"{ranks * wl.tp:,} GPUs", "workload.turns" if wl.turns else "workload.new_tokens", force)


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
    timing = critical_timing(result, sched.ranks)
    gpus = sched.meta.get("compute_ranks", sched.ranks)  # a switch reducing in the network (NVLS) is no GPU
    peaks = list(zip(sched.placement_on(cluster.ranks), timeline_peaks(sched, result), strict=True))[:gpus]
    return _Phase(result.makespan, timing["compute_s"], result.bytes_sent(), peaks, result.events, wall, timing)


def _model_phase(run: Callable[[], StepResult], cluster: Cluster) -> _Phase:
    t0 = time.perf_counter()
    step = run()
    wall = time.perf_counter() - t0
    assert step.attention is not None
    timing = critical_timing(step.attention, len(cluster.ranks))
    return _Phase(step.latency_s, step.compute_s, step.bytes_moved, list(zip(cluster.ranks, step.peaks, strict=True)),
                  step.events, wall, timing)


def _prefill(prep: PreparedPoint, turn: int = 0) -> tuple[_Phase, str]:
    """The prefill phase of turn ``turn`` and the label of the schedule it ran (``auto``: ``auto:NAME``, the faster
    by simulation of pass-KV and pass-Q)."""
    wl, cluster, layout, pre = prep.workload, prep.cluster, prep.layout, prep.extra["prefill"]
    assert layout is not None
    shape = wl.prefill_shape(turn)

    def phase(algo: Algorithm) -> _Phase:
        if wl.scope == "model":
            return _model_phase(lambda: prefill_model(wl.model_preset(), algo.name, algo.params, shape, wl.tp,
                                                      cluster, layout.fabric, wl.weights()), cluster)
        return _attention_phase(build_prefill(algo.name, algo.params, shape, layout), cluster)

    try:
        done = min(((phase(c), c.name) for c in candidates(pre)), key=lambda t: t[0].latency_s)
    except InputError as err:
        raise prep.point.locate(err) from None
    return done[0], pre.label if pre.name != "auto" else f"auto:{done[1]}"


def _step(prep: PreparedPoint, algo: Algorithm, context: int) -> _Phase:
    """One decode step over ``context`` cached tokens."""
    wl, cluster, layout = prep.workload, prep.cluster, prep.layout
    assert layout is not None
    shape = wl.decode_shape(context)
    if wl.scope == "model":
        return _model_phase(lambda: model_step(wl.model_preset(), algo.name, algo.params, shape, wl.tp, cluster,
                                               wl.weights()), cluster)
    return _attention_phase(build_schedule(algo.name, algo.params, shape, layout), cluster)


def _rows(prep: PreparedPoint) -> list[dict[str, Any]]:
    """One row per decode schedule of a generate point."""
    wl, cluster, pshape = prep.workload, prep.cluster, prep.shape
    turns = wl.conversation()
    prefills = [_prefill(prep, i) for i in range(len(turns))]
    pre = prefills[0][0]
    labels = list(dict.fromkeys(lab for _, lab in prefills))
    model = wl.model_preset() if wl.scope == "model" else None
    pflops = sum(prefill_model_flops(model, wl.prefill_shape(i)) if model else wl.prefill_shape(i).model_flops
                 for i in range(len(turns)))
    contexts = [cached + prompt + i for cached, prompt, new in turns for i in range(new)]  # every decode step's
    new_tokens = len(contexts)
    rows = []
    for algo in prep.algorithms:
        steps = [_step(prep, algo, c) for c in contexts]
        phases = [pre, *steps, *(ph for ph, _ in prefills[1:])]
        flops = pflops + sum(_decode_flops(wl, model, c) for c in contexts)
        latency = pre.latency_s + sum(st.latency_s for st in steps)  # (summed in the committed reports' order)
        latency += sum(ph.latency_s for ph, _ in prefills[1:])
        compute = sum(ph.compute_s for ph in phases)
        peaks = [peak for ph in phases for peak in ph.peaks]
        ranks = len(cluster.ranks)
        values = {
            "scenario": prep.point.scenario.name, "algorithm": algo.label, "topology": cluster.name,
            "ranks": ranks, "nodes": len(set(cluster.host_indices([n for n, _ in pre.peaks]))),
            "context": wl.prompt, "batch": pshape.batch, "heads": pshape.heads, "head_dim": pshape.head_dim,
            "dtype": pshape.dtype, "latency_s": latency, "compute_s": compute, "comm_s": latency - compute,
            "bytes_moved": sum(st.bytes_moved for st in steps) + pre.bytes_moved
            + sum(ph.bytes_moved for ph, _ in prefills[1:]),
            "peak_mem_bytes": max(b for _, b in peaks),
            "oom": out_of_memory((b, prep.capacity(node)) for node, b in peaks),
            "events": sum(ph.events for ph in phases), "sim_wall_s": sum(ph.wall_s for ph in phases),
            "phase": "generate", "sequence": wl.prompt, "layout": wl.layout,
            "tflops_per_gpu": flops / latency / ranks / 1e12,
            "comm_hidden_frac": pre.timing["comm_hidden_frac"], "imbalance": pre.timing["imbalance"],
            "prefill": "+".join(labels), "ttft_s": pre.latency_s,
            "tpot_s": sum(st.latency_s for st in steps) / len(steps), "new_tokens": new_tokens,
            "scope": wl.scope, **({"model": wl.model if isinstance(wl.model, str) else "custom", "tp": wl.tp}
                                  if model else {}),
            **({"turns": len(turns), "last_ttft_s": prefills[-1][0].latency_s} if wl.turns else {}),
        }
        rows.append(make_row("generate", COLUMNS, values, prep.point.columns()))
    return rows


def _decode_flops(wl: GenerateWorkload, model: ModelPreset | None, context: int) -> float:
    """Model FLOPs of one decode step over ``context`` cached tokens: attention, and with ``scope: model`` every
    layer's matmuls (2 per weight per sequence) and the LM head."""
    shape = wl.decode_shape(context)
    attend = shape.attend_cost(context)[0]
    if model is None:
        return attend
    return model.layers * (attend + 2.0 * shape.batch * model.layer_weights) + 2.0 * shape.batch * model.head_weights


def _simulate(prep: PreparedPoint, keep_runs: bool) -> tuple[list[dict[str, Any]], list[Run] | None]:
    return _rows(prep), _runs(prep, False) if keep_runs else None


def _runs(prep: PreparedPoint, record_links: bool) -> list[Run]:
    """The prefill and each decode schedule's first step, simulated (for timelines and traces); for
    ``scope: model``, one layer's attention of each."""
    wl, cluster, layout, pre = prep.workload, prep.cluster, prep.layout, prep.extra["prefill"]
    assert layout is not None
    if wl.scope == "model":
        psched = attention_layer(pre.name, pre.params, prep.shape, wl.tp, cluster, build=build_prefill,
                                 fabric=layout.fabric)
    else:
        psched = build_prefill(pre.name, pre.params, prep.shape, layout)
    runs = [(f"prefill:{pre.label}", psched, simulate(psched, cluster, record_links))]
    for algo in prep.algorithms:
        shape = wl.decode_shape(wl.prompt)
        sched = attention_layer(algo.name, algo.params, shape, wl.tp, cluster) if wl.scope == "model" \
            else build_schedule(algo.name, algo.params, shape, layout)
        runs.append((algo.label, sched, simulate(sched, cluster, record_links)))
    return runs


KIND = Kind("generate", COLUMNS, _prepare, _simulate, _runs,
            numeric="--numeric checks decode and prefill workloads, not generate")
