"""``treering plan --train``: the fastest training layout of a model on a number of GPUs (docs/training.md).

The search: every TP degree that divides a server's GPUs and the heads, CP and PP degrees that are powers of two (PP
up to the layers), DP the rest; for each, every CP schedule (``ring``, ``allgather``, ``ulysses`` where the heads
allow; ``ring`` alone at CP 1), 1, 2 or 4 model chunks per stage (interleaved 1F1B) where PP > 1, the placements
of :data:`PLACEMENTS` where PP and DP > 1, ZeRO stage 0-3 and recomputation none, selective, full; sequence
parallelism with TP > 1, one sequence per micro-batch. Layouts
the checks refuse (:func:`simulator.workloads.train.train_checks`) are left out, and so are those whose memory
(pure, :func:`simulator.training.step.stage_memory`) is over the usable memory. The rest are ordered by a lower
bound, their step with free DP communication (one layer's pieces simulated per TP, CP and schedule, shared); full
steps (:func:`simulator.training.step.train_step`, DP collectives timed on the fabric) are simulated in that order
until the next bound is no faster than the runner-up found: the fastest and the runner-up are then those of all the
layouts that fit.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from simulator.cluster.topology import Cluster
from simulator.errors import InputError
from simulator.models.presets import ModelPreset
from simulator.run.kinds.train import step_numbers
from simulator.schedule.memory import usable_bytes
from simulator.training.placement import placement_label
from simulator.training.step import StepCache, TrainStep, compose, stage_memory, step_pieces, train_step
from simulator.workloads.decode import check_scope
from simulator.workloads.train import TrainWorkload, train_checks

__all__ = ["PLACEMENTS", "TrainPlan", "TrainRequest", "layouts", "plan_train"]

MAX_DEGREE = 64  # CP and PP searched up to this
KEEP = 2  # the fastest and the runner-up are simulated in full, whatever the bounds of the others
VIRTUAL = (1, 2, 4)  # model chunks per stage searched (interleaved 1F1B beyond 1) where there are stages
# placements searched where there are stages and replicas: PP outside DP (the default) and Megatron-LM's default
# order, DP inside PP (docs/training.md, Placement)
PLACEMENTS = ("tp-cp-pp-dp", "tp-cp-dp-pp")


@dataclasses.dataclass(frozen=True)
class TrainRequest:
    """What ``plan --train`` was asked: the model, sequence, tokens per step, GPUs, dtype, memory fraction."""

    model: str
    sequence: int
    global_batch: int
    gpus: int
    dtype: str = "bf16"
    mem_fraction: float = 0.9


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """The layouts simulated in full, fastest first (as row dicts), and how many were looked at."""

    rows: list[dict[str, Any]]
    candidates: int
    over_memory: int
    bounded: int


def _powers(limit: int) -> Iterator[int]:
    k = 1
    while k <= limit:
        yield k
        k *= 2


def layouts(req: TrainRequest, model: ModelPreset, gpus_per_server: int) -> Iterator[TrainWorkload]:
    """Every layout of the search (module docstring) that the checks accept."""
    for tp in (t for t in range(1, gpus_per_server + 1) if gpus_per_server % t == 0):
        try:
            check_scope("model", req.model, tp)
        except ValueError:
            continue
        for cp in _powers(min(MAX_DEGREE, req.gpus // tp)):
            for pp in _powers(min(MAX_DEGREE, model.layers, req.gpus // (tp * cp))):
                if req.gpus % (tp * cp * pp):
                    continue
                dp = req.gpus // (tp * cp * pp)
                for algo, v, zero, recompute, placement in itertools.product(
                        ("ring", "allgather", "ulysses") if cp > 1 else ("ring",), VIRTUAL if pp > 1 else (1,),
                        (0, 1, 2, 3), ("none", "selective", "full"), PLACEMENTS if pp > 1 and dp > 1 else
                        PLACEMENTS[:1]):
                    wl = TrainWorkload.model_validate({
                        "kind": "train", "model": req.model, "sequence": req.sequence,
                        "global_batch": req.global_batch, "micro_batch": 1, "dtype": req.dtype, "zero": zero,
                        "recompute": recompute, "placement": placement,
                        "parallel": {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "cp_algorithm": algo,
                                     "sequence_parallel": tp > 1, "virtual_stages": v}})
                    try:
                        train_checks(wl, req.gpus)
                    except InputError:
                        continue
                    yield wl


def row_of(wl: TrainWorkload, step: TrainStep, gpus: int, peak_flops: float) -> dict[str, Any]:
    """A plan row: the layout and its step's numbers."""
    par = wl.parallel
    return {"tp": par.tp, "cp": par.cp, "pp": par.pp, "virtual_stages": par.virtual_stages, "dp": par.dp,
            "cp_algorithm": par.cp_algorithm, "placement": placement_label(wl.placement),
            "zero": wl.zero, "recompute": wl.recompute, **step_numbers(wl, step, gpus, peak_flops)}


def plan_train(req: TrainRequest, cluster: Cluster, progress: Callable[[str], None] | None = None) -> TrainPlan:
    """Search the layouts (module docstring) on ``cluster`` (``req.gpus`` GPUs)."""
    if len(cluster.ranks) != req.gpus:
        raise InputError(f"the topology has {len(cluster.ranks)} GPUs, not {req.gpus}", field="--gpus")
    spec = cluster.specs[cluster.ranks[0]]
    capacity = usable_bytes(spec.mem_bytes, req.mem_fraction)
    gpn = len(cluster.host_indices(cluster.ranks)) // cluster.num_hosts if cluster.num_hosts else len(cluster.ranks)
    first = TrainWorkload.model_validate({"kind": "train", "model": req.model, "sequence": req.sequence,
                                          "global_batch": req.global_batch})
    model = first.model_preset()
    cache = StepCache()
    bounds: list[tuple[float, int, TrainWorkload]] = []
    candidates = over = 0
    for wl in layouts(req, model, gpn):
        candidates += 1
        if max(m.total for m in stage_memory(wl)) > capacity:
            over += 1
            continue
        pc = step_pieces(wl, cluster, None, cache)
        bounds.append((compose(wl, pc, None, cluster)[0], len(bounds), wl))
        if progress:
            progress(f"{candidates} layouts, {len(bounds)} fit")
    bounds.sort(key=lambda b: (b[0], b[1]))
    rows: list[dict[str, Any]] = []
    for bound, _, wl in bounds:
        steps = sorted(r["step_s"] for r in rows)
        if len(steps) >= KEEP and bound >= steps[KEEP - 1]:
            break  # no layout left can be among the KEEP fastest
        step = train_step(wl, cluster, req.mem_fraction, cache)
        rows.append(row_of(wl, step, req.gpus, spec.flops_for(req.dtype)))
        best = min(r["step_s"] for r in rows)
        if progress:
            progress(f"{len(rows)} steps simulated, fastest {best:.4g} s")
    rows.sort(key=lambda r: r["step_s"])
    return TrainPlan(rows, candidates, over, len(bounds) - len(rows))
