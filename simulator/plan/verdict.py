"""A plan's verdicts, judged in one place from the targets and the values: whether a configuration *meets* its
targets, and which constraint *binds* a set of configurations. (Whether it fits is ``oom``, judged for every row by
:func:`simulator.schedule.memory.out_of_memory`.)

The constraints are checked in one order, ``memory``, ``ttft``, ``tbt``: a configuration meets when it fits and every
target asked for is met (a value that is NaN, never measured, meets nothing). A set of configurations is bound by
the first constraint that the configuration going furthest down that order misses: none fits -> ``memory``; some
fit but none meets the TTFT -> ``ttft``; some meet the TTFT but none the time between tokens -> ``tbt``.

>>> t = Targets(ttft_s=5.0, tbt_s=0.02)
>>> met(t, oom=False, ttft_s=4.793, tbt_s=0.01897)
True
>>> missed(t, oom=False, ttft_s=5.5, tbt_s=0.03)
('ttft', 'tbt')
>>> binding(t, [Values(oom=True), Values(oom=False, ttft_s=4.0, tbt_s=0.03)])
'tbt'
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["CONSTRAINTS", "Targets", "Values", "binding", "met", "missed"]

CONSTRAINTS = ("memory", "ttft", "tbt")


@dataclass(frozen=True)
class Targets:
    """What a plan is asked, in seconds: a time to first token and a time between tokens (None: not asked). The
    decode plan's target is ``tbt_s`` (its step latency is the time between tokens)."""

    ttft_s: float | None = None
    tbt_s: float | None = None


@dataclass(frozen=True)
class Values:
    """What one configuration achieved: out of memory or not, its TTFT and its time between tokens (seconds)."""

    oom: bool
    ttft_s: float = math.nan
    tbt_s: float = math.nan


def missed(targets: Targets, *, oom: bool, ttft_s: float = math.nan, tbt_s: float = math.nan) -> tuple[str, ...]:
    """The constraints a configuration misses, in :data:`CONSTRAINTS` order (empty: it meets them all)."""
    out = ["memory"] if oom else []
    for name, target, value in (("ttft", targets.ttft_s, ttft_s), ("tbt", targets.tbt_s, tbt_s)):
        if target is not None and not value <= target:  # NaN: not measured, so not met
            out.append(name)
    return tuple(out)


def met(targets: Targets, *, oom: bool, ttft_s: float = math.nan, tbt_s: float = math.nan) -> bool:
    """True when the configuration fits and meets every target asked for."""
    return not missed(targets, oom=oom, ttft_s=ttft_s, tbt_s=tbt_s)


def _passed(targets: Targets, v: Values) -> int:
    """How many constraints, in order, ``v`` passes before its first miss."""
    miss = missed(targets, oom=v.oom, ttft_s=v.ttft_s, tbt_s=v.tbt_s)
    return CONSTRAINTS.index(miss[0]) if miss else len(CONSTRAINTS)


def binding(targets: Targets, values: Iterable[Values]) -> str | None:
    """The constraint that rules out every configuration of ``values`` (module docstring); None when one meets
    them all. An empty set is bound by memory (nothing was there to fit)."""
    furthest = max((_passed(targets, v) for v in values), default=0)
    return CONSTRAINTS[furthest] if furthest < len(CONSTRAINTS) else None
