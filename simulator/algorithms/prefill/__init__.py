"""Prefill / training schedules by name (docs/reference.md): ``ring``, ``allgather``, ``ulysses``, ``single``.

The same :class:`~simulator.algorithms.AlgorithmSpec` entries as the decode registry: a builder
``(PrefillShape, layout, **params) -> Schedule`` and its parameters. Each builds the forward and, when the shape
has ``backward``, the backward after it. See :mod:`simulator.algorithms.prefill.base` for the kernels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simulator.algorithms import AlgorithmSpec, Layout
from simulator.algorithms.prefill.gathered import build_prefill_allgather
from simulator.algorithms.prefill.ring import build_prefill_ring
from simulator.algorithms.prefill.single import build_prefill_single
from simulator.algorithms.prefill.ulysses import build_prefill_ulysses, check_ulysses
from simulator.collectives.alltoall import ALLTOALL
from simulator.schedule.core import Schedule
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["PREFILL_REGISTRY", "build_prefill", "check_ulysses"]


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


PREFILL_REGISTRY: dict[str, AlgorithmSpec] = {
    "ring": AlgorithmSpec(build_prefill_ring, {"overlap": ("overlap", True, _bool, "true or false")}),
    "allgather": AlgorithmSpec(build_prefill_allgather, {}),
    "ulysses": AlgorithmSpec(build_prefill_ulysses, {
        "alltoall": ("alltoall", "pairwise", lambda v: v in ALLTOALL, f"one of {', '.join(ALLTOALL)}")}),
    "single": AlgorithmSpec(build_prefill_single, {}),
}


def build_prefill(name: str, params: Mapping[str, Any], shape: PrefillShape, layout: Layout) -> Schedule:
    """Build the named prefill schedule (``params`` as returned by ``resolve(..., registry=PREFILL_REGISTRY)``)."""
    spec = PREFILL_REGISTRY[name]
    kwargs = {spec.params[k][0]: v for k, v in params.items()}
    return spec.build(shape, layout, **kwargs)
