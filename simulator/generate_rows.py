"""Result rows of ``generate`` points: prefill the prompt once with the workload's prefill schedule, then, for each
decode schedule of ``algorithms``, simulate every decode step (context = prompt + tokens generated so far).

Columns: the stable ones (``algorithm`` the decode schedule, ``context`` the prompt, ``latency_s`` the whole
request, ``compute_s`` the critical ranks' kernel time summed over the prefill and every step, ``comm_s`` the
rest, ``peak_mem_bytes`` the larger of the prefill's and the steps' peaks), then ``phase`` (``generate``),
``sequence`` (the prompt), ``layout``, ``tflops_per_gpu``, ``comm_hidden_frac`` and ``imbalance`` (of the prefill),
``prefill`` (its schedule), ``ttft_s`` (the prefill: time to first token), ``tpot_s`` (mean time per output token),
``new_tokens``.
"""

from __future__ import annotations

import time
from typing import Any

from simulator.algorithms import Layout, build_schedule, label, resolve
from simulator.algorithms.prefill import PREFILL_REGISTRY, build_prefill, check_ulysses
from simulator.cluster.topology import Cluster
from simulator.engine.core import SimResult, simulate
from simulator.errors import InputError
from simulator.memory import timeline_peaks
from simulator.prefill_rows import prefill_timing
from simulator.scenario import Point
from simulator.schedule import Schedule
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
    """Bad input, located: schedule names, fewer prompt tokens than ranks, Ulysses heads."""
    (name, _), _ = _schedules(point)
    shape = _workload(point).prefill_shape()
    try:
        if shape.sequence < layout.ranks:
            raise InputError(f"the prompt ({shape.sequence} tokens) must have at least one token per rank "
                             f"({layout.ranks} ranks)", field="workload.prompt")
        if name == "ulysses":
            check_ulysses(shape, layout.ranks)
    except InputError as err:
        raise point.locate(err) from None


def _measure(sched: Schedule, cluster: Cluster) -> tuple[SimResult, list[float], float]:
    t0 = time.perf_counter()
    result = simulate(sched, cluster)
    wall = time.perf_counter() - t0
    return result, timeline_peaks(sched, result.timeline), wall


def generate_rows(point: Point, cluster: Cluster, layout: Layout) -> list[dict[str, Any]]:
    """One row per decode schedule of a generate point."""
    check_generate(point, layout)
    wl = _workload(point)
    (pname, pparams), decode = _schedules(point)
    pshape = wl.prefill_shape()
    try:
        psched = build_prefill(pname, pparams, pshape, layout)
    except InputError as err:
        raise point.locate(err) from None
    pres, ppeaks, pwall = _measure(psched, cluster)
    ptiming = prefill_timing(pres, psched.ranks)
    pplace = psched.placement_on(cluster.ranks)
    rows = []
    for name, params in decode:
        steps, compute, moved, events, wall = [], ptiming["compute_s"], 0.0, pres.events, pwall
        peaks, flops = list(ppeaks), pshape.model_flops
        places = list(pplace)
        for i in range(wl.new_tokens):
            shape = wl.decode_shape(wl.prompt + i)
            sched = build_schedule(name, params, shape, layout)
            res, step_peaks, step_wall = _measure(sched, cluster)
            timing = prefill_timing(res, sched.ranks)
            steps.append(res.makespan)
            compute += timing["compute_s"]
            moved += res.bytes_sent()
            events, wall = events + res.events, wall + step_wall
            place = sched.placement_on(cluster.ranks)
            peaks += step_peaks
            places += list(place)
            flops += shape.attend_cost(shape.context)[0]
        latency = pres.makespan + sum(steps)
        rows.append({
            "scenario": point.scenario.name, "algorithm": label(name, params), "topology": cluster.name,
            "ranks": layout.ranks, "nodes": len(set(cluster.host_indices(pplace))), "context": wl.prompt,
            "batch": pshape.batch, "heads": pshape.heads, "head_dim": pshape.head_dim, "dtype": pshape.dtype,
            "latency_s": latency, "compute_s": compute, "comm_s": latency - compute,
            "bytes_moved": moved + pres.bytes_sent(),
            "peak_mem_bytes": max(peaks),
            "oom": any(peak > cluster.specs[node].mem_bytes for peak, node in zip(peaks, places, strict=True)),
            "events": events, "sim_wall_s": wall,
            "phase": "generate", "sequence": wl.prompt, "layout": wl.layout,
            "tflops_per_gpu": flops / latency / layout.ranks / 1e12,
            "comm_hidden_frac": ptiming["comm_hidden_frac"], "imbalance": ptiming["imbalance"],
            "prefill": label(pname, pparams, PREFILL_REGISTRY), "ttft_s": pres.makespan,
            "tpot_s": sum(steps) / len(steps), "new_tokens": wl.new_tokens,
        })
    return rows


def generate_runs(point: Point, cluster: Cluster, layout: Layout, record_links: bool = False
                  ) -> list[tuple[str, Schedule, SimResult]]:
    """The prefill and each decode schedule's first step, simulated (for timelines and traces)."""
    check_generate(point, layout)
    wl = _workload(point)
    (pname, pparams), decode = _schedules(point)
    psched = build_prefill(pname, pparams, wl.prefill_shape(), layout)
    runs = [(f"prefill:{label(pname, pparams, PREFILL_REGISTRY)}", psched, simulate(psched, cluster, record_links))]
    for name, params in decode:
        sched = build_schedule(name, params, wl.decode_shape(wl.prompt), layout)
        runs.append((label(name, params), sched, simulate(sched, cluster, record_links)))
    return runs
