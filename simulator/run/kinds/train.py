"""``kind: train`` points: one training step of a whole model over TP x CP x PP x DP (docs/training.md), composed by
:func:`simulator.training.step.train_step` from pieces simulated on the event engine.

One row per point; ``algorithm`` is the CP group's attention schedule (``parallel.cp_algorithm``: the scenario's
``algorithms:`` does not apply). The point's timelines (report, ``trace``) are the pipeline, one GPU per stage (its
kernels the composed stage times, its transfers real; :mod:`simulator.training.timeline`), and one layer's
attention. ``latency_s`` and ``step_s`` are the step; ``compute_s`` the critical stage's kernel
seconds; the ``*_exposed_s`` columns what the step would lose were that dimension's communication free; ``binding``
names the largest of them and the pipeline bubble.
"""

from __future__ import annotations

import time
from typing import Any

from simulator.cluster.topology import Cluster
from simulator.engine.core import simulate
from simulator.errors import InputError
from simulator.run.prepared import Algorithm, Kind, PreparedPoint, Run
from simulator.run.rows import STABLE, Column, make_row, pick
from simulator.run.scenario import Point
from simulator.training.layer import attention_schedule
from simulator.training.placement import placed, placement_label
from simulator.training.step import TrainStep, train_step
from simulator.training.timeline import pipeline_schedule
from simulator.units import DTYPE_BYTES
from simulator.workloads.train import DIMENSIONS, TrainWorkload, train_checks

__all__ = ["COLUMNS", "KIND", "binding", "step_numbers"]


COLUMNS: tuple[Column, ...] = (
    *pick(*STABLE),
    Column("phase", "", "train-step: a whole training step (every layer, micro-batch, the DP reduction, the "
                        "optimizer)"),
    Column("model", "", "the model preset (custom for a model block)"),
    Column("sequence", "tokens", "tokens per sequence"),
    Column("tp", "", "tensor-parallel degree (GPUs of one server)"),
    Column("cp", "", "context-parallel degree"),
    Column("pp", "", "pipeline stages"),
    Column("virtual_stages", "", "model chunks per pipeline stage (interleaved 1F1B when > 1)"),
    Column("dp", "", "data-parallel replicas"),
    Column("placement", "", "the order the coordinates vary in over the cluster's GPUs, fastest first (workload."
                            "placement; tp-cp-pp-dp by default)"),
    Column("zero", "", "ZeRO stage (0-3)"),
    Column("recompute", "", "activation recomputation: none, selective or full"),
    Column("micro_batches", "", "micro-batches per replica per step (m of 1F1B)"),
    Column("step_s", "s", "the training step: forward and backward of every micro-batch, DP gradient reduction, "
                          "optimizer step"),
    Column("tokens_per_s", "tokens/s", "tokens of the global batch / step_s"),
    Column("tflops_per_gpu", "TFLOP/s", "model FLOPs (6 x tokens x weights + attention's forward and backward over "
                                        "unmasked pairs; recomputation not counted) / step_s / GPUs"),
    Column("mfu", "", "tflops_per_gpu / the GPU's peak dense FLOP/s at the dtype"),
    Column("peak_mem_GB", "GB", "the largest per-GPU peak (weights, gradients, optimizer states by ZeRO stage, "
                                "activations by recompute and 1F1B position, buffers), GB = 1e9 bytes"),
    Column("bubble_frac", "", "share of the step the busiest pipeline stage idles"),
    Column("tp_exposed_s", "s", "step_s minus the step with TP collectives free"),
    Column("cp_exposed_s", "s", "step_s minus the step with the attention's CP communication free"),
    Column("pp_exposed_s", "s", "step_s minus the step with no time between pipeline stages"),
    Column("dp_exposed_s", "s", "step_s minus the step with no DP collectives (gradients, ZeRO gathers)"),
    Column("binding", "", "what costs the step most besides compute: tp, cp, pp or dp (its exposed time) or "
                          "bubble (the pipeline's idle time); compute when the largest is under 1% of the step"),
)


BINDING_SHARE = 0.01  # below this share of the step, nothing binds but compute


def binding(step: TrainStep) -> str:
    """The largest of the exposed times and the bubble's seconds; ``compute`` when it is under 1% of the step."""
    costs = {**{d: step.exposed[d] for d in DIMENSIONS}, "bubble": step.pipeline.bubble_frac * step.step_s}
    name = max(costs, key=lambda k: costs[k])
    return name if costs[name] > BINDING_SHARE * step.step_s else "compute"


def step_numbers(wl: TrainWorkload, step: TrainStep, gpus: int, peak_flops: float) -> dict[str, Any]:
    """A step's numbers as the rows (and the plan's) give them: ``step_s`` to ``binding``."""
    tflops = step.flops / step.step_s / gpus / 1e12
    return {"step_s": step.step_s, "tokens_per_s": wl.batch_sequences * wl.sequence / step.step_s,
            "tflops_per_gpu": tflops, "mfu": tflops * 1e12 / peak_flops, "peak_mem_GB": step.peak_bytes / 1e9,
            "bubble_frac": step.pipeline.bubble_frac, **{f"{d}_exposed_s": step.exposed[d] for d in DIMENSIONS},
            "binding": binding(step)}


def _prepare(point: Point, cluster: Cluster, numeric: bool) -> PreparedPoint:
    """Every check of the point, located: the GPUs, pp, the batch, the CP layout, ``algorithms:``, ``--numeric``."""
    wl = point.scenario.workload
    assert isinstance(wl, TrainWorkload)
    try:
        if "algorithms" in point.scenario.model_fields_set:
            raise InputError("a train workload's attention schedule is workload.parallel.cp_algorithm; remove "
                             "algorithms:", field="algorithms")
        train_checks(wl, len(cluster.ranks))
        try:
            cluster.specs[cluster.ranks[0]].flops_for(wl.dtype)
        except InputError as err:
            raise err.located(field="workload.dtype") from None
    except InputError as err:
        raise point.locate(err) from None
    algo = Algorithm(wl.parallel.cp_algorithm, {}, wl.parallel.cp_algorithm)
    return PreparedPoint(point, cluster, "train", numeric, (algo,), wl.attention_shape(backward=True))


def _placed(prep: PreparedPoint) -> Cluster:
    """The point's cluster with its GPUs in the step's order for the workload's placement."""
    wl = prep.workload
    return placed(prep.cluster, wl.parallel.sizes, wl.placement)


def _simulate(prep: PreparedPoint, keep_runs: bool) -> tuple[list[dict[str, Any]], list[Run] | None]:
    wl, cluster = prep.workload, prep.cluster
    t0 = time.perf_counter()
    step = train_step(wl, cluster, prep.point.scenario.mem_fraction)
    wall = time.perf_counter() - t0
    par = wl.parallel
    gpus = len(cluster.ranks)
    values = {
        "scenario": prep.point.scenario.name, "algorithm": par.cp_algorithm, "topology": cluster.name,
        "ranks": gpus, "nodes": cluster.num_hosts, "context": wl.sequence, "batch": wl.batch_sequences,
        "heads": prep.shape.heads, "head_dim": prep.shape.head_dim, "dtype": wl.dtype, "latency_s": step.step_s,
        "compute_s": step.compute_s, "comm_s": step.step_s - step.compute_s, "bytes_moved": step.bytes_moved,
        "peak_mem_bytes": step.peak_bytes, "oom": step.oom, "events": step.events, "sim_wall_s": wall,
        "phase": "train-step", "model": wl.model_name, "sequence": wl.sequence, "tp": par.tp, "cp": par.cp,
        "pp": par.pp, "virtual_stages": par.virtual_stages, "dp": par.dp, "placement": placement_label(wl.placement),
        "zero": wl.zero, "recompute": wl.recompute, "micro_batches": wl.micro_batches,
        **step_numbers(wl, step, gpus, cluster.specs[cluster.ranks[0]].flops_for(wl.dtype)),
    }
    row = make_row("train", COLUMNS, values, prep.point.columns())
    return [row], _step_runs(prep, step, False) if keep_runs else None


MAX_TIMELINE_OPS = 200_000  # a pipeline with more ops is left out of the timeline


def _step_runs(prep: PreparedPoint, step: TrainStep, record_links: bool) -> list[Run]:
    """The pipeline (one GPU per stage, :mod:`simulator.training.timeline`) when it is not too large to draw, and one
    layer's attention (forward and backward, one micro-batch) on the first stage's CP groups."""
    wl, cluster = prep.workload, _placed(prep)
    par = wl.parallel
    runs: list[Run] = []
    virtual = par.pp * par.virtual_stages
    if 2 * wl.micro_batches * virtual * 3 <= MAX_TIMELINE_OPS:
        nbytes = wl.micro_batch * wl.sequence // par.cp * wl.model_preset().hidden * DTYPE_BYTES[wl.dtype] / par.tp
        sched = pipeline_schedule(step.pipeline.fwd, step.pipeline.bwd, wl.micro_batches, par.virtual_stages,
                                  nbytes, par.tp * par.cp, cluster, wl.dtype)
        runs.append(("pipeline", sched, simulate(sched, cluster, record_links)))
    sched = attention_schedule(par.cp_algorithm, wl.attention_shape(backward=True), par.tp, par.cp, cluster)
    runs.append((f"{par.cp_algorithm} (one layer's attention)", sched, simulate(sched, cluster, record_links)))
    return runs


def _runs(prep: PreparedPoint, record_links: bool) -> list[Run]:
    return _step_runs(prep, train_step(prep.workload, prep.cluster, prep.point.scenario.mem_fraction), record_links)


KIND = Kind("train", COLUMNS, _prepare, _simulate, _runs, numeric="--numeric checks one attention layer (kind: "
                                                                    "prefill)")
