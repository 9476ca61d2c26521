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

from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Pipeline:
    """A pipelined step: its makespan, each stage's end and busy seconds, and per stage and micro-batch the window
    of its backward (the first of its chunks' backwards starting, the last ending)."""

    makespan: float
    stage_end: tuple[float, ...]
    busy: tuple[float, ...]
    backward_window: tuple[tuple[tuple[float, float], ...], ...]  # [stage][micro-batch] = (start, end)
    fwd: tuple[float, ...] = ()  # what it was timed with: seconds per virtual stage
    bwd: tuple[float, ...] = ()

    @property
    def bubble_frac(self) -> float:
        """Of the step, the share the busiest stage idles (0 for a step of no time)."""
        if self.makespan <= 0:
            return 0.0
        idle = (self.makespan - max(self.busy)) / self.makespan
        return idle if idle > 1e-12 else 0.0  # none, but for the rounding of the sums


def run_pipeline(orders: Sequence[Sequence[Op]], fwd: Sequence[float], bwd: Sequence[float], m: int,
                 p2p: float = 0.0) -> Pipeline:
    """Time ``orders[s]`` (stage ``s``'s ops) with ``fwd[g]``, ``bwd[g]`` seconds of one micro-batch on virtual
    stage ``g`` (stage ``g % p``) and ``p2p`` seconds between consecutive virtual stages on different stages."""
    p, last = len(orders), len(fwd) - 1
    end: dict[Op, float] = {}
    pos, free = [0] * p, [0.0] * p
    window = [[(float("inf"), 0.0)] * m for _ in range(p)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        moved = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, g, i = orders[s][pos[s]]
                dep = ("F", g - 1, i) if kind == "F" else ("F", g, i) if g == last else ("B", g + 1, i)
                if kind == "F" and g == 0:
                    ready = 0.0
                elif dep not in end:
                    break
                else:
                    ready = end[dep] + (p2p if dep[1] % p != s else 0.0)
                start = max(free[s], ready)
                free[s] = end[(kind, g, i)] = start + (fwd[g] if kind == "F" else bwd[g])
                if kind == "B":
                    a, b = window[s][i]
                    window[s][i] = (min(a, start), max(b, free[s]))
                pos[s] += 1
                remaining -= 1
                moved = True
        if not moved:
            raise AssertionError("pipeline order deadlocked")  # cannot happen with the published orders
    busy = tuple(m * sum(fwd[g] + bwd[g] for g in range(s, len(fwd), p)) for s in range(p))
    return Pipeline(max(free), tuple(free), busy, tuple(tuple(w) for w in window), tuple(fwd), tuple(bwd))


def one_f_one_b(fwd: Sequence[float], bwd: Sequence[float], m: int, p2p: float = 0.0, chunks: int = 1) -> Pipeline:
    """Time (interleaved, with ``chunks`` > 1) 1F1B: ``fwd``, ``bwd`` per virtual stage (``p x chunks`` of them,
    chunk-major: virtual stage ``c p + s``)."""
    if not fwd or len(bwd) != len(fwd) or m < 1 or len(fwd) % chunks:
        raise ValueError("one forward and one backward time per virtual stage, and at least one micro-batch")
    p = len(fwd) // chunks
    if chunks > 1 and m % p:
        raise ValueError(f"interleaved 1F1B needs the micro-batches ({m}) a multiple of the stages ({p})")
    return run_pipeline([interleaved_order(s, p, chunks, m) for s in range(p)], fwd, bwd, m, p2p)


def peak_in_flight(order: Sequence[Op], weight: Sequence[float]) -> float:
    """The most forwards a stage holds without their backward, each weighted by ``weight[g]`` (its layers)."""
    live = peak = 0.0
    for kind, g, _ in order:
        live += weight[g] if kind == "F" else -weight[g]
        peak = max(peak, live)
    return peak
