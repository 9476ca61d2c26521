"""Run-to-run variability: one schedule simulated many times, each kernel's and transfer's duration drawn anew.

A trial multiplies each kernel's duration (compute and merge ops) by a factor drawn from a lognormal distribution of
mean 1 and coefficient of variation ``kernel_cv``, and each transfer's bytes by one of CV ``link_cv`` (the time it
drains over its route, contended or not, stretched by that factor; its latency is not varied). A lognormal of mean 1
and CV ``c`` is ``exp(mu + sigma Z)`` with ``sigma^2 = ln(1 + c^2)``, ``mu = -sigma^2 / 2``, ``Z`` standard normal
(positive, right-skewed: the shape measured kernel and collective times take). Trial ``t`` draws from
``numpy.random.default_rng((seed, t))``, kernels then transfers in op-id order: the same seed, the same trials,
however many processes share them. A CV of 0 draws nothing: the factor is 1.0 and the trial's floats are the plain
simulation's.

The schedule's columns are built once (:class:`simulator.engine.core._Run`: routes, kernel durations, dependents);
a trial is a fresh state of the compiled loop over copies of the varied columns: nothing is rebuilt per trial. Many
trials of a large schedule are shared among forked processes (a varied ring step desynchronises its flows: each
finish is a reallocation of its component's rates, about 75 times the plain step's on ring decode at P = 256, and
twice its time).
"""

from __future__ import annotations

import math
import multiprocessing
import os

import numpy as np

from simulator.cluster.topology import Cluster
from simulator.engine import eventcore
from simulator.engine.core import CALLBACKS_PER_CALL, _Run
from simulator.schedule.core import Schedule
from simulator.schedule.oplist import KIND_INDEX
from simulator.support.gcpause import gc_paused

__all__ = ["lognormal_factors", "trial_makespans"]


def lognormal_factors(rng: np.random.Generator, n: int, cv: float) -> np.ndarray:
    """``n`` draws of a lognormal of mean 1 and coefficient of variation ``cv`` (ones where ``cv`` is 0)."""
    if cv == 0.0:
        return np.ones(n)
    sigma2 = math.log1p(cv * cv)
    return np.exp(-0.5 * sigma2 + math.sqrt(sigma2) * rng.standard_normal(n))


def trial_makespans(schedule: Schedule, cluster: Cluster, trials: int, kernel_cv: float, link_cv: float,
                    seed: int, jobs: int | None = None) -> np.ndarray:
    """The makespan (s) of each of ``trials`` runs of ``schedule`` on ``cluster`` with varied durations (module
    docstring). ``jobs``: processes that share the trials (forked, each with the columns built here; default: the
    cores this process may use, up to :data:`MAX_JOBS`, where the trials are many ops; 1 in a daemonic process, a
    pool's worker, which may not fork). The trials are the same whatever ``jobs``: trial ``t`` draws from its own
    generator, ``numpy.random.default_rng((seed, t))``."""
    if trials < 1 or kernel_cv < 0 or link_cv < 0:
        raise ValueError(f"trials >= 1 and CVs >= 0, got {trials}, {kernel_cv}, {link_cv}")
    with gc_paused():
        run = _Run(schedule, cluster)
        job = _Job(run, np.flatnonzero(run.kind_of <= KIND_INDEX["merge"]),  # compute and merge ops
                   np.flatnonzero(run.kind_of == KIND_INDEX["send"]), kernel_cv, link_cv, seed)
        jobs = _jobs(jobs, trials, len(run.dur))
        if jobs <= 1:
            return np.array(job.makespans(range(trials)))
        _JOB[:] = [job]
        try:
            with multiprocessing.get_context("fork").Pool(jobs) as pool:
                parts = pool.map(_forked, [range(j, trials, jobs) for j in range(jobs)])
        finally:
            _JOB.clear()
    out = np.empty(trials)
    for j, part in enumerate(parts):
        out[j::jobs] = part
    return out


MAX_JOBS = 8
_PARALLEL_OPS = 2_000_000  # trials x ops above which the trials are shared among processes (a fork: ~10 ms)
_JOB: list[_Job] = []  # the job a forked pool's workers inherit


def _jobs(jobs: int | None, trials: int, ops: int) -> int:
    if multiprocessing.current_process().daemon or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    if jobs is None:
        jobs = min(MAX_JOBS, len(os.sched_getaffinity(0))) if trials * ops >= _PARALLEL_OPS else 1
    return max(1, min(jobs, trials))


def _forked(ts: range) -> list[float]:
    with gc_paused():
        return _JOB[0].makespans(ts)


class _Job:
    """A schedule's columns and the variation to draw: trials run over fresh states of the compiled loop."""

    def __init__(self, run: _Run, kernels: np.ndarray, sends: np.ndarray, kernel_cv: float, link_cv: float,
                 seed: int) -> None:
        self.run, self.kernels, self.sends = run, kernels, sends
        self.kernel_cv, self.link_cv, self.seed = kernel_cv, link_cv, seed

    def makespans(self, ts: range) -> list[float]:
        return [self.makespan(t) for t in ts]

    def makespan(self, t: int) -> float:
        run = self.run
        rng = np.random.default_rng((self.seed, t))
        dur, nbytes = run.dur, run.nbytes
        if self.kernel_cv > 0.0:
            dur = dur.copy()
            dur[self.kernels] *= lognormal_factors(rng, len(self.kernels), self.kernel_cv)
        if self.link_cv > 0.0:
            nbytes = nbytes.copy()
            nbytes[self.sends] *= lognormal_factors(rng, len(self.sends), self.link_cv)
        state = run.state(dur, nbytes, run.pending.copy())
        while not eventcore.run(state, CALLBACKS_PER_CALL):
            pass
        _, ends, *_ = eventcore.results(state)
        del state
        return 0.0 if np.isnan(ends).all() else float(np.nanmax(ends))
