"""Checks and names shared by the launcher and the ranks (no torch here: the CLI imports it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.errors import InputError
from simulator.points import PreparedPoint, prepare_point
from simulator.scenario import DecodeWorkload, load_scenario
from simulator.workloads import PrefillWorkload

__all__ = ["check_scenario", "out_dir"]


def out_dir(args: argparse.Namespace, prepared: list[PreparedPoint]) -> Path:
    """Where validate writes: ``-o DIR`` or ``out/<scenario name>-validation``."""
    return Path(args.out) if args.out else Path("out") / f"{prepared[0].point.scenario.name}-validation"


def check_scenario(args: argparse.Namespace) -> list[PreparedPoint]:
    """Load and check the scenario (decode and prefill workloads) before any rank starts."""
    prepared = []
    for point in load_scenario(args.scenario, args.sets):
        if not isinstance(point.scenario.workload, (DecodeWorkload, PrefillWorkload)):
            raise InputError("validate needs a decode or prefill workload", file=point.source,
                             field="workload.kind")
        prepared.append(prepare_point(point))
    return prepared
