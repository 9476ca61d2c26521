"""The cluster room: topology YAML and parametric builders -> :class:`Cluster` (a networkx graph with device
specs), device specs and the roofline, routing, the ``topo`` commands and importing real servers. ``Cluster`` and
``load_topology`` are imported when first used (importing a light module of this room does not load the rest)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["Cluster", "load_topology"]

if TYPE_CHECKING:
    from simulator.cluster.topology import Cluster, load_topology


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module("simulator.cluster.topology"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'simulator.cluster' has no attribute {name!r}")
