"""A pipeline's steps in a few ops: each chunk's run of NCCL steps over a stage as its first, middle and last step.

NCCL moves a pipelined collective one step at a time (a channel buffer's ``1 / NCCL_STEPS``: 512 KiB of payload
with Simple, :func:`simulator.collectives.protocols.step_payload`): a stage (a connection, a rank's reduction)
passes step j on once its upstream stages have passed step j and it has passed step j - 1. A 16 GiB allreduce on
8 channels is 4,096 steps per channel; one op per step and stage would make a schedule's size grow with the
message. Here a pipeline of S steps is cut into at most ``max_chunks`` chunks (:func:`pipeline_steps`,
:func:`chunk_steps`) and a chunk's g steps over one stage become at most three ops (:func:`parts`):

* ``first``: the chunk's first step: after its upstream stages' first step of the chunk and this stage's previous
  chunk (its last step), as one step of the step-by-step pipeline;
* ``middle``: its g - 2 inner steps, right after this stage's first step, with no upstream dependency;
* ``last``: its last step, after this stage's middle steps and its upstream stages' last step; it carries the
  chunk's data (the numeric executors see one transfer and one reduction of the whole chunk).

With LL and LL128 a rank passes lines on as they arrive inside a server (cut-through,
:func:`simulator.collectives.protocols.forward_grain`), while a network connection's proxy sends whole NCCL steps:
such a pipeline's steps are grains (a warp's lines; :func:`grain_steps`), its chunks still NCCL's steps, and a
network connection's first op of a chunk holds ``head`` grains (one NCCL step, :func:`parts`), so what follows it
waits for the whole step, as NCCL's proxy makes it.

Only a connection's very first step pays a transfer's fixed seconds (message overhead, route latency, at least the
protocol's per-hop latency); every later op streams behind it (``floor_s = STREAMED``): NCCL keeps ``NCCL_STEPS`` =
8 steps in flight per connection, so a step's latency hides behind the bytes of the steps before it.

Why the three ops are the steps' pipeline (exactly, where stages run at their own pace and steps carry no fixed
seconds): with step times f_v (a chunk's first step, which may pay a latency) >= d_v (every other step), the
step-by-step pipeline ends at its longest path of (step, stage) cells, which climbs the first step along stages to
some stage i, spends every later step there, and leaves with the last step: F(up to i) + (g - 2) d_i + D(from i
on), once i is the slowest stage after the path's turn (a path that turns at a stage a and spends its steps at a
later b is never longer: f >= d). The three ops have exactly these paths
(``tests/test_nccl_tree.py`` compares the two schedules in the engine). Under contention, the middle ops move
their bytes without waiting for upstream (at most one chunk ahead: the next chunk's first step waits for this
stage's last), an approximation bounded by the chunk size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Part", "chunk_steps", "first_steps", "grain_steps", "parts", "pipeline_steps", "step_counts"]


@dataclass(frozen=True)
class Part:
    """One op's share of a chunk's steps: ``steps`` of them; ``first``: it holds the chunk's first step; ``last``:
    it holds the chunk's last step (and its data)."""

    steps: int
    first: bool
    last: bool

    @property
    def middle(self) -> bool:
        return not (self.first or self.last)


def parts(g: int, head: int = 1) -> tuple[Part, ...]:
    """A chunk of ``g`` steps as ops: one (g = 1), first and last (g = 2), first, middle and last (g >= 3). The
    first holds ``head`` steps (a stage that passes on nothing before it has that many, :func:`grain_steps`), at
    most ``g - 2``: every stage of a chunk has the same ops whatever its head.

    >>> [(p.steps, p.first, p.last) for p in parts(5)], [p.steps for p in parts(5, head=8)]
    ([(1, True, False), (3, False, False), (1, False, True)], [3, 1, 1])
    """
    if g < 1:
        raise ValueError(f"a chunk has at least one step, got {g}")
    if g == 1:
        return (Part(1, True, True),)
    if g == 2:
        return Part(1, True, False), Part(1, False, True)
    h = first_steps(g, head)
    return Part(h, True, False), Part(g - h - 1, False, False), Part(1, False, True)


def first_steps(g: int, head: int) -> int:
    """Steps in the first op of a chunk of ``g`` steps for a stage of ``head`` (:func:`parts`)."""
    return max(1, min(head, g - 2)) if g > 2 else 1


def pipeline_steps(nbytes: float, step: float, max_chunks: int) -> tuple[int, int]:
    """(steps, chunks) of a pipeline of ``nbytes`` payload in steps of ``step`` bytes: its step count
    ``ceil(nbytes / step)`` (at least 1) in at most ``max_chunks`` chunks.

    >>> pipeline_steps(3 * 2**20, 2**19, 4), pipeline_steps(1 << 30, 2**19, 4)
    ((6, 4), (2048, 4))
    """
    total = max(1, math.ceil(nbytes / step))
    return total, max(1, min(total, max_chunks))


def grain_steps(nbytes: float, step: float, grain: float | None, max_chunks: int) -> tuple[int, int, int]:
    """(steps, chunks, head) of a pipeline of NCCL steps of ``step`` payload bytes whose stages pass data on every
    ``grain`` bytes (:func:`.protocols.forward_grain`; ``None``: whole steps): its chunks as
    :func:`pipeline_steps` cuts NCCL's steps, its steps (the pipeline's unit) the grains, ``head`` the grains of
    one NCCL step (what a stage that forwards whole steps holds back: a network connection's proxy).

    >>> grain_steps(1 << 20, 2**19, None, 4), grain_steps(1 << 16, 2**15, 256.0, 8)
    ((2, 2, 1), (256, 2, 128))
    """
    steps, chunks = pipeline_steps(nbytes, step, max_chunks)
    if grain is None or grain >= step:
        return steps, chunks, 1
    return max(chunks, math.ceil(nbytes / grain)), chunks, math.ceil(step / grain)


def step_counts(steps: int, chunks: int) -> list[int]:
    """Each of ``chunks`` chunks' share of ``steps`` steps, as even as they go (``chunk_bounds``' sizes: the first
    ``steps % chunks`` chunks one step more).

    >>> step_counts(6, 4)
    [2, 2, 1, 1]
    """
    q, extra = divmod(steps, chunks)
    return [q + 1] * extra + [q] * (chunks - extra)


def chunk_steps(n: int, steps: int, chunks: int) -> list[tuple[int, int, int]]:
    """``chunks`` chunks of ``n`` elements in ``steps`` steps: (first element, end, steps) of each, the steps as
    :func:`step_counts` cuts them and every step ``n / steps`` elements (to the element: a chunk of steps s0 .. s1
    holds elements n s0 // steps .. n s1 // steps).

    >>> chunk_steps(100, 6, 4)
    [(0, 33, 2), (33, 66, 2), (66, 83, 1), (83, 100, 1)]
    """
    out, s0 = [], 0
    for g in step_counts(steps, chunks):
        out.append((n * s0 // steps, n * (s0 + g) // steps, g))
        s0 += g
    return out
