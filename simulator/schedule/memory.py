"""Per-rank peak memory of a schedule: the maximum live sum of the buffers it holds over its timeline.

A rank holds its ``Schedule.initial`` buffers from t = 0; an op allocates its ``alloc`` buffers when it starts and
releases its ``free`` buffers when it ends. With op times from a simulation the order is the simulated one;
without, each rank's ops are taken one after the other in program order. At equal times frees come first.

Whether a peak fits is judged in one place, :func:`usable_bytes` and :func:`out_of_memory`: a GPU may use its
device memory x the scenario's ``mem_fraction``; every row's ``oom``, every report and both plans call them.
Pure: no simpy, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Protocol

import numpy as np

from simulator.schedule.core import Schedule
from simulator.schedule.oplist import OpList

__all__ = ["Timed", "holding", "out_of_memory", "peak_memory", "timeline_peaks", "usable_bytes"]


def usable_bytes(device_bytes: float, mem_fraction: float) -> float:
    """Bytes a GPU of ``device_bytes`` may hold before it is out of memory: its memory x ``mem_fraction`` (the rest
    is the runtime's, activations', fragmentation's; vLLM's gpu_memory_utilization defaults to 0.9)."""
    return device_bytes * mem_fraction


def out_of_memory(peaks: Iterable[tuple[float, float]]) -> bool:
    """Whether any (peak bytes, usable bytes) pair, one per GPU, has its peak over its usable memory."""
    return any(peak > usable for peak, usable in peaks)


def peak_memory(sched: Schedule, times: Mapping[int, tuple[float, float]] | None = None,
                holders: list[int] | None = None) -> list[float]:
    """Peak bytes of every rank. ``times[op_id] = (start, end)`` (e.g. from the engine's timeline) of at least the
    ops that allocate or free buffers (``holders``: their ids in op-id order, when the caller has them)."""
    events: list[list[tuple[float, int, str, float]]] = [[] for _ in range(sched.ranks)]
    sizes: list[dict[str, float]] = [dict(sched.initial.get(r, {})) for r in range(sched.ranks)]
    live = [sum(s.values()) for s in sizes]
    clock = [0.0] * sched.ranks
    # without times every op advances its rank's clock; with times only the ops that hold something matter (and
    # ``times`` may leave the others out)
    listed = sched.ops if isinstance(sched.ops, OpList) else OpList(sched.ops)
    ops = listed if times is None else listed.take(holding(sched) if holders is None else holders)
    for op in ops:
        if times is None:
            start, end = clock[op.rank], clock[op.rank] + 1.0
            clock[op.rank] = end
        else:
            start, end = times[op.id]
        for name, nbytes in op.alloc:
            events[op.rank].append((start, 1, name, nbytes))
        for name in op.free:
            events[op.rank].append((end, 0, name, 0.0))
    peaks = list(live)
    for r in range(sched.ranks):
        held = sizes[r]
        cur = live[r]
        for _, is_alloc, name, nbytes in sorted(events[r], key=lambda e: (e[0], e[1])):
            if is_alloc:
                if name in held:
                    raise ValueError(f"rank {r}: buffer {name!r} allocated twice")
                held[name] = nbytes
                cur += nbytes
                peaks[r] = max(peaks[r], cur)
            else:
                if name not in held:
                    raise ValueError(f"rank {r}: buffer {name!r} freed but not held")
                cur -= held.pop(name)
    return peaks


def holding(sched: Schedule) -> list[int]:
    """Ids of the ops that allocate or free buffers, in op-id order (C-level passes over op tuples; a block of ops
    by its shared fields)."""
    return (sched.ops if isinstance(sched.ops, OpList) else OpList(sched.ops)).holders()


class Timed(Protocol):
    """A simulation's op times (:class:`~simulator.engine.core.SimResult`): arrays by op id, NaN where none."""

    start: np.ndarray
    end: np.ndarray


def timeline_peaks(sched: Schedule, result: Timed) -> list[float]:
    """Peak bytes of every rank, from a simulation's op times: only the ops that allocate or free buffers (and
    ended) are looked up."""
    holders = holding(sched)
    ended = [i for i in holders if not math.isnan(result.end[i])]
    times = dict(zip(ended, zip(result.start[ended].tolist(), result.end[ended].tolist(), strict=True), strict=True))
    return peak_memory(sched, times, holders)
