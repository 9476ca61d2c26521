"""One path through a sweep point: prepare it once (every point-level check, located), simulate it, give its rows.

:func:`prepare_point` turns a :class:`~simulator.run.scenario.Point` into a
:class:`~simulator.run.prepared.PreparedPoint` through its workload kind's ``prepare``
(:data:`simulator.run.kinds.KINDS`); it is the only place where point-level checks happen and errors get their
file:line. ``check_points`` (fail fast before a sweep), the sweep's workers (which receive the prepared points),
:func:`point_runs` (timelines, traces), ``plan`` and ``validate`` all start from a prepared point.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from simulator.errors import InputError
from simulator.run.kinds import kind_of
from simulator.run.prepared import PointOutcome, PreparedPoint, Run, cluster_for
from simulator.run.scenario import Point
from simulator.run.whatif import check_whatifs, whatif_rows

__all__ = ["check_points", "point_runs", "prepare_point", "run_point", "simulate_point"]


def prepare_point(point: Point, numeric: bool = False) -> PreparedPoint:
    """Check ``point`` and everything it names; raise a located :class:`InputError` on bad input."""
    cluster = cluster_for(point)
    try:
        kind = kind_of(point.scenario.workload.kind)
        if numeric and kind.numeric is not None:
            raise InputError(kind.numeric, field="workload.kind")
    except InputError as err:
        raise point.locate(err) from None
    prep = kind.prepare(point, cluster, numeric)  # located there
    try:
        check_whatifs(prep)
    except InputError as err:
        raise point.locate(err) from None
    return prep


def check_points(points: Sequence[Point], numeric: bool = False) -> list[PreparedPoint]:
    """Fail fast on bad input in any point (topology, algorithm names, numeric size), before simulating."""
    return [prepare_point(point, numeric) for point in points]


def simulate_point(prep: PreparedPoint, keep_runs: bool = False) -> PointOutcome:
    """Simulate every algorithm of one prepared point once: its rows (one extra column per swept key) and, with
    ``keep_runs``, the simulated schedules they came from (for ``scope: model``, one layer's attention)."""
    varied = prep.point.scenario.variability is not None  # trials of each row's schedule (run.whatif)
    rows, runs = kind_of(prep.kind).simulate(prep, keep_runs or varied)
    return PointOutcome(whatif_rows(prep, rows, runs), runs if keep_runs else None)


def run_point(point: Point, numeric: bool = False) -> list[dict[str, Any]]:
    """Prepare and simulate one sweep point; its rows carry one extra column per swept key."""
    return simulate_point(prepare_point(point, numeric)).rows


def point_runs(prep: PreparedPoint, record_links: bool = False) -> list[Run]:
    """Every algorithm of one point simulated with its schedule and full result (for traces); for ``scope: model``,
    one layer's attention."""
    return kind_of(prep.kind).runs(prep, record_links)
