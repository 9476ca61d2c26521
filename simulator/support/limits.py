"""Size limits: what a run would build, estimated before building it.

A sweep of a million points, a topology of a million GPUs or a schedule of a billion ops would not finish (or not
fit in memory); they are refused with one line that says how big and why, and ``--force`` lets them through. The
estimates are pure functions of the inputs (no graph, no schedule is built):

* sweep points: the product of the axis lengths;
* a ``builder: cluster`` topology: devices, switches and NICs plus directed links (``mesh`` inside a node is
  quadratic in ``gpus_per_node``), about :data:`BYTES_PER_GRAPH_ELEMENT` each in networkx;
* a decode schedule: ops of P ranks (``ring`` moves every shard to every rank: about 3 P^2 ops; the others are
  about 20 per rank plus a constant), about :data:`BYTES_PER_OP` each with their timeline records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from simulator.errors import InputError

__all__ = ["BYTES_PER_GRAPH_ELEMENT", "BYTES_PER_OP", "MAX_COUNT", "MAX_GRAPH_ELEMENTS", "MAX_SCHEDULE_OPS",
           "MAX_SWEEP_POINTS", "builder_elements", "check_builder", "check_graph", "check_schedule", "check_sweep",
           "schedule_ops"]

MAX_COUNT = 2**53  # any count: integers a float still counts exactly
MAX_SWEEP_POINTS = 10_000
MAX_GRAPH_ELEMENTS = 500_000
MAX_SCHEDULE_OPS = 10_000_000  # ~9 GB of ops and records (ring decode on 1,024 GPUs: 3.1M ops, 2.8 GB)
BYTES_PER_GRAPH_ELEMENT = 1_000
BYTES_PER_OP = 900  # measured: ring decode P = 1024, 3.1M ops, 2.77 GB peak RSS (benchmarks/engine_speed.py)
FORCE_HINT = "--force runs it anyway"

# algorithm -> ops of one rank given P ranks (measured on the decode schedules: ring 3P + 7, others <= 20; on the
# prefill schedules, forward + backward: ring 8P, allgather and ulysses about 4P: P - 1 steps of pieces)
_OPS_PER_RANK: dict[str, Callable[[int], float]] = {
    "ring": lambda p: 3.0 * p + 8, "single": lambda p: 2.0,
    "prefill:ring": lambda p: 8.0 * p + 16, "prefill:allgather": lambda p: 4.0 * p + 16,
    "prefill:ulysses": lambda p: 4.0 * p + 16, "prefill:single": lambda p: 4.0,
}


def _refuse(what: str, size: float, limit: int, unit_bytes: int, field: str | None) -> InputError:
    gb = size * unit_bytes / 1e9
    return InputError(f"{what}: about {size:.3g} (limit {limit:,}; ~{gb:.3g} GB of memory); {FORCE_HINT}",
                      field=field)


def check_sweep(points: int, force: bool = False) -> None:
    """Refuse a sweep of more than :data:`MAX_SWEEP_POINTS` points (before expanding it)."""
    if points > MAX_SWEEP_POINTS and not force:
        raise InputError(f"the sweep has {points:,} points (limit {MAX_SWEEP_POINTS:,}); {FORCE_HINT}",
                         field="sweep")


def builder_elements(p: Mapping[str, Any]) -> float:
    """Nodes plus directed links that the ``cluster`` builder would create for parameters ``p``."""
    n, g = float(p["nodes"]), float(p["gpus_per_node"])
    nics = float(p.get("nics_per_node") or g) if n > 1 else 0.0
    intra_links = g * (g - 1) / 2 if p.get("intra") == "mesh" else g
    leaves = nics if p.get("inter") == "rail" else math.ceil(n / float(p.get("nodes_per_leaf") or 1))
    spines = float(p.get("spines") or 1) if n > 1 else 0.0
    nodes = n * (g + 1 + nics) + leaves + spines
    links = n * (intra_links + 2 * nics) + leaves * spines
    return nodes + 2 * links


def check_builder(p: Mapping[str, Any], field: str | None, force: bool = False) -> None:
    """Refuse a builder topology over :data:`MAX_GRAPH_ELEMENTS` graph elements."""
    check_graph(builder_elements(p), f"this topology ({p['nodes']:,} nodes x {p['gpus_per_node']:,} GPUs, intra "
                f"{p.get('intra')})", field, force)


def check_graph(elements: float, what: str, field: str | None, force: bool = False) -> None:
    """Refuse a cluster graph estimated over :data:`MAX_GRAPH_ELEMENTS` nodes plus directed links."""
    if elements > MAX_GRAPH_ELEMENTS and not force:
        raise _refuse(f"{what} would have too many nodes and links", elements, MAX_GRAPH_ELEMENTS,
                      BYTES_PER_GRAPH_ELEMENT, field)


def schedule_ops(algorithm: str, ranks: int) -> float:
    """Estimated ops of ``algorithm``'s decode schedule on ``ranks`` ranks."""
    per_rank = _OPS_PER_RANK.get(algorithm, lambda p: 20.0)
    return ranks * per_rank(ranks) + 1_000


def check_schedule(algorithm: str, ranks: int, field: str | None, force: bool = False) -> None:
    """Refuse a schedule estimated over :data:`MAX_SCHEDULE_OPS` ops."""
    ops = schedule_ops(algorithm, ranks)
    if ops > MAX_SCHEDULE_OPS and not force:
        raise _refuse(f"the {algorithm} schedule on {ranks:,} ranks would have too many ops", ops, MAX_SCHEDULE_OPS,
                      BYTES_PER_OP, field)
