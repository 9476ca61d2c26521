"""treering: a discrete-event simulator of GPU clusters for Ring vs Tree attention.

Public API: load a cluster (:func:`load_topology`), build or load a :class:`Schedule`, run it with
:func:`simulate`; the merge core lives in :mod:`simulator.merge`.
"""

from simulator.cluster import Cluster, load_topology
from simulator.engine import SimResult, simulate
from simulator.errors import InputError
from simulator.schedule.core import Op, Schedule

__version__ = "0.1.0"

__all__ = ["Cluster", "InputError", "Op", "Schedule", "SimResult", "__version__", "load_topology", "simulate"]
