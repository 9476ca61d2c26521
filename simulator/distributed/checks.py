"""Checks and names shared by the launcher and the ranks (no torch here: the CLI imports it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.distributed.random_shapes import random_points
from simulator.errors import InputError
from simulator.run.prepare import prepare_point
from simulator.run.prepared import PreparedPoint
from simulator.run.scenario import load_scenario
from simulator.units import checked_quantity

__all__ = ["REAL_KINDS", "check_scenario", "out_dir"]

REAL_KINDS = ("decode", "prefill")  # the workload kinds validate runs for real (distributed.validate.REAL_ROWS)


def out_dir(args: argparse.Namespace, prepared: list[PreparedPoint]) -> Path:
    """Where validate writes: ``-o DIR`` or ``out/<scenario name>-validation``."""
    suffix = f"-random{args.random}-seed{args.seed}" if getattr(args, "random", None) is not None else ""
    return Path(args.out) if args.out else Path("out") / f"{prepared[0].point.scenario.name}{suffix}-validation"


def check_scenario(args: argparse.Namespace) -> list[PreparedPoint]:
    """Load and check the scenario (decode and prefill workloads) before any rank starts. With ``--random N``,
    the scenario's first point gives the topology and algorithms, and N random shapes replace its workload
    (:mod:`simulator.distributed.random_shapes`)."""
    points = load_scenario(args.scenario, args.sets, bool(getattr(args, "force", False)))
    for point in points:
        if point.scenario.workload.kind not in REAL_KINDS:
            raise InputError("validate needs a decode or prefill workload", file=point.source,
                             field="workload.kind")
    if getattr(args, "random", None) is not None:
        if args.random < 1:
            raise InputError(f"must be at least 1, got {args.random}", field="--random")
        try:
            limit = checked_quantity(args.max_kv_bytes, "bytes", positive=True)
        except InputError as err:
            raise InputError(err.message, field="--max-kv-bytes") from None
        points = random_points(points[0], args.random, args.seed, args.procs, int(limit))
    return [prepare_point(point) for point in points]
