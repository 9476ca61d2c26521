"""Profile the schedules' kernels over a grid of shapes (what ``treering calibrate`` writes as ``kernels:``).

Each kernel runs through the same merge core the schedules run (:mod:`simulator.merge`), on torch tensors of the
device and dtype asked for, timed by :func:`~simulator.distributed.measure.robust_time` at each of several
visits spread over the profiling (:func:`profile_many`), the runs pooled:

* ``attend`` (partial attention of one decode query against a KV shard, merged into a running state) over its
  axes ``kv_bytes`` (the K and V bytes it reads), ``head_dim`` and ``group`` (query heads per KV head);
* ``merge``, ``rescale``, ``finalize``, ``finalize-flat`` over ``elems`` (a state's elements);
* the prefill blocks ``attn-fwd`` and ``attn-bwd`` over ``row_heads``, ``keys`` and ``head_dim`` (fp32 and fp64:
  the dtypes CPU real runs of prefill use).

The grid is small on purpose (on two CPU cores each dtype takes a few minutes); every group up to 8 is profiled
because the kernel's time is not smooth in it (:mod:`simulator.kernels.profiles`), except where it has no tiles:
emulated bf16 on a CPU, profiled on :func:`tileless_attend_grid` (its 240-point grid took 21 of calibrate's 31
minutes on an AVX2-only CPU, the tile-less one 2 of 13), which ``--attend-rows`` extends over rows (batch x KV
heads); workloads between grid points
are interpolated in log space by :class:`~simulator.kernels.profiles.KernelProfile`, and beyond them extrapolated, which
the simulator reports. A profile timed under load (``loaded`` > 1) can also be timed alone along its first axis, the
other axes at a reference shape (:data:`ALONE_REF`), loaded and alone back to back at each value: the ratios
(:func:`with_alone_ratios`) say how much faster the kernel runs while nothing else contends for the host
(:mod:`simulator.kernels.profiles`). A profiled point whose median is not stable (confidence interval above ``max_ci``
after the repetitions allowed) makes the whole profile refuse: :class:`UnstableMeasurement` names it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from simulator.distributed.host_load import HostLoad
from simulator.distributed.measure import VISITS, Timing, robust_time
from simulator.kernels.decode import KV_HEADS
from simulator.kernels.profiles import KernelProfile
from simulator.kernels.table import OPTIONAL_AXES, PROFILE_AXES
from simulator.kernels.table import kernel as kernel_record
from simulator.units import DTYPE_BYTES

__all__ = ["ALONE_PAIRS", "ALONE_REF", "ATTEND_GRID", "ATTEND_ROWS", "ELEMS_GRID", "PREFILL_GRID", "QUICK_ATTEND_GRID",
           "QUICK_ATTEND_ROWS", "QUICK_ELEMS_GRID", "QUICK_PREFILL_GRID", "TORCH_DTYPES", "ProfileJob",
           "ProfileOptions", "UnstableMeasurement", "alone_ref", "build_point", "profile_attend", "profile_kernel",
           "profile_many", "profile_prefill", "profile_small", "tileless_attend_grid", "time_call", "with_alone_ratios"]

TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16,
                                        "fp16": torch.float16}
# kv_bytes 32 KiB .. 256 MiB (x 8, then x 4: a rank's shard of the 512 MiB caches validate --random draws), head_dim
# 32 .. 256 (x 2), group (query heads per KV head) every count from 1 to 8, then 16 and 32: the kernel's matrix
# products run their rows in tiles, the rows left over apart, so its time is not smooth in the group (a tile height
# up to 4 is found from these; kernels.profiles.KernelProfile.tile)
ATTEND_GRID: tuple[tuple[float, ...], ...] = (tuple(float(2**k) for k in (15, 18, 21, 24, 26, 28)),
                                              (32.0, 64.0, 128.0, 256.0),
                                              (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 16.0, 32.0))
ELEMS_GRID: tuple[float, ...] = tuple(float(2**k) for k in (8, 12, 16, 20))
QUICK_ATTEND_GRID: tuple[tuple[float, ...], ...] = ((2.0**15, 2.0**18, 2.0**21), (32.0, 128.0), (1.0, 4.0))
# attend over rows too (``--attend-rows``, the dtypes whose time depends on them: emulated bf16 on an AVX2 CPU took
# 668, 329, 260 and 251 ms for 128 MiB of KV at head_dim 128, group 4 in 4, 16, 64 and 256 rows; fp32 and fp64
# 0.6-1.45x of their 4-row time at 8 and 64 MiB): rows 1 .. 64, every group that is a power of two (no tile in such
# a kernel's time, kernels.profiles), kv_bytes up to 64 MiB (in 4 rows, 256 MiB at group 32 took 18-21 s a call in the
# 240-point grid); the smallest kv_bytes is one token of every row at the largest head_dim (fewer would round up to
# a token and time more bytes)
ATTEND_ROWS: tuple[float, ...] = (1.0, 4.0, 16.0, 64.0)
ATTEND_ROWS_REST: tuple[tuple[float, ...], ...] = ((32.0, 64.0, 128.0, 256.0), (1.0, 2.0, 4.0, 8.0, 16.0, 32.0))
QUICK_ATTEND_ROWS: tuple[float, ...] = (1.0, 4.0)
QUICK_ELEMS_GRID: tuple[float, ...] = (2.0**8, 2.0**14)
# prefill blocks: row_heads 256 .. 4096 (x 4), span 64 .. 4096 keys (x 8), head_dim 32 and 128, density: a causal
# (diagonal) block and a full one
PREFILL_GRID: tuple[tuple[float, ...], ...] = ((2.0**8, 2.0**10, 2.0**12), (2.0**6, 2.0**9, 2.0**12), (32.0, 128.0),
                                               (0.5, 1.0))
QUICK_PREFILL_GRID: tuple[tuple[float, ...], ...] = ((2.0**8, 2.0**10), (2.0**6, 2.0**8), (32.0, 64.0), (0.5, 1.0))
# kernels timed alone along their first axis, at these values of the others (a mid-sized head, a group of a tile)
ALONE_REF: dict[str, tuple[float, ...]] = {"attend": (128.0, 4.0, 4.0), "attn-fwd": (512.0, 128.0, 1.0),
                                           "attn-bwd": (512.0, 128.0, 1.0)}
# loaded-then-alone pairs timed per value, their ratios' median kept: one pair's ratio moved by up to 0.5 between
# calibrations of one machine (two calibrations' attend fp32 at 32 KiB: 1.09 and 1.49; fp64: 0.49 and 1.01)
ALONE_PAIRS = 3
VISIT_SEED = 0  # the seed of the visits' random orders (profile_many)
_RAND_BLOCK = 2**20  # random values drawn per tensor built (longer tensors repeat them)


class UnstableMeasurement(RuntimeError):
    """A profiled point whose median did not settle within the repetitions allowed."""


@dataclass(frozen=True)
class ProfileOptions:
    """How hard to try: the confidence interval of the median aimed at (``rel_ci``) and the worst accepted
    (``max_ci``), time per point (``budget_s`` once at least ``min_reps`` ran; ``cap_s`` at most), spread over
    ``visits`` visits of every point (:func:`profile_many`), each with its share of the runs and the time."""

    rel_ci: float = 0.03
    max_ci: float = 0.5
    budget_s: float = 0.8
    cap_s: float = 2.0
    min_reps: int = 11
    max_reps: int = 41
    visits: int = VISITS

    def budget_for(self, axes: int) -> float:
        """The time budget of one point of a kernel with ``axes`` axes: a third for the one-axis small kernels."""
        return self.budget_s / 3 if axes == 1 else self.budget_s

    def per_visit(self) -> ProfileOptions:
        """The options of one of ``visits`` visits: the runs and the time divided among them (3 runs at least)."""
        v = self.visits
        return dataclasses.replace(self, budget_s=self.budget_s / v, cap_s=self.cap_s / v,
                                   min_reps=max(3, -(-self.min_reps // v)), max_reps=max(3, -(-self.max_reps // v)),
                                   visits=1)


@dataclass(frozen=True)
class ProfileJob:
    """A kernel to profile in one dtype over a grid (one tuple of values per axis)."""

    kernel: str
    dtype: str
    grid: tuple[tuple[float, ...], ...]


def _check(kernel: str, dtype: str, where: str, t: Timing, opts: ProfileOptions) -> Timing:
    """Refuse a point whose median is not known well enough after the repetitions allowed."""
    if t.ci > opts.max_ci:
        raise UnstableMeasurement(
            f"{kernel} {dtype} at {where}: the median of {t.n} runs is known only to +-{t.ci:.0%} (95 % confidence; "
            f"accepted: +-{opts.max_ci:.0%}; the runs spread by {t.spread:.0%} of it); the machine is too busy for a "
            "calibration: rerun when it is quiet")
    return t


def time_call(fn: Callable[[], object], device: torch.device, opts: ProfileOptions, budget_s: float) -> Timing:
    """Time ``fn`` on ``device``: a CUDA kernel by wall time after synchronizing; a CPU kernel (one thread) by its
    thread's CPU time, which other processes' preemptions do not inflate."""
    common = {"rel_ci": opts.rel_ci, "budget_s": budget_s, "max_reps": opts.max_reps, "min_reps": opts.min_reps,
              "cap_s": opts.cap_s}
    if device.type == "cuda":
        return robust_time(fn, torch.cuda.synchronize, **common)  # type: ignore[arg-type]
    return robust_time(fn, clock=time.thread_time, **common)  # type: ignore[arg-type]


def tileless_attend_grid(dtype: str, quick: bool = False, over_rows: bool = True
                         ) -> tuple[tuple[float, ...], ...]:
    """The attend grid of a kernel without tiles in its group (see :data:`ATTEND_ROWS`): over (kv_bytes, head_dim,
    group, rows), or, not ``over_rows``, over the first three at 4 rows (what calibrate times emulated bf16 on); quick:
    a smoke test's (kv_bytes up to 2 MiB, head_dim 32 and 128, group 1 and 4, rows 1 and 4)."""
    rest = ((32.0, 128.0), (1.0, 4.0)) if quick else ATTEND_ROWS_REST
    rows = (QUICK_ATTEND_ROWS if quick else ATTEND_ROWS) if over_rows else (float(KV_HEADS),)
    smallest = 2 * rows[-1] * rest[0][-1] * DTYPE_BYTES[dtype]  # a token of every row at the largest head_dim
    levels = (15, 18, 21) if quick else (15, 18, 21, 24, 26)
    kv = tuple(sorted({max(2.0**k, smallest) for k in levels}))
    return (kv, *rest, rows) if over_rows else (kv, *rest)


def build_point(kernel: str, dtype: str, point: tuple[float, ...], device: torch.device) -> Callable[[], object]:
    """One call of ``kernel`` in ``dtype`` at ``point`` (a grid point on the kernel's axes), ready to be timed: the
    same function builds what rank 0 times and what the processes loading the host's other cores run."""
    tdt = TORCH_DTYPES[dtype]
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        # at most 2^20 normal draws, tiled: a 256 MiB KV shard drawn whole took longer than timing it (the
        # kernels' time does not depend on the values)
        n = math.prod(shape)
        block = torch.randn(min(n, _RAND_BLOCK), generator=gen).to(device=device, dtype=tdt)
        return block.repeat(-(-n // block.numel()))[:n].reshape(shape)

    call = kernel_record(kernel).profile
    if call is None:
        raise ValueError(f"kernel {kernel!r} is not profiled (profiled: {', '.join(PROFILE_AXES)})")
    return call(point, dtype, rand)


def profile_kernel(kernel: str, dtype: str, device: torch.device, grid: Sequence[Sequence[float]],
                   opts: ProfileOptions = ProfileOptions(), load: HostLoad | None = None) -> KernelProfile:
    """``kernel``'s profile in ``dtype`` over ``grid`` (one list of values per axis of ``PROFILE_AXES[kernel]``),
    each point timed while ``load`` runs the same call on the host's other cores (None: alone)."""
    return profile_many([ProfileJob(kernel, dtype, tuple(tuple(float(x) for x in g) for g in grid))], device, opts,
                        load)[0]


def profile_many(jobs: Sequence[ProfileJob], device: torch.device, opts: ProfileOptions = ProfileOptions(),
                 load: HostLoad | None = None, progress: Callable[[int, float], None] | None = None
                 ) -> list[KernelProfile]:
    """The profiles of ``jobs``, every point of every job visited ``opts.visits`` times, each visit over all the
    points in a new random order (fixed seed), its runs pooled with the point's other visits'.

    A shared machine's speed moves between regimes for seconds to minutes (on this project's 2-CPU VM, two
    calibrations minutes apart timed the same points a median 19 % apart and 2x apart at a tenth of them, while
    each point's median was known to a few %: its runs all fell in one regime). Visits spread over the whole
    calibration put each point's runs in several regimes, and no axis of a grid in one. ``progress(visit,
    seconds)`` is told as each visit ends."""
    for job in jobs:
        axes = PROFILE_AXES[job.kernel][:len(job.grid)]  # (a profile may leave out the kernel's optional trailing axes)
        if len(axes) < len(PROFILE_AXES[job.kernel]) - OPTIONAL_AXES.get(job.kernel, 0):
            raise ValueError(f"{job.kernel}: a grid of {len(job.grid)} axes; the kernel's are "
                             f"{PROFILE_AXES[job.kernel]}")
    points = [(j, point) for j, job in enumerate(jobs) for point in itertools.product(*job.grid)]
    runs: list[list[float]] = [[] for _ in points]
    visit = opts.per_visit() if opts.visits > 1 else opts
    order = list(range(len(points)))
    rng = random.Random(VISIT_SEED)
    for v in range(max(1, opts.visits)):
        t0 = time.perf_counter()
        rng.shuffle(order)
        for i in order:
            j, point = points[i]
            runs[i] += _timed(jobs[j].kernel, jobs[j].dtype, point, device, visit, load).samples
        if progress is not None:
            progress(v + 1, time.perf_counter() - t0)
    out = []
    for j, job in enumerate(jobs):
        seconds, spread = [], []
        for i in (i for i, (jj, _) in enumerate(points) if jj == j):
            where = ", ".join(f"{a} {x:g}" for a, x in zip(PROFILE_AXES[job.kernel][:len(job.grid)], points[i][1],
                                                          strict=True))
            timing = _check(job.kernel, job.dtype, where, Timing.of(runs[i]), opts)
            seconds.append(timing.median)
            spread.append(timing.spread)
        out.append(KernelProfile(job.kernel, job.dtype, PROFILE_AXES[job.kernel][:len(job.grid)], job.grid,
                                 tuple(seconds), tuple(spread), load.copies if load is not None else 1))
    return out


def _timed(kernel: str, dtype: str, point: tuple[float, ...], device: torch.device, opts: ProfileOptions,
           load: HostLoad | None, check: bool = False) -> Timing:
    """One point timed while ``load`` runs the same call on the host's other cores (None: alone); ``check``:
    refused where its median is not known well enough (:class:`UnstableMeasurement`)."""
    if load is not None:  # the loading processes build their copy while this one builds its own
        load.request(kernel, dtype, point)
    try:
        fn = build_point(kernel, dtype, point, device)
    finally:
        if load is not None:
            load.wait_running()
    try:
        timing = time_call(fn, device, opts, opts.budget_for(len(point)))
    finally:
        if load is not None:
            load.stop()
        del fn
    if check:
        where = ", ".join(f"{a} {v:g}" for a, v in zip(PROFILE_AXES[kernel][:len(point)], point, strict=True))
        _check(kernel, dtype, where, timing, opts)
    return timing


def alone_ref(profile: KernelProfile) -> tuple[float, ...]:
    """The values of ``profile``'s axes after the first at which it is timed alone (:data:`ALONE_REF`, cut to the
    axes the profile has)."""
    return ALONE_REF[profile.kernel][:len(profile.axes) - 1]


def with_alone_ratios(profile: KernelProfile, device: torch.device, load: HostLoad,
                      opts: ProfileOptions = ProfileOptions()) -> KernelProfile:
    """``profile`` (timed under ``load``, ``profile.loaded`` = ``load.copies``) with its ratios alone: at each value
    of its first axis, the other axes at :data:`ALONE_REF`, the kernel timed loaded then alone, back to back,
    :data:`ALONE_PAIRS` times (the pairs' median ratio)."""
    if load.copies != profile.loaded or load.copies < 2 or profile.kernel not in ALONE_REF:
        raise ValueError(f"{profile.kernel} {profile.dtype}: no ratio alone for a profile loaded {profile.loaded} "
                         f"with {load.copies} copies running")
    ratios = []
    for x in profile.grid[0]:
        point = (x, *alone_ref(profile))
        pairs = []
        for _ in range(ALONE_PAIRS):
            loaded = _timed(profile.kernel, profile.dtype, point, device, opts, load, check=True)
            alone = _timed(profile.kernel, profile.dtype, point, device, opts, None, check=True)
            pairs.append(alone.median / loaded.median)
        ratios.append(statistics.median(pairs))
    return dataclasses.replace(profile, alone_at=profile.grid[0], alone=tuple(ratios))


def profile_attend(dtype: str, device: torch.device, opts: ProfileOptions = ProfileOptions(),
                   grid: Sequence[Sequence[float]] = ATTEND_GRID, load: HostLoad | None = None) -> KernelProfile:
    """The ``attend`` kernel's profile in ``dtype`` over ``grid`` (kv_bytes, head_dim, group, and rows where the
    grid has a fourth axis)."""
    return profile_kernel("attend", dtype, device, grid, opts, load)


def profile_small(kernel: str, dtype: str, device: torch.device, opts: ProfileOptions = ProfileOptions(),
                  grid: Sequence[float] = ELEMS_GRID, load: HostLoad | None = None) -> KernelProfile:
    """A small kernel's profile (``merge``, ``rescale``, ``finalize`` or ``finalize-flat``) over ``elems``."""
    return profile_kernel(kernel, dtype, device, (tuple(grid),), opts, load)


def profile_prefill(dtype: str, device: torch.device, opts: ProfileOptions = ProfileOptions(),
                    grid: Sequence[Sequence[float]] = PREFILL_GRID, load: HostLoad | None = None
                    ) -> list[KernelProfile]:
    """The prefill block kernels' profiles (``attn-fwd``: a block's partial attention merged into the running state;
    ``attn-bwd``: its gradients, accumulated into dQ and dK/dV) over (row_heads, span, head_dim, density)."""
    return [profile_kernel(k, dtype, device, grid, opts, load) for k in ("attn-fwd", "attn-bwd")]
