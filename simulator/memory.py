"""Per-rank peak memory of a schedule: the maximum live sum of the buffers it holds over its timeline.

A rank holds its ``Schedule.initial`` buffers from t = 0; an op allocates its ``alloc`` buffers when it starts and
releases its ``free`` buffers when it ends. With op times from a simulation the order is the simulated one;
without, each rank's ops are taken one after the other in program order. At equal times frees come first.
Pure: no simpy, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from simulator.schedule import Schedule

__all__ = ["peak_memory", "timeline_peaks"]


def peak_memory(sched: Schedule, times: Mapping[int, tuple[float, float]] | None = None) -> list[float]:
    """Peak bytes of every rank. ``times[op_id] = (start, end)`` (e.g. from the engine's timeline) of at least the
    ops that allocate or free buffers."""
    events: list[list[tuple[float, int, str, float]]] = [[] for _ in range(sched.ranks)]
    sizes: list[dict[str, float]] = [dict(sched.initial.get(r, {})) for r in range(sched.ranks)]
    live = [sum(s.values()) for s in sizes]
    clock = [0.0] * sched.ranks
    for op in sched.ops:
        if times is not None and not op.alloc and not op.free:
            continue  # holds nothing: its times do not matter (and ``times`` may leave it out)
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


def timeline_peaks(sched: Schedule, timeline: Iterable[Any]) -> list[float]:
    """Peak bytes of every rank, from a simulated timeline (records with ``op``, ``start``, ``end``): only the ops
    that allocate or free buffers are looked up."""
    held = {op.id for op in sched.ops if op.alloc or op.free}
    return peak_memory(sched, {rec.op: (rec.start, rec.end) for rec in timeline if rec.op in held})
