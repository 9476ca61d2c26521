"""Robust timing: repeat a measurement until its median is known to a few percent (or a cap is reached).

Single timings on a shared machine are noisy (scheduling, frequency changes, other tenants); one fixed number of
repetitions is either wasteful or too few. :func:`robust_time` runs a few untimed warm-up calls (first calls pay
allocation and cache misses), then repeats until the 95 % confidence interval of the median is within ``rel_ci``
of the median, or ``max_reps`` or ``budget_s`` is reached. The interval is the median's asymptotic one with the
spread estimated robustly from the interquartile range (half-width 1.96 x 1.2533 x (IQR / 1.349) / sqrt(n), i.e.
1.82 IQR / sqrt(n)): one slow outlier among a few runs does not widen it, as it would widen an interval between order
statistics, which with ten runs spans nearly all of them. It returns the
median, the quartiles and that interval, so that callers can record the spread and refuse an unstable figure.
Calls shorter than ``sample_s`` are timed in batches of as many as make one sample last about that long (a timer
read and a scheduler tick are not negligible against a few microseconds), and the per-call time is reported.
``clock`` is the time source: wall time by default; a CPU kernel may be timed by its thread's CPU time
(``time.thread_time``), which a preemption by another process does not inflate.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["VISITS", "Timing", "median_ci", "robust_time"]

# visits of every point a calibration profiles, spread over it (profile_kernels.profile_many): two calibrations of a
# 2-CPU VM minutes apart timed the same points a median 19 % apart (p90 88 %) with one visit, 13 % (p90 46 %) with 4
VISITS = 4


@dataclass(frozen=True)
class Timing:
    """A measured duration: ``median`` seconds over ``n`` repetitions, quartiles ``q1``, ``q3``, and ``ci``: the
    half-width of the median's 95 % confidence interval relative to the median."""

    median: float
    q1: float
    q3: float
    ci: float
    n: int
    samples: tuple[float, ...] = field(default=(), repr=False, compare=False)  # each run's seconds, in order

    @classmethod
    def of(cls, samples: Sequence[float]) -> Timing:
        """The timing of these runs (at least one)."""
        if len(samples) < 2:
            return cls(samples[0], samples[0], samples[0], math.inf, 1, tuple(samples))
        q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
        return cls(statistics.median(samples), q1, q3, median_ci(samples), len(samples), tuple(samples))

    @property
    def spread(self) -> float:
        """Interquartile range over the median."""
        return (self.q3 - self.q1) / self.median if self.median > 0 else 0.0


def median_ci(samples: Sequence[float]) -> float:
    """Half-width of the 95 % confidence interval of the median, relative to it: 1.82 IQR / (median sqrt(n))."""
    n = len(samples)
    if n < 2:
        return math.inf
    q1, med, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return 1.82 * (q3 - q1) / (med * math.sqrt(n)) if med > 0 else math.inf


def robust_time(fn: Callable[[], object], sync: Callable[[], None] = lambda: None, *, warmup: int = 2,
                min_reps: int = 5, max_reps: int = 41, rel_ci: float = 0.03, budget_s: float = 2.0,
                sample_s: float = 1e-3, clock: Callable[[], float] = time.perf_counter,
                cap_s: float | None = None, warmup_s: float = 0.05) -> Timing:
    """Time ``fn`` (``sync`` waits for asynchronous work, e.g. ``torch.cuda.synchronize``) as the module says.

    At least ``min_reps`` repetitions unless they would take longer than ``cap_s`` (default: no cap). The warm-up
    stops early once its calls took ``warmup_s``: one call of a long kernel has paid what a first call pays."""
    t0 = clock()
    calls = 0
    while calls < max(1, warmup):  # warm-up calls: ``warmup``, or fewer once they took ``warmup_s``
        fn()
        sync()
        calls += 1
        if clock() - t0 >= warmup_s:
            break
    first = (clock() - t0) / calls
    inner = max(1, min(1000, math.ceil(sample_s / first))) if first > 0 else 1
    times: list[float] = []
    spent = 0.0
    while True:
        t0 = clock()
        for _ in range(inner):
            fn()
        sync()
        dt = clock() - t0
        times.append(dt / inner)
        spent += dt
        enough = len(times) >= min_reps or (cap_s is not None and spent >= cap_s and len(times) >= 3)
        if enough and (median_ci(times) <= rel_ci or len(times) >= max_reps or spent >= budget_s):
            return Timing.of(times)
