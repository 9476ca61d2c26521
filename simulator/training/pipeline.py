"""The 1F1B pipeline schedule over ``p`` stages and ``m`` micro-batches, and its interleaved form over ``v`` model
chunks per stage, timed exactly (pure).

**1F1B** (PipeDream-Flush, as Megatron-LM runs it; Narayanan et al., arXiv:2104.04473, figure 4): stage ``s`` runs
``min(p - s - 1, m)`` forwards (warm-up), then alternately one forward and one backward while forwards remain, then
the remaining backwards.

**Interleaved 1F1B** (the same paper, figure 4 bottom; Megatron-LM's ``forward_backward_pipelining_with_
interleaving``): each stage holds ``v`` chunks of layers, virtual stage ``g = c p + s`` being chunk ``c`` of stage
``s``. The ``v m`` virtual micro-batches of a stage run in groups of ``p``: virtual micro-batch ``k`` is micro-batch
``(k // (p v)) p + k % p`` on chunk ``(k // p) % v`` forward (``v - 1 -`` that backward); ``(p - s - 1) 2 + (v - 1)
p`` forwards warm up (all ``v m`` when ``m = p``), then one forward and one backward alternate, then the remaining
backwards. It needs ``m`` a multiple of ``p``.

Forward ``i`` of virtual stage ``g`` needs forward ``i`` of ``g - 1`` and its activation (``p2p`` seconds later);
backward ``i`` of ``g`` needs backward ``i`` of ``g + 1`` and its gradient (the last virtual stage: its own forward
``i``). A stage runs one op at a time in its order, each op as soon as its stage is free and its predecessor ended:
the event-driven run of this schedule, computed exactly.

For equal stages (forward ``f``, backward ``b`` per stage) and no transfer time 1F1B takes ``(m + p - 1)(f + b)``,
its bubble ``(p - 1) / (m + p - 1)``; interleaved, ``m (f + b) + (p - 1)(f + b) / v`` (tests).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from simulator.support.jitcache import njit

__all__ = ["Op", "Pipeline", "interleaved_order", "one_f_one_b", "peak_in_flight", "run_pipeline", "stage_order"]

Op = tuple[str, int, int]  # ("F" or "B", virtual stage, micro-batch)


def stage_order(stage: int, stages: int, m: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s ops in 1F1B order: ("F" or "B", micro-batch)."""
    warm = min(stages - stage - 1, m)
    order = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        order += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    order += [("B", i) for i in range(b, m)]
    return order


def interleaved_order(stage: int, stages: int, chunks: int, m: int) -> list[Op]:
    """Stage ``stage``'s ops in interleaved 1F1B order (module docstring); ``chunks = 1``: 1F1B's."""
    p, v = stages, chunks
    if v == 1:
        return [(kind, stage, i) for kind, i in stage_order(stage, p, m)]
    total = v * m
    warm = total if m == p else min((p - stage - 1) * 2 + (v - 1) * p, total)

    def op(k: int, forward: bool) -> Op:
        chunk = (k % (p * v)) // p
        chunk = chunk if forward else v - 1 - chunk
        return ("F" if forward else "B", chunk * p + stage, (k // (p * v)) * p + k % p)

    order = [op(k, True) for k in range(warm)]
    for k in range(total - warm):
        order += [op(k + warm, True), op(k, False)]
    order += [op(k, False) for k in range(total - warm, total)]
    return order


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A pipelined step: its makespan, each stage's end and busy seconds, and per stage and micro-batch the window
    of its backward (the first of its chunks' backwards starting, the last ending)."""

    makespan: float
    stage_end: tuple[float, ...]
    busy: tuple[float, ...]
    window_start: np.ndarray = dataclasses.field(compare=False)  # [stage, micro-batch]: its backwards' first start
    window_end: np.ndarray = dataclasses.field(compare=False)  # ... and last end
    fwd: tuple[float, ...] = ()  # what it was timed with: seconds per virtual stage
    bwd: tuple[float, ...] = ()

    def backward_window(self, stage: int, micro_batch: int) -> tuple[float, float]:
        """(start, end) of micro-batch ``micro_batch``'s backwards on ``stage``."""
        return float(self.window_start[stage, micro_batch]), float(self.window_end[stage, micro_batch])

    @property
    def bubble_frac(self) -> float:
        """Of the step, the share the busiest stage idles (0 for a step of no time)."""
        if self.makespan <= 0:
            return 0.0
        idle = (self.makespan - max(self.busy)) / self.makespan
        return idle if idle > 1e-12 else 0.0  # none, but for the rounding of the sums


def _order_array(orders: Sequence[Sequence[Op]]) -> tuple[np.ndarray, np.ndarray]:
    """``orders`` as arrays: ``ops[s, k] = (0 for F or 1 for B, virtual stage, micro-batch)``, and each stage's
    length."""
    p = len(orders)
    lengths = np.array([len(o) for o in orders], dtype=np.int64)
    ops = np.zeros((p, int(lengths.max(initial=0)), 3), dtype=np.int64)
    for s, order in enumerate(orders):
        if order:
            ops[s, : len(order)] = [(0 if kind == "F" else 1, g, i) for kind, g, i in order]
    return ops, lengths


@functools.lru_cache(maxsize=8)
def _interleaved_arrays(p: int, chunks: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_order_array` of every stage's interleaved 1F1B order (a plan times many layouts of one shape)."""
    ops, lengths = _order_array([interleaved_order(s, p, chunks, m) for s in range(p)])
    ops.setflags(write=False)
    lengths.setflags(write=False)
    return ops, lengths


@njit(cache=True)
def _timed(ops: np.ndarray, lengths: np.ndarray, fwd: np.ndarray, bwd: np.ndarray, m: int, p2p: float,
           free: np.ndarray, first: np.ndarray, stop: np.ndarray, extra: np.ndarray) -> bool:
    """Time the ops of :func:`_order_array` in place (``free[s]``: stage ``s``'s end; ``first``/``stop[s, i]``: the
    window of micro-batch ``i``'s backwards on stage ``s``; ``extra[g, i]``: seconds added to backward ``i`` of
    virtual stage ``g``); False when the orders deadlock."""
    p, count = ops.shape[0], fwd.shape[0]
    last = count - 1
    end_f = np.full((count, m), np.nan)
    end_b = np.full((count, m), np.nan)
    pos = np.zeros(p, dtype=np.int64)
    remaining = lengths.sum()
    while remaining:
        moved = False
        for s in range(p):
            while pos[s] < lengths[s]:
                kind, g, i = ops[s, pos[s], 0], ops[s, pos[s], 1], ops[s, pos[s], 2]
                if kind == 0:
                    if g == 0:
                        ready = 0.0
                    else:
                        e = end_f[g - 1, i]
                        if np.isnan(e):
                            break
                        ready = e + (p2p if (g - 1) % p != s else 0.0)
                else:
                    d = g if g == last else g + 1
                    e = end_f[g, i] if g == last else end_b[g + 1, i]
                    if np.isnan(e):
                        break
                    ready = e + (p2p if d % p != s else 0.0)
                start = free[s] if free[s] >= ready else ready
                if kind == 0:
                    free[s] = end_f[g, i] = start + fwd[g]
                else:
                    free[s] = end_b[g, i] = start + bwd[g] + extra[g, i]
                    first[s, i] = min(first[s, i], start)
                    stop[s, i] = max(stop[s, i], free[s])
                pos[s] += 1
                remaining -= 1
                moved = True
        if not moved:
            return False
    return True


def _run_arrays(ops: np.ndarray, lengths: np.ndarray, fwd: Sequence[float], bwd: Sequence[float], m: int,
                p2p: float, extra: np.ndarray | None = None) -> Pipeline:
    p = ops.shape[0]
    free = np.zeros(p)
    first, stop = np.full((p, m), np.inf), np.zeros((p, m))
    more = np.zeros((len(bwd), m)) if extra is None else np.asarray(extra, dtype=np.float64)
    if more.shape != (len(bwd), m):
        raise ValueError(f"extra backward seconds per virtual stage and micro-batch: shape {(len(bwd), m)}, got "
                         f"{more.shape}")
    if not _timed(ops, lengths, np.asarray(fwd, dtype=np.float64), np.asarray(bwd, dtype=np.float64), m,
                  float(p2p), free, first, stop, more):
        raise AssertionError("pipeline order deadlocked")  # cannot happen with the published orders
    busy = tuple(m * sum(fwd[g] + bwd[g] for g in range(s, len(fwd), p)) + float(more[s::p].sum()) for s in range(p))
    stage_end = tuple(free.tolist())
    first.setflags(write=False)
    stop.setflags(write=False)
    return Pipeline(max(stage_end), stage_end, busy, first, stop, tuple(fwd), tuple(bwd))


def run_pipeline(orders: Sequence[Sequence[Op]], fwd: Sequence[float], bwd: Sequence[float], m: int,
                 p2p: float = 0.0) -> Pipeline:
    """Time ``orders[s]`` (stage ``s``'s ops) with ``fwd[g]``, ``bwd[g]`` seconds of one micro-batch on virtual
    stage ``g`` (stage ``g % p``) and ``p2p`` seconds between consecutive virtual stages on different stages.

    A stage runs its next op once its stage is free and the op's predecessor ended (module docstring); each op's
    end is ``max(stage free, predecessor's end + p2p) + its seconds``, whichever order the ops are visited in, so
    the compiled walk (:func:`_timed`) gives the event-driven run's floats."""
    ops, lengths = _order_array(orders)
    return _run_arrays(ops, lengths, fwd, bwd, m, p2p)


def one_f_one_b(fwd: Sequence[float], bwd: Sequence[float], m: int, p2p: float = 0.0, chunks: int = 1,
                extra: np.ndarray | None = None) -> Pipeline:
    """Time (interleaved, with ``chunks`` > 1) 1F1B: ``fwd``, ``bwd`` per virtual stage (``p x chunks`` of them,
    chunk-major: virtual stage ``c p + s``); ``extra[g, i]``: seconds backward ``i`` of virtual stage ``g`` takes
    beyond ``bwd[g]`` (what a collective overlapping it costs it)."""
    if not fwd or len(bwd) != len(fwd) or m < 1 or len(fwd) % chunks:
        raise ValueError("one forward and one backward time per virtual stage, and at least one micro-batch")
    p = len(fwd) // chunks
    if chunks > 1 and m % p:
        raise ValueError(f"interleaved 1F1B needs the micro-batches ({m}) a multiple of the stages ({p})")
    ops, lengths = _interleaved_arrays(p, chunks, m)
    return _run_arrays(ops, lengths, fwd, bwd, m, p2p, extra)


def peak_in_flight(order: Sequence[Op], weight: Sequence[float]) -> float:
    """The most forwards a stage holds without their backward, each weighted by ``weight[g]`` (its layers)."""
    live = peak = 0.0
    for kind, g, _ in order:
        live += weight[g] if kind == "F" else -weight[g]
        peak = max(peak, live)
    return peak
