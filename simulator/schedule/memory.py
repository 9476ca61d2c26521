"""Per-rank peak memory of a schedule: the maximum live sum of the buffers it holds over its timeline.

A rank holds its ``Schedule.initial`` buffers from t = 0; an op allocates its ``alloc`` buffers when it starts and
releases its ``free`` buffers when it ends. With op times from a simulation the order is the simulated one;
without, each rank's ops are taken one after the other in program order. At equal times frees come first.

Whether a peak fits is judged in one place, :func:`usable_bytes` and :func:`out_of_memory`: a GPU may use its
device memory x the scenario's ``mem_fraction``; every row's ``oom``, every report and both plans call them.
Pure: no simpy, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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
    listed = _listed(sched)
    if times is None:  # every op advances its rank's clock by one, in program order
        ranks = listed.field("rank", np.arange(len(listed)))
        clock = [0.0] * sched.ranks
        starts = []
        for r in ranks:
            starts.append(clock[r])
            clock[r] += 1.0
        return _peaks(sched, list(range(len(listed))), ranks, starts, [t + 1.0 for t in starts])
    ids = holding(sched) if holders is None else holders
    return _peaks(sched, ids, listed.field("rank", ids), *zip(*map(times.__getitem__, ids), strict=True)
                  if len(ids) else ([], []))


def _peaks(sched: Schedule, ids: Sequence[int] | np.ndarray, ranks: Sequence[int], starts: Sequence[float],
           ends: Sequence[float]) -> list[float]:
    """Peak bytes of every rank, its ops ``ids`` (of ``ranks``) allocating their buffers at ``starts`` and
    freeing at ``ends``; at equal times frees first, then in op order."""
    listed = _listed(sched)
    events: list[list[tuple[float, int, int, str, float]]] = [[] for _ in range(sched.ranks)]
    k = 0  # each event's place in op order (the sort's last key: what a stable sort kept)
    for r, start, end, alloc, free in zip(ranks, starts, ends, listed.field("alloc", ids), listed.field("free", ids),
                                          strict=True):
        ev = events[r]
        for name, nbytes in alloc:
            ev.append((start, 1, k, name, nbytes))
            k += 1
        for name in free:
            ev.append((end, 0, k, name, 0.0))
            k += 1
    peaks = []
    for r in range(sched.ranks):
        held = dict(sched.initial.get(r, {}))
        cur = peak = sum(held.values())
        events[r].sort()
        for _, is_alloc, _, name, nbytes in events[r]:
            if is_alloc:
                if name in held:
                    raise ValueError(f"rank {r}: buffer {name!r} allocated twice")
                held[name] = nbytes
                cur += nbytes
                peak = max(peak, cur)
            else:
                if name not in held:
                    raise ValueError(f"rank {r}: buffer {name!r} freed but not held")
                cur -= held.pop(name)
        peaks.append(peak)
    return peaks


def holding(sched: Schedule) -> list[int]:
    """Ids of the ops that allocate or free buffers, in op-id order (C-level passes over op tuples; a block of ops
    by its shared fields)."""
    return _listed(sched).holders()


def _listed(sched: Schedule) -> OpList:
    """The schedule's ops as an OpList (a schedule whose ops were set to a plain list of tuples is read as one)."""
    return sched.ops if isinstance(sched.ops, OpList) else OpList(sched.ops)


class Timed(Protocol):
    """A simulation's op times (:class:`~simulator.engine.core.SimResult`): arrays by op id, NaN where none."""

    start: np.ndarray
    end: np.ndarray


def timeline_peaks(sched: Schedule, result: Timed) -> list[float]:
    """Peak bytes of every rank, from a simulation's op times: only the ops that allocate or free buffers (and
    ended) are looked up."""
    holders = np.asarray(holding(sched), dtype=np.int64)
    ended = holders[~np.isnan(result.end[holders])]
    return _peaks(sched, ended, _listed(sched).field("rank", ended), result.start[ended].tolist(),
                  result.end[ended].tolist())
