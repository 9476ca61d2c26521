"""``single``: one device holds the whole KV cache and attends alone. The reference, and what OOMs first."""

from __future__ import annotations

from simulator.algorithms.base import Layout, add_attend, add_finalize, new_decode_schedule
from simulator.schedule.core import Schedule
from simulator.workloads.shape import DecodeShape

__all__ = ["build_single"]


def build_single(shape: DecodeShape, layout: Layout) -> Schedule:
    """One device holds the whole KV cache and attends to it: the reference, and what runs out of memory first."""
    del layout  # one rank, whatever the cluster
    sched = new_decode_schedule("single", shape, 1)
    add_finalize(sched, shape, 0, [add_attend(sched, shape, 0, 0, "kv0", [], first=True)])
    sched.meta["outputs"] = [(0, "out")]
    return sched
