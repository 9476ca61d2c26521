"""treering: a discrete-event simulator of GPU clusters for Ring vs Tree attention.

Public API: load a cluster (:func:`load_topology`), build or load a :class:`Schedule`, run it with
:func:`simulate`; the merge core lives in :mod:`simulator.merge`. The names are imported when first used, so that
``import simulator.X`` (the command line's ``--help`` among them) does not load the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Cluster", "InputError", "Op", "Schedule", "SimResult", "__version__", "load_topology", "simulate"]

_WHERE = {"Cluster": "simulator.cluster.topology", "load_topology": "simulator.cluster.topology",
          "SimResult": "simulator.engine.core", "simulate": "simulator.engine.core",
          "InputError": "simulator.errors", "Op": "simulator.schedule.op", "Schedule": "simulator.schedule.core"}

if TYPE_CHECKING:
    from simulator.cluster.topology import Cluster, load_topology
    from simulator.engine.core import SimResult, simulate
    from simulator.errors import InputError
    from simulator.schedule.core import Schedule
    from simulator.schedule.op import Op


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")
