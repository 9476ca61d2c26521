"""How fast the machine runs now against its calibration: a profiled kernel point timed again, the same way.

A prediction can only be as right as the machine is still the one calibrated. On a shared VM it is not for long:
the same call measured 1.3-1.5x its calibrated time tens of minutes later (docs/validation.md). ``treering
validate`` therefore times, right before each algorithm's runs, the profiled grid point nearest to the schedule's
dominant kernel (the rank-0 kernel with the largest share of the predicted compute time), exactly as ``calibrate``
timed it: the same call (:func:`~simulator.distributed.profile_kernels.build_point`), the same clock and stopping
rule (its runs at one time, where calibrate pools visits spread over the profiling), and as many copies
running at once on the host as the profile records (``loaded``: the next ranks of the run run the call back
to back while rank 0 times it). ``drift`` = now / calibrated: 1.0 is the calibrated machine; a point's error
cannot be read as the model's where the machine itself moved by more. Nothing here changes a prediction.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Sequence

import torch
import torch.distributed as dist

from simulator.algorithms import Layout
from simulator.cluster.devices import DeviceSpec, kernel_profile
from simulator.cluster.topology import Cluster
from simulator.distributed.profile_kernels import ProfileOptions, build_point, time_call
from simulator.kernels.profiles import KernelProfile
from simulator.schedule.core import COMPUTE_KINDS, Schedule

__all__ = ["dominant_kernel", "drift_before", "measure_drift", "nearest_grid_point", "profiled_seconds"]


def nearest_grid_point(profile: KernelProfile, dims: Sequence[float]) -> tuple[float, ...]:
    """The profile's grid point nearest to ``dims`` in log space, axis by axis (a pure function); halfway between
    two values (exact in base 2 for a power-of-two grid), the smaller."""
    return tuple(min(values, key=lambda v: (abs(math.log2(v) - math.log2(x)), v))
                 for values, x in zip(profile.grid, profile.own(dims), strict=True))


def profiled_seconds(profile: KernelProfile, point: Sequence[float]) -> float:
    """The calibrated time at a grid point (``seconds`` is row-major over the grid, last axis fastest)."""
    index = 0
    for values, x in zip(profile.grid, point, strict=True):
        index = index * len(values) + values.index(x)
    return profile.seconds[index]


def dominant_kernel(sched: Schedule, spec: DeviceSpec, rank: int = 0
                    ) -> tuple[KernelProfile, tuple[float, ...]] | None:
    """(profile, grid point) of ``rank``'s kernel with the largest predicted share of its compute (count x
    profiled time), or None when none of its kernels is profiled."""
    shapes = Counter((op.fn, op.dtype, op.dims) for op in sched.ops
                     if op.rank == rank and op.kind in COMPUTE_KINDS and op.dims and not op.fused)
    share: dict[tuple[str, str, tuple[float, ...]], float] = {}  # (kernel, dtype, grid point) -> count x time
    for (fn, dtype, dims), count in shapes.items():
        profile = kernel_profile(spec, fn, dtype, dims)
        if profile is None:
            continue
        key = (fn, dtype, nearest_grid_point(profile, dims))
        share[key] = share.get(key, 0.0) + count * profile.predict(dims)[0]
    if not share:
        return None
    fn, dtype, point = max(share, key=share.__getitem__)  # the first of equal shares: op order decides alike
    return spec.kernels[(fn, dtype)], point


def measure_drift(profile: KernelProfile, point: tuple[float, ...], device: torch.device, local_ranks: int,
                  opts: ProfileOptions | None = None) -> float:
    """Collective (every rank calls it): rank 0 times ``profile``'s kernel at grid ``point`` while ranks 1 ..
    ``loaded`` - 1 run the same call back to back on its host (the others wait); returns now / calibrated on rank
    0, NaN on the other ranks, and NaN everywhere (nothing timed) where this run cannot load the host as the
    profile was (fewer than ``loaded`` ranks on rank 0's host, ``local_ranks``, or a GPU profile timed loaded)."""
    opts = ProfileOptions() if opts is None else opts  # calibrate's (its defaults)
    if profile.loaded > 1 and (device.type != "cpu" or local_ranks < profile.loaded):
        return math.nan
    rank = dist.get_rank()
    loaders = range(1, profile.loaded)
    fn = build_point(profile.kernel, profile.dtype, point, device) if rank == 0 or rank in loaders else None
    failed: list[BaseException] = []
    done = threading.Event()

    def load() -> None:
        assert fn is not None
        try:
            while not done.is_set():
                fn()
        except BaseException as err:  # raised on this rank after the stop message (the launcher stops the rest)
            failed.append(err)

    worker = None
    if rank in loaders:  # running the call before rank 0 starts timing, as calibrate's loading processes are
        assert fn is not None
        fn()
        worker = threading.Thread(target=load, daemon=True)  # torch frees the GIL inside the kernel
        worker.start()
    dist.barrier()
    ratio = math.nan
    if rank == 0:
        assert fn is not None
        seconds = time_call(fn, device, opts, opts.budget_for(len(profile.axes))).median
        for r in loaders:  # the loading ranks stop at this
            dist.send(torch.zeros(1), dst=r)
        ratio = seconds / profiled_seconds(profile, point)
    elif worker is not None:
        try:
            dist.recv(torch.zeros(1), src=0)
        finally:
            done.set()
            worker.join()
        if failed:
            raise RuntimeError(f"rank {rank}: the drift probe's loading call failed: {failed[0]!r}") from failed[0]
    dist.barrier()
    return ratio


def drift_before(sched: Schedule, cluster: Cluster, layout: Layout, device: torch.device,
                 enabled: bool = True) -> float:
    """Collective: the drift at the grid point nearest to ``sched``'s dominant rank-0 kernel on ``cluster``'s
    profiles (every rank decides alike from the same schedule, topology and ``layout`` of ranks on hosts); NaN
    where nothing is profiled, when not ``enabled``, and on ranks other than 0."""
    spec = cluster.specs.get(sched.placement_on(cluster.ranks)[0])
    found = dominant_kernel(sched, spec) if enabled and spec is not None else None
    return math.nan if found is None else measure_drift(*found, device, len(layout.groups()[0]))
