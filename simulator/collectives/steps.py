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

__all__ = ["Part", "chunk_steps", "parts", "pipeline_steps", "step_counts"]


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


def parts(g: int) -> tuple[Part, ...]:
    """A chunk of ``g`` steps as ops: one (g = 1), first and last (g = 2), first, middle and last (g >= 3).

    >>> [(p.steps, p.first, p.last) for p in parts(5)]
    [(1, True, False), (3, False, False), (1, False, True)]
    """
    if g < 1:
        raise ValueError(f"a chunk has at least one step, got {g}")
    if g == 1:
        return (Part(1, True, True),)
    if g == 2:
        return Part(1, True, False), Part(1, False, True)
    return Part(1, True, False), Part(g - 2, False, False), Part(1, False, True)


def pipeline_steps(nbytes: float, step: float, max_chunks: int) -> tuple[int, int]:
    """(steps, chunks) of a pipeline of ``nbytes`` payload in steps of ``step`` bytes: its step count
    ``ceil(nbytes / step)`` (at least 1) in at most ``max_chunks`` chunks.

    >>> pipeline_steps(3 * 2**20, 2**19, 4), pipeline_steps(1 << 30, 2**19, 4)
    ((6, 4), (2048, 4))
    """
    total = max(1, math.ceil(nbytes / step))
    return total, max(1, min(total, max_chunks))


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
