"""Checks and names shared by the launcher and the ranks (no torch here: the CLI imports it)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from simulator.cluster.topology import load_topology
from simulator.distributed.random_shapes import random_points
from simulator.errors import InputError
from simulator.run.prepare import prepare_point
from simulator.run.prepared import PreparedPoint
from simulator.run.scenario import Point, load_scenario
from simulator.units import checked_quantity
from simulator.workloads.train import TrainWorkload, train_checks

__all__ = ["REAL_KINDS", "REAL_TRAIN_DTYPES", "check_scenario", "check_train", "out_dir"]

REAL_KINDS = ("decode", "prefill", "train")  # the kinds validate runs for real (distributed.validate.REAL_ROWS)
REAL_TRAIN_DTYPES = ("fp64", "fp32")  # distributed.train_run.DTYPES


def out_dir(args: argparse.Namespace, prepared: list[PreparedPoint]) -> Path:
    """Where validate writes: ``-o DIR`` or ``out/<scenario name>-validation``."""
    suffix = f"-random{args.random}-seed{args.seed}" if getattr(args, "random", None) is not None else ""
    return Path(args.out) if args.out else Path("out") / f"{prepared[0].point.scenario.name}{suffix}-validation"


def check_scenario(args: argparse.Namespace) -> list[PreparedPoint]:
    """Load and check the scenario (decode, prefill and train workloads) before any rank starts. With ``--random N``,
    the scenario's first point gives the topology and algorithms, and N random shapes replace its workload
    (:mod:`simulator.distributed.random_shapes`)."""
    points = load_scenario(args.scenario, args.sets, bool(getattr(args, "force", False)))
    for point in points:
        if point.scenario.workload.kind not in REAL_KINDS:
            raise InputError("validate needs a decode or prefill workload, or a train one", file=point.source,
                             field="workload.kind")
    if any(p.scenario.workload.kind == "train" for p in points):
        for point in points:
            check_train(args, point)
        if getattr(args, "random", None) is not None:
            raise InputError("draws decode and prefill shapes; a train scenario runs its own points", field="--random")
    if getattr(args, "random", None) is not None:
        if args.random < 1:
            raise InputError(f"must be at least 1, got {args.random}", field="--random")
        try:
            limit = checked_quantity(args.max_kv_bytes, "bytes", positive=True)
        except InputError as err:
            raise InputError(err.message, field="--max-kv-bytes") from None
        points = random_points(points[0], args.random, args.seed, args.procs, int(limit))
    return [prepare_point(point) for point in points]


def check_train(args: argparse.Namespace, point: Point) -> None:
    """What a real training step (:mod:`simulator.distributed.train_run`) runs, located: the layout's ranks
    against ``--procs`` (or torchrun's WORLD_SIZE), fp64/fp32, no sequence parallelism, interleaving or ZeRO,
    ``recompute: selective`` (its attention backward runs the schedule with a backward, forward included), a model
    whose heads, KV heads, intermediate size and vocabulary split over TP, and a ``--topology`` of the layout's
    GPUs (the prediction's)."""
    wl = point.scenario.workload
    if not isinstance(wl, TrainWorkload):
        raise point.locate(InputError("a train scenario's points must all be train workloads", field="workload.kind"))
    par, model = wl.parallel, wl.model_preset()
    procs = int(os.environ.get("WORLD_SIZE", args.procs))
    if procs != par.gpus:
        raise InputError(f"the layout needs tp x cp x pp x dp = {par.tp} x {par.cp} x {par.pp} x {par.dp} = "
                         f"{par.gpus} ranks, got {procs}", field="--procs")
    refusals = [
        (wl.dtype not in REAL_TRAIN_DTYPES, "workload.dtype",
         f"a real step runs in {' or '.join(REAL_TRAIN_DTYPES)}, not {wl.dtype}"),
        (par.sequence_parallel and par.tp > 1, "workload.parallel.sequence_parallel",
         "a real step runs without sequence parallelism (set it false)"),
        (par.virtual_stages > 1, "workload.parallel.virtual_stages", "a real step runs 1F1B without interleaving"),
        (wl.zero != 0, "workload.zero", "a real step runs ZeRO 0 (one allreduce of the gradients)"),
        (wl.recompute != "selective", "workload.recompute",
         "a real step's attention backward runs the schedule with a backward (its forward again): set recompute: "
         "selective, as the simulator times that"),
        (any(x % par.tp for x in (model.heads, model.kv_heads, model.intermediate, model.vocab)), "workload.model",
         f"heads, kv_heads, intermediate and vocab must divide by tp = {par.tp} in a real step"),
        (model.head_dim % 2 == 1, "workload.model.head_dim", "must be even (rotary embedding) in a real step"),
    ]
    for refused, field, message in refusals:
        if refused:
            raise point.locate(InputError(message, field=field))
    if args.topology:
        cluster = load_topology(args.topology, force=bool(getattr(args, "force", False)))
        try:
            train_checks(wl, len(cluster.ranks))
        except InputError as err:
            raise InputError(err.message, file=args.topology, field="--topology") from None
