"""Size limits: what a run would build, estimated before building it.

A sweep of a million points, a topology of a million GPUs or a schedule of a billion ops would not finish (or not
fit in memory); they are refused with one line that says how big and why, and ``--force`` lets them through. The
estimates are pure functions of the inputs (no graph, no schedule is built):

* sweep points: the product of the axis lengths;
* a ``builder: cluster`` topology: devices, switches and NICs plus directed links (``mesh`` inside a node is
  quadratic in ``gpus_per_node``), about :data:`BYTES_PER_GRAPH_ELEMENT` each in networkx;
* a decode schedule: ops of P ranks (``ring`` moves every shard to every rank: about 3 P^2 ops; the others are
  about 20 per rank plus a constant), about :data:`BYTES_PER_OP` each with their timeline records;
* a collective over P GPUs on C channels (:func:`collective_ops`), as a decode schedule's: per algorithm (the one
  it runs: ``auto`` is the tuner's pick, or where all its candidates are over the limit the smallest of them), ops
  of one rank and channel times P C: a ring allreduce passes P - 1 pieces twice (5 (P - 1): a send, a receive and
  a reduction, then a send and a receive), NCCL's tree pipelines at most 16 chunks of three parts, about five ops
  a part (240, whatever P; fewer parts for a small message), an all-to-all sends 2 (P - 1) on one channel; an
  algorithm not named (a what-if's trials): the largest of them;
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

__all__ = ["BYTES_PER_COLLECTIVE_OP", "BYTES_PER_GRAPH_ELEMENT", "BYTES_PER_OP", "MAX_COUNT", "MAX_GRAPH_ELEMENTS",
           "MAX_SCHEDULE_OPS", "MAX_SEQUENCE", "MAX_SIMULATED_OPS", "MAX_SWEEP_POINTS", "MAX_TRIALS", "MAX_TRIAL_OPS",
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
BYTES_PER_COLLECTIVE_OP = 260  # measured: a collective's ops are columns (benchmarks/engine_speed.py collective):
# ring allreduce on 64 hgx-h200 servers 10.5M ops, 2.60 GB peak RSS; tree on 1,000, 15.2M ops, 3.97 GB
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


# (operation, algorithm) -> ops of one rank and one channel given P ranks and G GPUs per server (collectives.channels
# builds them; measured on hgx-h200, dgx-h100 and mi300x, 1 to 8 servers, 1 MiB and 1 GiB: at or above the ops
# built, within 1 - 10 % at 1 GiB on several servers; tests/test_collective_limits.py holds them at or above, and
# within 40 % plus 1,000)
_COLLECTIVE_OPS: dict[tuple[str, str], Callable[[float, float], float]] = {
    ("allreduce", "ring"): lambda p, g: 5.0 * (p - 1),  # reduce-scatter (send, recv, reduction), allgather (two)
    ("allreduce", "tree"): lambda p, g: 240.0,  # 16 chunks of 3 parts: up a send, recv, reduction, down two
    ("allreduce", "hierarchical"): lambda p, g: 5.0 * (g - 1) + 5.0 * (p / g - 1),  # inside, across, inside
    ("allreduce", "recursive-doubling"): lambda p, g: 3.0 * math.log2(p) + 6.0,
    ("allreduce", "nvls"): lambda p, g: 200.0,  # one server: 64 slices up and down
    ("reduce-scatter", "ring"): lambda p, g: 3.0 * (p - 1),
    ("allgather", "ring"): lambda p, g: 2.0 * (p - 1),
    ("broadcast", "ring"): lambda p, g: 100.0,  # a pipeline of 16 chunks of three parts: a send and a recv each
    ("reduce", "ring"): lambda p, g: 150.0,  # ... and a reduction
    ("alltoall", "pairwise"): lambda p, g: 2.0 * (p - 1),
}


def collective_ops(ranks: int, channels: int, algorithm: str | None = None, operation: str = "allreduce",
                   gpus_per_server: int | None = None, parts: int | None = None) -> float:
    """Estimated ops of one collective ``operation`` over ``ranks`` GPUs on ``channels`` channels with
    ``algorithm`` (the one that runs, not ``auto``), ``gpus_per_server`` GPUs a server (default: all on one); an
    ``algorithm`` of None: the largest any algorithm may build (module docstring; a what-if's trials). ``parts``:
    a tree's pipeline parts a channel (:func:`simulator.collectives.nccl_tree.tree_parts`: fewer for a small
    message), five ops each (None: 48, a large message's)."""
    p = float(ranks)
    per_rank = _COLLECTIVE_OPS.get((operation, algorithm or ""))
    if per_rank is None:
        return channels * p * max(5.0 * p, 250.0) + 2.0 * p * p + 1_000
    g = float(gpus_per_server or ranks)
    own = 5.0 * parts if parts is not None and algorithm == "tree" else per_rank(p, g)
    return channels * p * own + p + 1_000  # a launch per rank


def check_collective(ranks: int, channels: int, field: str | None, force: bool = False, algorithm: str | None = None,
                     operation: str = "allreduce", gpus_per_server: int | None = None,
                     parts: int | None = None) -> None:
    """Refuse a collective estimated (:func:`collective_ops`) over :data:`MAX_SCHEDULE_OPS` ops."""
    ops = collective_ops(ranks, channels, algorithm, operation, gpus_per_server, parts)
    if ops > MAX_SCHEDULE_OPS and not force:
        what = f"the {algorithm} {operation}" if algorithm else "the collective"
        raise _refuse(f"{what} on {ranks:,} GPUs x {channels:,} channel(s) would have too many ops", ops,
                      MAX_SCHEDULE_OPS, BYTES_PER_COLLECTIVE_OP if algorithm else BYTES_PER_OP, field)


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
