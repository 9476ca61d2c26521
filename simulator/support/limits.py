"""Size limits: what a run would build, estimated before building it.

A sweep of a million points, a topology of a million GPUs or a schedule of a billion ops would not finish (or not
fit in memory); they are refused with one line that says how big and why, and ``--force`` lets them through. The
estimates are pure functions of the inputs (no graph, no schedule is built):

* sweep points: the product of the axis lengths;
* a ``builder: cluster`` topology: devices, switches and NICs plus directed links (``mesh`` inside a node is
  quadratic in ``gpus_per_node``), about :data:`BYTES_PER_GRAPH_ELEMENT` each in networkx;
* a decode schedule: ops of P ranks (``ring`` moves every shard to every rank: about 3 P^2 ops; the others are
  about 20 per rank plus a constant), about :data:`BYTES_PER_OP` each with their timeline records;
* a collective over P GPUs on C channels (:func:`collective_ops`): a ring passes P - 1 pieces twice per rank and
  channel (about 5 P ops per rank and channel, measured on allreduce), NCCL's tree pipelines about 250 per rank and
  channel, an all-to-all sends 2 P per rank: whatever the algorithm, the largest of them;
* the ops one point simulates one after another (:func:`check_simulated`): a generate point runs ``new_tokens``
  decode steps per schedule, each a schedule of its own, about :data:`SECONDS_PER_OP` each;
* a scenario's ``variability:`` (:func:`check_trials`): at most :data:`MAX_TRIALS` trials, and the trials of a
  point's schedules at most :data:`MAX_TRIAL_OPS` ops in all (a varied trial costs about
  :data:`SECONDS_PER_TRIAL_OP` per op).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from simulator.errors import InputError

__all__ = ["BYTES_PER_GRAPH_ELEMENT", "BYTES_PER_OP", "MAX_COUNT", "MAX_GRAPH_ELEMENTS", "MAX_SCHEDULE_OPS",
           "MAX_SEQUENCE", "MAX_SIMULATED_OPS", "MAX_SWEEP_POINTS", "MAX_TRIALS", "MAX_TRIAL_OPS",
           "SECONDS_PER_OP", "SECONDS_PER_TRIAL_OP", "builder_elements", "check_builder", "check_collective",
           "check_graph", "check_schedule", "check_simulated", "check_sweep", "check_trials", "collective_ops",
           "schedule_ops"]

MAX_COUNT = 2**53  # any count: integers a float still counts exactly
MAX_SEQUENCE = 2**31  # a sequence attending to itself: its (query, key) pairs, ~2^61, still fit an int64
MAX_SWEEP_POINTS = 10_000
MAX_TRIALS = 10_000  # simulations of one schedule with varied durations (variability.trials)
MAX_TRIAL_OPS = 200_000_000  # ops simulated over a point's trials: about 2 min of CPU
SECONDS_PER_TRIAL_OP = 5e-7  # measured: a varied trial of ring decode at P = 256, 196,352 ops, 0.1 s of CPU
MAX_GRAPH_ELEMENTS = 500_000
MAX_SCHEDULE_OPS = 10_000_000  # ~9 GB of ops and records (ring decode on 1,024 GPUs: 3.1M ops, 2.8 GB)
BYTES_PER_GRAPH_ELEMENT = 1_000
BYTES_PER_OP = 900  # measured: ring decode P = 1024, 3.1M ops, 2.77 GB peak RSS (benchmarks/engine_speed.py)
MAX_SIMULATED_OPS = 20_000_000  # ops one point simulates in turn: about a minute
SECONDS_PER_OP = 3e-6  # measured: generate of llama-3.1-8b on dgx-h100, 8 and 16 GPUs: 2.4-4 us per estimated op
FORCE_HINT = "--force runs it anyway"

# algorithm -> ops of one rank given P ranks (measured on the decode schedules: ring 3P + 7, others <= 20; on the
# prefill schedules, forward + backward: ring 8P, allgather and ulysses about 4P: P - 1 steps of pieces)
_OPS_PER_RANK: dict[str, Callable[[int], float]] = {
    "ring": lambda p: 3.0 * p + 8, "single": lambda p: 2.0,
    "prefill:ring": lambda p: 8.0 * p + 16, "prefill:allgather": lambda p: 4.0 * p + 16,
    "prefill:ulysses": lambda p: 4.0 * p + 16, "prefill:single": lambda p: 4.0,
    "prefill:usp": lambda p: 8.0 * p + 16,  # at most ring's (a ring over fewer ranks, all-to-alls inside a server)
    "prefill:ring-q": lambda p: 11.0 * p + 16,  # per step a query send/recv, a block, a partial's send/recv and
    # merge (forward); a bundle's send/recv, a block, a dQ send/recv (backward): 11.2M ops at P = 1024
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
    shared = nics if 0 < nics < g and p.get("intra") != "pcie-host" else 0.0  # PCIe switches GPUs share with NICs
    nodes = n * (g + 1 + nics + shared) + leaves + spines
    links = n * (intra_links + 2 * nics + (g if shared else 0.0)) + leaves * spines
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


def collective_ops(ranks: int, channels: int) -> float:
    """Estimated ops of one collective over ``ranks`` GPUs on ``channels`` channels, whatever its algorithm (module
    docstring; measured on hgx-h200, 8 to 64 GPUs: ring allreduce 5.0 P ops per rank and channel, tree 224-234,
    alltoall 2 (P - 1) per rank)."""
    p = float(ranks)
    return channels * p * max(5.0 * p, 250.0) + 2.0 * p * p + 1_000


def check_collective(ranks: int, channels: int, field: str | None, force: bool = False) -> None:
    """Refuse a collective estimated over :data:`MAX_SCHEDULE_OPS` ops."""
    ops = collective_ops(ranks, channels)
    if ops > MAX_SCHEDULE_OPS and not force:
        raise _refuse(f"the collective on {ranks:,} GPUs x {channels:,} channel(s) would have too many ops", ops,
                      MAX_SCHEDULE_OPS, BYTES_PER_OP, field)


def check_simulated(ops: float, what: str, field: str | None, force: bool = False) -> None:
    """Refuse a point that would simulate more than :data:`MAX_SIMULATED_OPS` ops one after another (``what``
    says which: ``100,000 decode steps x 2 schedules on 8 GPUs``), with the time it would take."""
    if ops > MAX_SIMULATED_OPS and not force:
        minutes = ops * SECONDS_PER_OP / 60
        raise InputError(f"{what} would simulate about {ops:.3g} ops (limit {MAX_SIMULATED_OPS:,}; about "
                         f"{minutes:,.0f} min); {FORCE_HINT}", field=field)


def check_trials(trials: int, ops: float, field: str | None, force: bool = False) -> None:
    """Refuse more than :data:`MAX_TRIALS` trials, or trials of a point's schedules (``ops`` in all, each simulated
    once more per trial) over :data:`MAX_TRIAL_OPS` ops in all."""
    if trials > MAX_TRIALS and not force:
        raise InputError(f"{trials:,} trials (limit {MAX_TRIALS:,}); {FORCE_HINT}", field=field)
    if trials * ops > MAX_TRIAL_OPS and not force:
        minutes = trials * ops * SECONDS_PER_TRIAL_OP / 60
        raise InputError(f"{trials:,} trials of schedules of about {ops:.3g} ops would simulate about "
                         f"{trials * ops:.3g} ops (limit {MAX_TRIAL_OPS:,}; about {minutes:,.0f} min of CPU); "
                         f"{FORCE_HINT}", field=field)
