"""Checks and names shared by the launcher and the ranks (no torch here: the CLI imports it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.algorithms import resolve
from simulator.errors import InputError
from simulator.scenario import DecodeWorkload, Point, load_scenario

__all__ = ["check_scenario", "out_dir"]


def out_dir(args: argparse.Namespace, points: list[Point]) -> Path:
    """Where validate writes: ``-o DIR`` or ``out/<scenario name>-validation``."""
    return Path(args.out) if args.out else Path("out") / f"{points[0].scenario.name}-validation"


def check_scenario(args: argparse.Namespace) -> list[Point]:
    """Load and check the scenario (decode workloads only) before any rank starts."""
    points = load_scenario(args.scenario, args.sets)
    for point in points:
        if not isinstance(point.scenario.workload, DecodeWorkload):
            raise InputError("validate needs a decode workload", file=point.source, field="workload.kind")
        for i, entry in enumerate(point.scenario.algorithms):
            try:
                resolve(entry, field=f"algorithms.{i}")
            except InputError as err:
                raise point.locate(err) from None
    return points
