"""Prefill / training schedules by name (docs/reference.md): ``ring``, ``ring-q``, ``allgather``, ``ulysses``,
``usp``, ``single``, and ``auto`` (pass-KV ``ring`` or pass-Q ``ring-q``: the prefill kind simulates both and keeps
the faster, saying which in its ``chosen`` column; built on its own, as here, it is
:func:`~simulator.algorithms.prefill.rule.pass_rule`'s pick by bytes).

The same :class:`~simulator.algorithms.AlgorithmSpec` entries as the decode registry: a builder
``(PrefillShape, layout, **params) -> Schedule`` and its parameters. Each builds the forward and, when the shape
has ``backward``, the backward after it. See :mod:`simulator.algorithms.prefill.base` for the kernels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simulator.algorithms import P2P_PARAM, AlgorithmSpec, Layout, built
from simulator.algorithms.prefill.gathered import build_prefill_allgather
from simulator.algorithms.prefill.ring import build_prefill_ring
from simulator.algorithms.prefill.ring_q import build_prefill_ring_q
from simulator.algorithms.prefill.rule import pass_rule
from simulator.algorithms.prefill.single import build_prefill_single
from simulator.algorithms.prefill.ulysses import build_prefill_ulysses, check_ulysses
from simulator.algorithms.prefill.usp import build_prefill_usp, usp_degrees
from simulator.collectives.alltoall import ALLTOALL
from simulator.errors import InputError
from simulator.schedule.core import Schedule
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["ON_CACHED_PREFIX", "PREFILL_REGISTRY", "build_prefill", "check_prefill", "check_ulysses", "usp_degrees"]


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def build_prefill_auto(shape: PrefillShape, layout: Layout) -> Schedule:
    """The rule's pick (:func:`~simulator.algorithms.prefill.rule.pass_rule`), named in ``meta['chosen']``."""
    chosen = pass_rule(shape, layout.ranks)
    build = build_prefill_ring if chosen == "ring" else build_prefill_ring_q
    sched = build(shape, layout)
    sched.meta["chosen"] = chosen
    return sched


PREFILL_REGISTRY: dict[str, AlgorithmSpec] = {
    "ring": AlgorithmSpec(build_prefill_ring, {"overlap": ("overlap", True, _bool, "true or false"),
                                               "p2p": P2P_PARAM}),
    "ring-q": AlgorithmSpec(build_prefill_ring_q, {"overlap": ("overlap", True, _bool, "true or false"),
                                                   "p2p": P2P_PARAM}),
    "allgather": AlgorithmSpec(build_prefill_allgather, {}),
    "ulysses": AlgorithmSpec(build_prefill_ulysses, {
        "alltoall": ("alltoall", "pairwise", lambda v: v in ALLTOALL, f"one of {', '.join(ALLTOALL)}")}),
    "usp": AlgorithmSpec(build_prefill_usp, {
        "ulysses": ("ulysses", 0, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                    "a whole number >= 0 (0: the GPUs of a server, as the heads allow)"),
        "overlap": ("overlap", True, _bool, "true or false"), "p2p": P2P_PARAM}),
    "single": AlgorithmSpec(build_prefill_single, {}),
    "auto": AlgorithmSpec(build_prefill_auto, {"p2p": P2P_PARAM}),
}


# the schedules that prefill on a cached prefix (``shape.cached``): the cache sharded by the layout stays with its
# rank and is attended to where it is (``ring`` passes it on with the new K/V; ``single`` holds all of it)
ON_CACHED_PREFIX = ("ring", "ring-q", "single", "auto")


def check_prefill(name: str, shape: PrefillShape) -> None:
    """A cached prefix needs a schedule that attends to it where it lies (:data:`ON_CACHED_PREFIX`)."""
    if shape.cached and name not in ON_CACHED_PREFIX:
        raise InputError(f"{name} does not prefill on a cached prefix (cached: {shape.cached}); schedules that do: "
                         f"{', '.join(ON_CACHED_PREFIX)}", field="workload.cached")


def build_prefill(name: str, params: Mapping[str, Any], shape: PrefillShape, layout: Layout) -> Schedule:
    """Build the named prefill schedule (``params`` as returned by ``resolve(..., registry=PREFILL_REGISTRY)``)."""
    return built(PREFILL_REGISTRY[name], params, shape, layout)
