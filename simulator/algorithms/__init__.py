"""Decode schedules by name (docs/algorithms.md): ``ring``, ``ring-q``, ``tree``, ``tree-p2p``, ``single``.

Each entry is an :class:`AlgorithmSpec`: a builder ``(shape, layout, **params) -> Schedule`` and its parameters
with defaults. Add an algorithm by adding an entry to :data:`REGISTRY` (see docs/algorithms.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from simulator.algorithms.base import Layout
from simulator.algorithms.ring import build_ring, build_ring_q
from simulator.algorithms.single import build_single
from simulator.algorithms.tree import build_tree, build_tree_p2p
from simulator.collectives import ALGORITHMS as COLLECTIVES
from simulator.errors import InputError, excerpt
from simulator.schedule.core import Schedule
from simulator.schedule.op import P2P_STREAMS
from simulator.support.gcpause import gc_paused
from simulator.workloads.shape import DecodeShape

__all__ = ["P2P_PARAM", "REGISTRY", "AlgorithmSpec", "Layout", "build_schedule", "built", "label", "resolve"]


@dataclass(frozen=True)
class AlgorithmSpec:
    """A schedule builder, the YAML names of its parameters (-> builder keyword, default, validator)."""

    build: Callable[..., Schedule]
    params: Mapping[str, tuple[str, Any, Callable[[Any], bool], str]]


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _arity(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 2 <= v <= MAX_ARITY


def _collective(v: Any) -> bool:
    return v in COLLECTIVES


MAX_ARITY = 1024  # the builder loops over the children of each node
_ALLREDUCE = ("allreduce_algo", "auto", _collective, f"one of {', '.join(COLLECTIVES)}")
# every schedule with sends and receives outside collectives: how its GPU ranks' ends map to NCCL kernels and
# streams (simulator.schedule.op.P2P_STREAMS), set on the built schedule rather than given to its builder
P2P_PARAM = ("p2p", "batched", lambda v: v in P2P_STREAMS, f"one of {', '.join(P2P_STREAMS)}")
REGISTRY: dict[str, AlgorithmSpec] = {
    "ring": AlgorithmSpec(build_ring, {"overlap": ("overlap", True, _bool, "true or false"), "p2p": P2P_PARAM}),
    "ring-q": AlgorithmSpec(build_ring_q, {"p2p": P2P_PARAM}),
    "tree": AlgorithmSpec(build_tree, {"allreduce": _ALLREDUCE}),
    "tree-p2p": AlgorithmSpec(build_tree_p2p, {
        "arity": ("arity", 2, _arity, f"an integer from 2 to {MAX_ARITY}"),
        "topology_aware": ("topology_aware", False, _bool, "true or false"),
        "p2p": P2P_PARAM,
    }),
    "single": AlgorithmSpec(build_single, {}),
}


def resolve(entry: str | Mapping[str, Any], field: str = "algorithms",
            registry: Mapping[str, AlgorithmSpec] | None = None) -> tuple[str, dict[str, Any]]:
    """``"tree"`` or ``{name: tree, allreduce: ring}`` -> (name, validated YAML parameters with defaults).

    ``registry``: the decode schedules by default (the prefill ones are in :mod:`simulator.algorithms.prefill`).
    """
    registry = REGISTRY if registry is None else registry
    raw: dict[str, Any] = {"name": entry} if isinstance(entry, str) else dict(entry)
    name = raw.pop("name", None)
    if name not in registry:
        raise InputError(f"unknown algorithm {excerpt(name)}; valid: {', '.join(registry)}", field=field)
    spec = registry[name]
    params = {key: default for key, (_, default, _, _) in spec.params.items()}
    for key, value in raw.items():
        if key not in spec.params:
            valid = ", ".join(spec.params) or "none"
            raise InputError(f"algorithm {name!r} has no parameter {excerpt(key)}; valid: {valid}",
                             field=f"{field}.{key}")
        _, _, ok, expected = spec.params[key]
        if not ok(value):
            raise InputError(f"must be {expected}, got {excerpt(value)}", field=f"{field}.{key}")
        params[key] = value
    return name, params


def label(name: str, params: Mapping[str, Any], registry: Mapping[str, AlgorithmSpec] | None = None) -> str:
    """Result label: the name, plus the parameters that differ from their defaults (``ring[overlap=False]``)."""
    spec = (REGISTRY if registry is None else registry)[name]
    extra = [f"{k}={v}" for k, v in params.items() if v != spec.params[k][1]]
    return f"{name}[{','.join(extra)}]" if extra else name


def built(spec: AlgorithmSpec, params: Mapping[str, Any], shape: Any, layout: Layout) -> Schedule:
    """``spec``'s schedule for ``params`` (YAML names, as :func:`resolve` returns them): its builder given the rest,
    the built schedule ``p2p``."""
    kwargs = {spec.params[k][0]: v for k, v in params.items()}
    p2p = kwargs.pop("p2p", "batched")
    with gc_paused():
        sched = spec.build(shape, layout, **kwargs)
    sched.p2p = p2p
    return sched


def build_schedule(name: str, params: Mapping[str, Any], shape: DecodeShape, layout: Layout) -> Schedule:
    """Build the named schedule (``params`` as returned by :func:`resolve`)."""
    return built(REGISTRY[name], params, shape, layout)
