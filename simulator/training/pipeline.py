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

__all__ = ["DPStreams", "Op", "Pipeline", "interleaved_order", "one_f_one_b", "peak_in_flight", "run_pipeline",
           "stage_order"]

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
    stream_end: tuple[float, ...] = ()  # per stage, when its DP stream ends (0: none)

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
           free: np.ndarray, first: np.ndarray, stop: np.ndarray, over: np.ndarray, count: np.ndarray,
           secs: np.ndarray, pace_f: np.ndarray, pace_b: np.ndarray, sfree: np.ndarray, slowed: np.ndarray) -> bool:
    """Time the ops of :func:`_order_array` in place (``free[s]``: stage ``s``'s end; ``first``/``stop[s, i]``: the
    window of micro-batch ``i``'s backwards on stage ``s``); False when the orders deadlock.

    DP streams (:class:`DPStreams`): the backwards of micro-batch ``i`` with ``over[i]`` hand stage ``s``'s stream
    ``count[s]`` buckets of ``secs[s]`` seconds, bucket ``j`` once they have done ``(j + 1) / count[s]`` of the
    micro-batch's backward work on the stage; the stream runs them one after another (``sfree[s]``: when it is
    free); while it is busy the stage's forwards run at ``pace_f[s]`` of their pace, its backwards at ``pace_b[s]``
    (``slowed[s]``: the seconds that added)."""
    p, count_v = ops.shape[0], fwd.shape[0]
    last = count_v - 1
    end_f = np.full((count_v, m), np.nan)
    end_b = np.full((count_v, m), np.nan)
    done = np.zeros((p, m))  # backward work done per stage and micro-batch (seconds alone)
    ready = np.zeros((p, m), dtype=np.int64)  # buckets handed to the stream
    work = np.zeros(p)  # a micro-batch's backward work on a stage
    for g in range(count_v):
        work[g % p] += bwd[g]
    pos = np.zeros(p, dtype=np.int64)
    remaining = lengths.sum()
    while remaining:
        moved = False
        for s in range(p):
            while pos[s] < lengths[s]:
                kind, g, i = ops[s, pos[s], 0], ops[s, pos[s], 1], ops[s, pos[s], 2]
                if kind == 0:
                    if g == 0:
                        at = 0.0
                    else:
                        e = end_f[g - 1, i]
                        if np.isnan(e):
                            break
                        at = e + (p2p if (g - 1) % p != s else 0.0)
                else:
                    d = g if g == last else g + 1
                    e = end_f[g, i] if g == last else end_b[g + 1, i]
                    if np.isnan(e):
                        break
                    at = e + (p2p if d % p != s else 0.0)
                start = free[s] if free[s] >= at else at
                seconds = fwd[g] if kind == 0 else bwd[g]
                hands = kind == 1 and over[i] and count[s] > 0
                if sfree[s] <= start and not hands:
                    end = start + seconds  # the stream idle and handed nothing: the op at its own pace
                else:
                    pace = pace_f[s] if kind == 0 else pace_b[s]
                    end = _beside_stream(s, i, start, seconds, hands, g == s, pace, work[s], count[s], secs[s], sfree,
                                         done, ready)
                    if pace < 1.0:  # (at full pace the op kept its own floats)
                        slowed[s] += (end - start) - seconds
                if kind == 0:
                    free[s] = end_f[g, i] = end
                else:
                    free[s] = end_b[g, i] = end
                    first[s, i] = min(first[s, i], start)
                    stop[s, i] = max(stop[s, i], free[s])
                pos[s] += 1
                remaining -= 1
                moved = True
        if not moved:
            return False
    return True


@njit(cache=True)
def _beside_stream(s: int, i: int, t: float, seconds: float, hands: bool, closes: bool, pace: float, work: float,
                   count: int, secs: float, sfree: np.ndarray, done: np.ndarray, ready: np.ndarray) -> float:
    """When an op of ``seconds`` (alone) that starts at ``t`` on stage ``s`` ends beside the stage's DP stream
    (:func:`_timed`): at ``pace`` while the stream is busy; with ``hands``, a backward of micro-batch ``i`` that hands
    the stream its buckets as its work passes theirs (``closes``: the micro-batch's last backward on the stage,
    which hands whatever is left when it ends)."""
    begin, left = t, seconds
    while left > 0.0:
        to_bucket = np.inf
        if hands and ready[s, i] < count:
            to_bucket = work * (ready[s, i] + 1) / count - done[s, i]
            if to_bucket < 0.0:
                to_bucket = 0.0
        step = left if left < to_bucket else to_bucket
        if t < sfree[s] and step / pace > sfree[s] - t:  # the stream frees first
            did = (sfree[s] - t) * pace
            t = sfree[s]
            reached = False
        else:
            t += step / pace if t < sfree[s] else step
            did = step
            reached = step == to_bucket
        left -= did
        if hands:
            done[s, i] += did
        if reached:
            _hand(s, i, t, work, count, secs, sfree, done, ready)
    # a bucket whose work ends with this op's, but for rounding (a chunk's end): handed now, not at the next op;
    # the micro-batch's last backward on the stage hands whatever is left
    while hands and ready[s, i] < count and (closes or done[s, i] >= work * (ready[s, i] + 1) / count - 1e-12 * work):
        _hand(s, i, t, work, count, secs, sfree, done, ready)
    return begin + seconds if pace >= 1.0 else t  # at full pace: the op's own floats


@njit(cache=True, inline="always")
def _hand(s: int, i: int, t: float, work: float, count: int, secs: float, sfree: np.ndarray, done: np.ndarray,
          ready: np.ndarray) -> None:
    """Micro-batch ``i``'s next bucket handed to stage ``s``'s stream at ``t``: it runs after the stream's last."""
    sfree[s] = (sfree[s] if sfree[s] > t else t) + secs
    ready[s, i] += 1
    done[s, i] = work * ready[s, i] / count


@dataclasses.dataclass(frozen=True)
class DPStreams:
    """Each stage's DP gradient stream beside its pipeline (:func:`_timed`): the micro-batches whose backwards hand
    it buckets (``micro_batches``: every one with ZeRO 2, the last with 0 and 1), per stage the buckets of a
    micro-batch, each bucket's collective's seconds, and the pace of the stage's forwards and backwards while a
    collective runs (its kernel holding SMs: :meth:`simulator.training.step.Pieces.pace`)."""

    micro_batches: tuple[int, ...]
    count: tuple[int, ...]
    seconds: tuple[float, ...]
    pace_f: tuple[float, ...]
    pace_b: tuple[float, ...]


def _run_arrays(ops: np.ndarray, lengths: np.ndarray, fwd: Sequence[float], bwd: Sequence[float], m: int,
                p2p: float, dp: DPStreams | None = None) -> Pipeline:
    p = ops.shape[0]
    free = np.zeros(p)
    first, stop = np.full((p, m), np.inf), np.zeros((p, m))
    over = np.zeros(m, dtype=np.bool_)
    count, secs, pace_f, pace_b = np.zeros(p, dtype=np.int64), np.zeros(p), np.ones(p), np.ones(p)
    if dp is not None:
        if not len(dp.count) == len(dp.seconds) == len(dp.pace_f) == len(dp.pace_b) == p:
            raise ValueError(f"DP streams: one bucket count, time and pace per stage ({p})")
        if not all(0.0 < x <= 1.0 for x in (*dp.pace_f, *dp.pace_b)):
            raise ValueError("DP streams: a pace beside a collective is in (0, 1]")
        over[list(dp.micro_batches)] = True
        count[:], secs[:], pace_f[:], pace_b[:] = dp.count, dp.seconds, dp.pace_f, dp.pace_b
    sfree, slowed = np.zeros(p), np.zeros(p)
    if not _timed(ops, lengths, np.asarray(fwd, dtype=np.float64), np.asarray(bwd, dtype=np.float64), m,
                  float(p2p), free, first, stop, over, count, secs, pace_f, pace_b, sfree, slowed):
        raise AssertionError("pipeline order deadlocked")  # cannot happen with the published orders
    busy = tuple(m * sum(fwd[g] + bwd[g] for g in range(s, len(fwd), p)) + float(slowed[s]) for s in range(p))
    stage_end = tuple(free.tolist())
    first.setflags(write=False)
    stop.setflags(write=False)
    return Pipeline(max(stage_end), stage_end, busy, first, stop, tuple(fwd), tuple(bwd), tuple(sfree.tolist()))


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
                dp: DPStreams | None = None) -> Pipeline:
    """Time (interleaved, with ``chunks`` > 1) 1F1B: ``fwd``, ``bwd`` per virtual stage (``p x chunks`` of them,
    chunk-major: virtual stage ``c p + s``); ``dp``: each stage's DP gradient stream beside it (the pipeline's
    ``stream_end``)."""
    if not fwd or len(bwd) != len(fwd) or m < 1 or len(fwd) % chunks:
        raise ValueError("one forward and one backward time per virtual stage, and at least one micro-batch")
    p = len(fwd) // chunks
    if chunks > 1 and m % p:
        raise ValueError(f"interleaved 1F1B needs the micro-batches ({m}) a multiple of the stages ({p})")
    ops, lengths = _interleaved_arrays(p, chunks, m)
    return _run_arrays(ops, lengths, fwd, bwd, m, p2p, dp)


def peak_in_flight(order: Sequence[Op], weight: Sequence[float]) -> float:
    """The most forwards a stage holds without their backward, each weighted by ``weight[g]`` (its layers)."""
    live = peak = 0.0
    for kind, g, _ in order:
        live += weight[g] if kind == "F" else -weight[g]
        peak = max(peak, live)
    return peak
