"""``treering validate`` of ``kind: train`` points: the step run for real, timed, checked and predicted.

Every rank runs ``--warmup`` untimed then ``--iters`` timed steps (:class:`~.train_run.TrainRank`: 1F1B over the
micro-batches, the gradient allreduce, the optimizer step; each from the same initial weights, set up before the
clock starts); a step's time is the slowest rank's and ``measured_s`` the median, ``floor_pct`` the floor of
identical runs (:mod:`.floor`). The last step's gradients and losses are checked against single-process autograd
(:func:`~.train_run.check_step`: ``grad_max_rel_err``, ``grad_max_abs_err``, ``loss_abs_err``). ``predicted_s``:
the simulator's step (:func:`simulator.training.step.train_step`) of the same workload on the topology
(``--topology``: a calibration of this machine), with its bubble and exposed times beside it.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from simulator.distributed.common import rank_layout, timed_iterations
from simulator.distributed.floor import compared, timing
from simulator.distributed.train_run import TrainRank, TrainSpec, check_step
from simulator.run.prepared import PreparedPoint
from simulator.training.placement import placement_label
from simulator.training.step import train_step
from simulator.workloads.train import DIMENSIONS, TrainWorkload

__all__ = ["TRAIN_COLUMNS", "train_point_rows"]

# a train row's columns beside validate's own (the layout's are sweep-like keys: phase, layout, tp, cp, pp, dp)
TRAIN_COLUMNS = ["micro_batches", "grad_max_rel_err", "loss_abs_err", "predicted_bubble_frac",
                 *(f"predicted_{d}_exposed_s" for d in DIMENSIONS)]


def train_point_rows(args: argparse.Namespace, prep: PreparedPoint, device: torch.device,
                     cluster_of: Any) -> list[dict[str, Any]]:
    """The row of one train point (rank 0; an empty list elsewhere). ``cluster_of(args, point, ranks)``: the
    topology the prediction runs on."""
    point = prep.point
    wl = point.scenario.workload
    assert isinstance(wl, TrainWorkload)
    spec = TrainSpec.of(wl, args.seed)
    trank = TrainRank(spec, device, rank_layout().hosts)
    times, result = timed_iterations(args, lambda pool: trank.step(), device)
    check = check_step(spec, trank, result)
    if check is None:
        return []
    stats = timing(times)
    step = train_step(wl, cluster_of(args, point, spec.world), point.scenario.mem_fraction)
    predicted = step.step_s
    par = wl.parallel
    return [{
        "algorithm": par.cp_algorithm, "ranks": spec.world, "context": wl.sequence, "phase": "train-step",
        "layout": par.layout, "tp": par.tp, "cp": par.cp, "pp": par.pp, "dp": par.dp,
        "placement": placement_label(spec.placement),
        "micro_batches": spec.micro_batches, **compared(stats, predicted), **stats,
        "grad_max_rel_err": check.grad_max_rel_err, "grad_max_abs_err": check.grad_max_abs_err,
        "loss_abs_err": check.loss_abs_err, "predicted_bubble_frac": step.pipeline.bubble_frac,
        **{f"predicted_{d}_exposed_s": step.exposed[d] for d in DIMENSIONS},
        **point.columns(),
    }]
