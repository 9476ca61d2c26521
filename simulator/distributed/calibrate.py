"""``treering calibrate``: measure the machine (or cluster) the ranks run on; write a topology YAML.

Measured:

* point-to-point: a ping-pong between rank 0 and rank 1 over message sizes from 8 B to 32 MiB; the one-way time
  is fitted as ``overhead + bytes / bandwidth`` (the per-message software cost, fitted on relative error over all
  sizes, and the per-flow bandwidth, the median over messages of 1 MiB and more);
* ring exchanges: every rank sends a message to the next at once (what a ring step does), right after an
  attention kernel, from 256 KiB to 256 MiB, timed from the last rank's arrival to the last return (one rank's own
  time would credit the transport with the transfers that happened to finish first), with the CPU time the ranks'
  processes spent: the slopes from 16 MiB are the nominal aggregate bandwidth and copy cost, and each size's
  figures are written beside them (``bandwidth_by_size``, ``host_copy_bw_by_size``: the transport's cost per
  byte is not one number over the sizes, :mod:`simulator.cluster.size_curve`);
* per-operation overheads: a small ``all_reduce``, and a small send/receive with the ring neighbours, each issued
  as schedules issue them, right after every rank ran an attention kernel (from the last rank's arrival to the
  last return), less what the model already charges for their messages. The all_reduce's latency is heavy-tailed
  on CPU ranks (gloo hands every collective to a worker thread: 30-60 % of small all_reduces take 2-4 ms instead
  of ~0.4 ms, where a send/receive rarely does), and a step's time is a sum of such latencies, which follows their
  mean, not their median: ``collective_overhead`` is the median's share, ``collective_stall`` the mean's excess
  over the median (the slowest 5 % dropped: a preemption, not the backend), see :func:`stall_of`;
* compute, on rank 0 alone (one core): the small kernels of the schedules (merge, rescale, finalize of one state:
  the per-kernel overhead, ``launch_overhead``), the decode attention kernel (partial attention merged into a
  running state, the ``attend`` op) on shards of several sizes, fitted as ``launch + bytes / mem_bw`` (the median of
  the sizes' bandwidths), and a square matmul for peak FLOP/s. How P ranks slow each other down is not folded into
  these figures: the file sets ``host_cores`` (this machine's CPUs), ``host_mem_bw`` (what min(P, CPUs) attend
  kernels running at once move together) and ``host_copy_bw`` (the CPU a loopback transfer costs per byte on the
  sender's and on the receiver's side, from the CPU time all ranks spent in the ring exchange above), and the engine
  shares those among the kernels and transfers that run at once, which also gets right the schedules whose ranks
  compute one after another (``ring-q``).

The topology is a star: each rank's device (``local.rankK``) sends into ``local.tx`` at the per-flow bandwidth,
``local.tx -> local.rx`` carries the aggregate bandwidth, ``local.rx`` delivers to each rank. Fit quality (R^2 and
the largest relative residual) is printed and written in the file's comments.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import yaml

from simulator.cluster.size_curve import SizeCurve
from simulator.cluster.topology import load_topology
from simulator.distributed.common import device_for, init_group
from simulator.distributed.host_load import HostLoad
from simulator.distributed.measure import VISITS
from simulator.distributed.profile_kernels import (
    ALONE_PAIRS,
    ALONE_REF,
    ATTEND_GRID,
    ELEMS_GRID,
    PREFILL_GRID,
    QUICK_ATTEND_GRID,
    QUICK_ELEMS_GRID,
    QUICK_PREFILL_GRID,
    ProfileJob,
    ProfileOptions,
    UnstableMeasurement,
    alone_ref,
    profile_many,
    tileless_attend_grid,
    with_alone_ratios,
)
from simulator.kernels.profiles import KernelProfile, profile_to_yaml
from simulator.merge import PartialState, finalize, merge, partial_attention, rescale
from simulator.support.files import write_text_atomic
from simulator.workloads.shape import DecodeShape

__all__ = ["MAX_SPREAD", "PoorFit", "check_spread", "fit_linear", "run_rank", "stall_of"]

PINGPONG_SIZES = [8 * 4**k for k in range(12)]  # 8 B .. 32 MiB
SHARDS = [256, 1024, 4096, 16384, 65536]
LARGE_MESSAGE = 2**20  # ping-pong sizes from here on set the per-flow bandwidth


class PoorFit(RuntimeError):
    """A fit too poor to write: the message says which and why."""


MAX_SPREAD = 0.10  # a calibration whose kernel points' runs spread more than this (median) is not written


def check_spread(profiles: list[KernelProfile], force: bool) -> None:
    """Refuse (:class:`PoorFit`) kernel profiles whose points' runs spread more than :data:`MAX_SPREAD` (the median
    over every point of interquartile range / median): a calibration that noisy is no better than its noise."""
    spreads = [s for p in profiles for s in p.spread]
    if not spreads or force:
        return
    median = statistics.median(spreads)
    if median > MAX_SPREAD:
        raise PoorFit(f"the kernel profiles' runs spread {median:.1%} (median interquartile range / median over "
                      f"{len(spreads)} points), over the {MAX_SPREAD:.0%} a calibration may carry: the machine was "
                      "too busy; nothing written, rerun when it is quiet (or --force writes it anyway)")


def fit_linear(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """``y = a + b x`` by least squares on relative errors (weights 1/y), so that small messages and small
    kernels, which span orders of magnitude less time, count as much as large ones.

    Returns (a, b, R^2, largest |relative residual|); a is clamped at 0 (no negative overhead).
    """
    b, a = np.polyfit(x, y, 1, w=1.0 / y)
    if a < 0:  # the best line through the origin instead
        a, b = 0.0, float(np.sum(x / y) / np.sum(x * x / (y * y)))
    return (float(a), float(b), *fit_quality(a + b * x, y))


def fit_quality(pred: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(R^2, largest |relative residual|) of predictions ``pred`` of measurements ``y``."""
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum()) or 1.0
    return 1 - ss_res / ss_tot, float(np.max(np.abs(pred - y) / y))


def _median_time(fn: Callable[[], object], reps: int, device: torch.device, only: int | None = None,
                 first: int | None = None) -> float:
    """Median over ``reps`` of ``fn``'s time: on rank ``only`` alone, or on ranks below ``first`` at once, or on
    every rank; the others wait (and get 0)."""
    times = []
    for _ in range(reps):
        dist.barrier()
        rank = dist.get_rank()
        if (only is not None and rank != only) or (first is not None and rank >= first):
            continue
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) if times else 0.0


def _pingpong(reps: int, device: torch.device) -> list[tuple[int, float]]:
    rank = dist.get_rank()
    out = []
    for size in PINGPONG_SIZES:
        buf = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)

        def once(buf: torch.Tensor = buf) -> None:
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)

        once()
        out.append((size, _median_time(once, reps, device) / 2))
    return out


# the exchange's message sizes (bytes per rank): a loopback transport's cost per byte changes with the size (cache
# residency, socket buffers; 32-64 MiB ran at 1.5-1.9 GB/s in every round on a 2-CPU machine where 2 and 256 MiB
# ran at 2.0-2.2), so it is measured at each and the engine reads the size's figure (simulator.cluster.size_curve)
EXCHANGE_SIZES = tuple(2**k for k in (18, 20, 22, 24, 26, 28))  # 256 KiB .. 256 MiB
SLOPE_FROM = 16 * 2**20  # the nominal aggregate bandwidth and copy cost: the slopes over the sizes from here on


def _exchanges(args: argparse.Namespace, device: torch.device, reps: int) -> list[tuple[int, float, float]]:
    """(bytes, wall, CPU) of a ring exchange (every rank sends to the next, receives from the previous) at each of
    ``EXCHANGE_SIZES``, issued as schedules issue it (:func:`_after_compute`): the medians of the time from the last
    rank's arrival to the last return and of the CPU time all ranks' processes (their transport threads and the
    kernel's socket work included) spent on it, summed."""
    out = []
    for n in EXCHANGE_SIZES:
        # a small exchange's latency is heavy-tailed (one of 15 medians at 1 MiB was 4.1 ms where 60 calls gave
        # 1.7-2.2): four times the repetitions up to 4 MiB, where they are cheap, twice at 16 MiB
        walls, cpus = _after_compute(args, device, reps * (4 if n <= 4 * 2**20 else 2 if n <= 16 * 2**20 else 1),
                                     p2p=True, nbytes=n)
        out.append((n, statistics.median(walls), statistics.median(cpus)))
    return out


def _slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of y over x."""
    return float(np.polyfit(np.asarray(x, dtype=float), np.asarray(y, dtype=float), 1)[0])


def _attend_times(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> list[tuple[float, float]]:
    """(bytes touched, seconds) of the attend op over several shard sizes, every rank at once."""
    out = []
    for t in SHARDS:
        shape = DecodeShape(1, args.heads, args.head_dim, args.heads, t, "fp32" if dtype == torch.float32 else "fp64")
        q = torch.randn(1, args.heads, 1, args.head_dim, dtype=dtype, device=device)
        k = torch.randn(1, args.heads, t, args.head_dim, dtype=dtype, device=device)
        v = torch.randn_like(k)
        acc = partial_attention(q, k[:, :, :1], v[:, :, :1], 0.1)

        def once(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, acc: PartialState = acc) -> None:
            merge(acc, partial_attention(q, k, v, 0.1))

        once()
        _, nbytes = shape.attend_cost(t)
        out.append((nbytes, _median_time(once, max(3, args.reps // 3), device, only=0)))
    return out


def _shared_memory_bandwidth(args: argparse.Namespace, device: torch.device, ranks: int) -> float:
    """Bytes/s that ``ranks`` attend kernels (the largest shard) move together when they run at once."""
    t = SHARDS[-1]
    shape = DecodeShape(1, args.heads, args.head_dim, args.heads, t, "fp32")
    q = torch.randn(1, args.heads, 1, args.head_dim, device=device)
    k = torch.randn(1, args.heads, t, args.head_dim, device=device)
    acc = partial_attention(q, k[:, :, :1], k[:, :, :1], 0.1)
    elapsed = torch.tensor([_median_time(lambda: merge(acc, partial_attention(q, k, k, 0.1)),
                                         max(3, args.reps // 3), device, first=ranks)], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return ranks * shape.attend_cost(t)[1] / float(elapsed.item())


def stall_of(latencies: Sequence[float]) -> tuple[float, float]:
    """(median, stall) of an operation's latencies: the stall is how much their mean exceeds their median, the
    slowest 5 % dropped first (one preemption of a rank is not the operation's cost); never negative."""
    if not latencies:
        raise ValueError("no latencies")
    kept = sorted(latencies)[:max(1, math.ceil(0.95 * len(latencies)))]
    median = statistics.median(latencies)
    return median, max(0.0, statistics.fmean(kept) - median)


def _after_compute(args: argparse.Namespace, device: torch.device, reps: int, p2p: bool,
                   nbytes: int = 0) -> tuple[list[float], list[float]]:
    """Latency of a small all_reduce (or, with ``p2p``, a send to the next rank and a receive from the previous;
    of ``nbytes``, else as small) as schedules issue it: right after every rank ran an attention kernel. Returns
    every repetition's latency, and the CPU time all ranks' processes spent in it, summed.

    Measured from the last rank's arrival to the last rank's return (a shared monotonic clock on one machine),
    so the time spent waiting for slower ranks is not counted; in a tight loop of operations alone the
    transport's threads stay awake and the figure is several times smaller than in a decode step.
    """
    t = 4096
    q = torch.randn(1, args.heads, 1, args.head_dim, device=device)
    k = torch.randn(1, args.heads, t, args.head_dim, device=device)
    acc = partial_attention(q, k[:, :, :1], k[:, :, :1], 0.1)
    x = torch.zeros(max(args.heads, nbytes // 4), device=device)
    y = torch.zeros_like(x)
    stamps = torch.zeros(3, dtype=torch.float64)
    rank, world = dist.get_rank(), dist.get_world_size()

    def exchange() -> None:
        for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, (rank + 1) % world),
                                           dist.P2POp(dist.irecv, y, (rank - 1) % world)]):
            req.wait()

    if p2p:  # one untimed exchange: the first of a new size is cold (buffers not yet touched)
        exchange()
    latencies, cpus = [], []
    for _ in range(reps):
        dist.barrier()
        merge(acc, partial_attention(q, k, k, 0.1))
        c0 = time.process_time()
        stamps[0] = time.monotonic()
        if p2p:
            exchange()
        else:
            dist.all_reduce(x)
        stamps[1] = time.monotonic()
        stamps[2] = time.process_time() - c0
        every = [torch.zeros(3, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(every, stamps)
        latencies.append(max(float(s[1]) for s in every) - max(float(s[0]) for s in every))
        cpus.append(sum(float(s[2]) for s in every))
    return latencies, cpus


def _copy_bandwidth(device: torch.device, reps: int) -> float:
    """Bytes/s one core copies (rank 0 alone): printed beside the loopback transfer's measured CPU cost per byte,
    and that cost's stand-in where the exchange's CPU time could not be read."""
    src = torch.ones(16 * 2**20, device=device)  # 64 MiB
    dst = torch.empty_like(src)
    dst.copy_(src)
    return src.numel() * src.element_size() / max(_median_time(lambda: dst.copy_(src), reps, device, only=0), 1e-12)


def _small_kernel_time(args: argparse.Namespace, device: torch.device, reps: int) -> float:
    """Median time of the schedules' small kernels (merge, rescale, finalize of one state), on rank 0 alone."""
    q = torch.randn(1, args.heads, 1, args.head_dim, device=device)
    k = torch.randn(1, args.heads, 4, args.head_dim, device=device)
    a = partial_attention(q, k, k, 0.1)
    b = partial_attention(q, k + 1, k, 0.1)
    kernels = [lambda: merge(a, b), lambda: rescale(a, b.m), lambda: finalize(a)]
    return statistics.median(_median_time(fn, reps, device, only=0) for fn in kernels)


def _matmul_flops(device: torch.device, dtype: torch.dtype, reps: int) -> float:
    n = 512
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    torch.matmul(a, b)
    return 2 * n**3 / max(_median_time(lambda: torch.matmul(a, b), reps, device, only=0), 1e-12)


def _profiles(args: argparse.Namespace, device: torch.device) -> list[KernelProfile]:
    """The kernels' profiles over shapes (:mod:`simulator.distributed.profile_kernels`), timed on rank 0. On a CPU,
    with as many copies of each kernel running at once as the calibrated ranks will run on this host's cores
    (min(ranks, CPUs), :class:`~simulator.distributed.host_load.HostLoad`): the lockstep schedules run them so;
    then (taken ``--kernels-from`` an earlier calibration too) how much faster the big kernels run alone
    (:func:`~simulator.distributed.profile_kernels.with_alone_ratios`): ring-q's hops and a rank the others wait on
    run so."""
    copies = 1 if device.type == "cuda" else min(int(os.environ.get("WORLD_SIZE", "1")), os.cpu_count() or 1)
    opts = ProfileOptions(max_ci=args.max_ci, visits=getattr(args, "visits", VISITS))
    source = load_topology(args.kernels_from, force=bool(getattr(args, "force", False))) if args.kernels_from \
        else None
    reused = [] if source is None else list(source.specs[source.ranks[0]].kernels.values())
    if source is not None and not _alone_to_time(reused, copies):
        return reused  # nothing to time: no process loads the host
    with HostLoad(copies) as load:
        out = reused if source is not None else _measured_profiles(args, device, opts, load)
        timed = _alone_to_time(out, copies)
        if timed:
            with _phase(f"kernel times alone ({', '.join(f'{p.kernel} {p.dtype}' for p in timed)})"):
                alone = {id(p): _with_alone(p, device, load, opts) for p in timed}
            out = [alone.get(id(p), p) for p in out]
    return out


def attend_grid_for(dtype: str, device_type: str, quick: bool, over_rows: bool) -> tuple[tuple[float, ...], ...]:
    """The grid ``attend`` is profiled on in ``dtype``: over rows where asked (``--attend-rows``); on CPU ranks, bf16
    (emulated there: no tile in its group, and slow) on the tile-less grid at 4 rows; else every group to 8."""
    if over_rows or (device_type == "cpu" and dtype == "bf16"):
        return tileless_attend_grid(dtype, quick, over_rows)
    return QUICK_ATTEND_GRID if quick else ATTEND_GRID


def _alone_to_time(profiles: list[KernelProfile], copies: int) -> list[KernelProfile]:
    """The profiles whose kernels are timed alone now: the big ones, timed loaded as this host can load them."""
    return [p for p in profiles if p.kernel in ALONE_REF and p.loaded == copies > 1]


def _with_alone(profile: KernelProfile, device: torch.device, load: HostLoad, opts: ProfileOptions
                ) -> KernelProfile:
    """The profile with its ratios alone measured now, or, where a ratio's timing was not stable, the profile
    without ratios (said on stdout: the rest of the calibration stands)."""
    try:
        return with_alone_ratios(profile, device, load, opts)
    except UnstableMeasurement as err:
        print(f"calibrate: {profile.kernel} {profile.dtype}: no ratio alone written ({err})", flush=True)
        return dataclasses.replace(profile, alone_at=(), alone=())


def _measured_profiles(args: argparse.Namespace, device: torch.device, opts: ProfileOptions, load: HostLoad
                       ) -> list[KernelProfile]:
    """Every profile of the dtypes asked for, their points visited together (:func:`profile_many`): each visit
    said on stdout with its time."""
    quick = args.kernel_grid == "quick"
    elems_grid, prefill_grid = (QUICK_ELEMS_GRID, QUICK_PREFILL_GRID) if quick else (ELEMS_GRID, PREFILL_GRID)
    over_rows = set(filter(None, (args.attend_rows or "").split(",")))
    jobs = []
    for dtype in filter(None, args.kernel_dtypes.split(",")):
        jobs.append(ProfileJob("attend", dtype, attend_grid_for(dtype, device.type, quick, dtype in over_rows)))
        jobs += [ProfileJob(k, dtype, (elems_grid,)) for k in ("merge", "rescale", "finalize", "finalize-flat")]
        if dtype in ("fp32", "fp64"):
            jobs += [ProfileJob(k, dtype, prefill_grid) for k in ("attn-fwd", "attn-bwd")]
    if not jobs:
        return []
    points = sum(math.prod(len(g) for g in job.grid) for job in jobs)
    what = ", ".join(dict.fromkeys(f"{j.kernel if j.kernel in ALONE_REF else 'small kernels'} {j.dtype}"
                                   + (" (over rows)" if j.kernel == "attend" and j.dtype in over_rows else "")
                                   for j in jobs))
    visits = max(1, opts.visits)

    def said(visit: int, seconds: float) -> None:
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"calibrate: kernel profiles ({what}; {points} points), visit {visit} of {visits}: {seconds:.1f} s",
                  flush=True)

    return profile_many(jobs, device, opts, load, said)


@contextlib.contextmanager
def _phase(what: str) -> Iterator[None]:
    """Say how long one step of the calibration took (rank 0 only: a calibration takes minutes)."""
    if int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    t0 = time.monotonic()
    yield
    print(f"calibrate: {what}: {time.monotonic() - t0:.1f} s", flush=True)


PROFILED_MARKER = "TREERING_PROFILED_MARKER"  # set by the local launcher: a file rank 0 creates when it is done


def _profiles_quietly(args: argparse.Namespace) -> list[KernelProfile]:
    """Rank 0 profiles the kernels before the process group forms; started by ``treering calibrate``, the other
    ranks sleep until it is done (they poll for a marker file every 0.1 s). Waiting in a barrier, or connecting to
    the rendezvous, they took CPU from the kernels being timed (the runs of one point spread by up to 126 % of
    their median, against under 10 % alone). Under torchrun (no marker) they go on to the rendezvous."""
    marker = os.environ.get(PROFILED_MARKER)
    if int(os.environ.get("RANK", "0")) != 0:  # the launcher stops them if rank 0 fails or takes too long
        while marker and not Path(marker).exists():
            time.sleep(0.1)
        return []
    local = int(os.environ.get("LOCAL_RANK", "0"))
    profiles = _profiles(args, torch.device("cuda", local) if args.backend == "nccl" else torch.device("cpu"))
    if marker:
        Path(marker).touch()
    return profiles


def run_rank(args: argparse.Namespace) -> None:
    """One rank of ``treering calibrate`` (rank 0 writes the topology)."""
    profiles = _profiles_quietly(args) if args.kernel_dtypes else []
    init_group(args.backend, args.timeout)
    # no try/finally: on an error the rank exits at once (destroying the group could wait on failed peers)
    device = device_for(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise RuntimeError("calibrate needs at least 2 ranks (--procs 2)")
    with _phase("ping-pong and ring exchanges"):
        pp = _pingpong(args.reps, device)
        # the small exchange (the per-transfer overhead), then the sizes, one after the other: the engine charges
        # an exchange the first's time and the sizes' bytes at their bandwidth, so they are measured alike. Its
        # latency is heavy-tailed (10-30 % of calls take 3-5 ms instead of 0.5-0.7; measured in three rounds of 60):
        # four times the repetitions, so that the median does not flip with a few slow calls
        p2p_s = statistics.median(_after_compute(args, device, 4 * args.reps, p2p=True)[0])
        exchanges = _exchanges(args, device, args.reps)
    with _phase("per-operation overheads"):
        # the all_reduce's mean (its stall) needs many repetitions: a third of its calls are 2-4 ms slower, a
        # count whose binomial noise moves the mean by ~0.3 ms at 30 calls, ~0.1 ms at 180 (about 1.5 s here)
        allreduce, _ = _after_compute(args, device, 12 * args.reps, p2p=False)
    with _phase("compute roofline (small kernels, attend, matmul, shared memory bandwidth, memcpy)"):
        small = _small_kernel_time(args, device, args.reps)
        attend32 = _attend_times(args, device, torch.float32)
        attend64 = _attend_times(args, device, torch.float64)
        flops = [_matmul_flops(device, torch.float32, args.reps), _matmul_flops(device, torch.float64, args.reps)]
        concurrent = min(world, os.cpu_count() or 1)
        shared_bw = _shared_memory_bandwidth(args, device, concurrent)
        memcpy_bw = _copy_bandwidth(device, args.reps)
    if rank == 0:
        text = _topology(args, world, pp, exchanges, (*stall_of(allreduce), p2p_s), small, attend32, attend64,
                         flops, (concurrent, shared_bw, memcpy_bw), profiles)
        write_text_atomic(Path(args.out), text)
        print(f"wrote {args.out}")
    dist.destroy_process_group()


def _profile_lines(profiles: list[KernelProfile], source: str | None, visits: int) -> list[str]:
    if not profiles:
        return []
    timed = [p for p in profiles if p.alone]
    alone = [] if not timed else [
        "# Kernel times alone (alone:, measured by this calibration at each value of a profile's first axis"
        + (" where it could load the host as the profile was timed; the others' kept from the source" if source
           else "") + ", the other axes at a reference shape: the kernel timed loaded, then alone, "
        f"{ALONE_PAIRS} times; the median of time alone / time loaded): "
        + "; ".join(f"{p.kernel} {p.dtype} at " + ", ".join(
            f"{a} {v:g}" for a, v in zip(p.axes[1:], alone_ref(p), strict=True)) + ": "
                    + ", ".join(f"{r:.2f}" for r in p.alone) for p in timed) + "."]
    if source:
        return [f"# Kernel profiles (kernels:): taken from {source} (an earlier calibration of this machine; its "
                "comments say how they were measured).", *alone]
    worst = max(profiles, key=lambda p: max(p.spread, default=0.0))
    loaded = max(p.loaded for p in profiles)
    how = "rank 0 alone" if loaded == 1 else (f"timed on rank 0 while {loaded - 1} more process(es) ran the same "
                                               "call on this host's other cores, as the ranks of a lockstep schedule "
                                               f"do (loaded: {loaded})")
    o = ProfileOptions(visits=visits)
    v = o.per_visit() if visits > 1 else o
    return [f"# Kernel profiles (kernels:, {how}; every point visited {o.visits} times, each visit over all the "
            "points in a new random order, its runs repeated until the 95 % confidence interval of their median was "
            f"within {v.rel_ci:.0%} or {v.budget_s:g} s passed, at least {v.min_reps} runs unless that took "
            f"{v.cap_s:g} s; a point's runs pooled over its visits; spread = interquartile range / median): "
            + "; ".join(f"{p.kernel} {p.dtype} over {p.ranges()} ({len(p.seconds)} points, median spread "
                        f"{statistics.median(p.spread):.1%})" for p in profiles)
            + f". Largest spread: {max(worst.spread):.1%} ({worst.kernel} {worst.dtype}). Shapes between grid points "
            "are interpolated in log space; beyond them, extrapolated and reported.", *alone]


def _kernels_yaml(profiles: list[KernelProfile]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for p in profiles:
        out.setdefault(p.kernel, {})[p.dtype] = profile_to_yaml(p)
    return out


def _bandwidth_after(launch: float, points: list[tuple[float, float]]) -> tuple[float, float]:
    """``bytes / (t - launch)``: the median of the points' bandwidths (one point that cache or noise made fast or
    slow does not move it), and the largest relative residual of ``launch + bytes / bandwidth``."""
    x = np.array([b for b, _ in points])
    y = np.array([t for _, t in points])
    bw = float(np.median(x / np.maximum(y - launch, 1e-12)))
    return bw, float(np.max(np.abs(launch + x / bw - y) / y))


def _size_text(n: float) -> str:
    return f"{int(n) >> 20} MiB" if n >= 2**20 else f"{int(n) >> 10} KiB"


def _curve_text(curve: SizeCurve) -> str:
    return ", ".join(f"{_size_text(n)} {b / 1e9:.3f}" for n, b in zip(curve.sizes, curve.bandwidth, strict=True)) + \
        " GB/s"


def _by_size(exchanges: list[tuple[int, float, float]], world: int, delay: float, flow_bw: float,
             copy_bw: float) -> tuple[SizeCurve, SizeCurve]:
    """The exchanges' figures at each size, as the engine reads them (:mod:`simulator.cluster.size_curve`): the
    aggregate bandwidth that makes the engine's exchange take the measured time (``world`` messages of n bytes
    after the fixed ``delay`` it charges a standalone transfer), at most ``world`` x ``flow_bw`` (above that the
    per-flow links bind anyway; a time within the delay is that end). It may be below ``flow_bw``: messages sent at
    once slow each other on loopback more than a shared pipe would (2 ranks on 2 CPUs: 1.50 GB/s together at 16
    MiB, where the ping-pong moved 1.75 GB/s one way), and a lone message of that size then gets it too (the
    schedules' lone messages are states of a few KiB to MiB, where the fixed delay dominates; their exchanges are
    what the curve is for). And the bytes a core copies: every byte is copied by
    its sender and its receiver, 2 x ``world`` n bytes, in the CPU time spent while the bytes moved (the share
    ``(time - delay) / time`` of the measured CPU time: the engine charges the delay no CPU); so where the ranks'
    processes used fewer CPUs than the host has, the cores never bind the exchange alone below its measured time.
    Where there are more ranks than CPUs they summed more than the CPUs' time over it (8 ranks on 2 CPUs: 4.7 CPUs'
    worth over a 1 MiB exchange: each rank's clock runs from its own arrival, the early ones posting, copying and
    waiting for the last), all of it CPU the exchange takes from kernels on those cores, and the engine then
    predicts the exchange alone slower than measured (there: 4 MiB in 12.4 ms, measured 7.1). ``copy_bw`` where no
    CPU time was read or the time is within the delay."""
    aggregate, copies = [], []
    for n, wall, cpu in exchanges:
        moved = wall - delay
        bw = world * n / moved if moved > 0 else world * flow_bw
        aggregate.append(min(bw, world * flow_bw))
        copies.append(2 * world * n / (cpu * moved / wall) if cpu > 0 and moved > 0 else copy_bw)
    sizes = tuple(float(n) for n, _, _ in exchanges)
    return SizeCurve(sizes, tuple(aggregate)), SizeCurve(sizes, tuple(copies))


def _topology(args: argparse.Namespace, world: int, pp: list[tuple[int, float]],
              exchanges: list[tuple[int, float, float]],
              after_compute: tuple[float, float, float], small: float, attend32: list[tuple[float, float]],
              attend64: list[tuple[float, float]], flops: list[float], shared: tuple[int, float, float],
              profiles: list[KernelProfile]) -> str:
    sizes = np.array([s for s, _ in pp], dtype=float)
    one_way = np.array([t for _, t in pp])
    overhead, _, _, _ = fit_linear(sizes, one_way)
    overhead = max(overhead, 0.0)
    # the bandwidth is what large messages see: a line fitted on relative error over all sizes follows the small
    # ones, and a cache-resident 2 MiB message must not set the speed of a 32 MiB one either (the median)
    large = sizes >= LARGE_MESSAGE
    flow_bw = float(np.median(sizes[large] / np.maximum(one_way[large] - overhead, 1e-12)))
    r2_p2p, res_p2p = fit_quality(overhead + sizes / flow_bw, one_way)
    if r2_p2p < args.min_r2:
        raise PoorFit(f"the ping-pong fit one-way = {overhead * 1e6:.1f} us + bytes / {flow_bw / 1e9:.2f} GB/s "
                      f"explains too little of the measurements (R^2 = {r2_p2p:.3f}, accepted from {args.min_r2}, "
                      f"--min-r2; largest "
                      f"relative residual {res_p2p:.0%}): the machine was too busy; nothing written, rerun when it is "
                      "quiet")
    check_spread(profiles if not args.kernels_from else [], bool(getattr(args, "force", False)))
    cores = os.cpu_count() or 1
    large_x = [(world * n, w, c) for n, w, c in exchanges if n >= SLOPE_FROM]  # bytes all ranks send at once
    wall_slope = _slope([x for x, _, _ in large_x], [w for _, w, _ in large_x])
    cpu_slope = _slope([x for x, _, _ in large_x], [c for _, _, c in large_x])
    aggregate = 1 / wall_slope if wall_slope > 0 else flow_bw
    aggregate = max(aggregate, flow_bw)  # a lone flow is never faster than all of them together
    # the model charges a ring allreduce 2(P-1) steps of the message overhead; the rest is per collective
    allreduce_s, stall, p2p_s = after_compute  # the all_reduce's median and its mean's excess, the send's median
    collective_overhead = max(0.0, allreduce_s - 2 * (world - 1) * overhead)
    comm_overhead = max(0.0, p2p_s - overhead)
    launch = small
    mem_bw, res_mem = _bandwidth_after(launch, attend32)
    mem_bw64, res_mem64 = _bandwidth_after(launch, attend64)
    concurrent, shared_bw, memcpy_bw = shared
    # the CPU a loopback transfer costs, per byte and side, from the CPU time the ring exchange took (sender's and
    # receiver's processes, their transport threads and the kernel's socket work: several lone memcpys' worth)
    copy_bw = 2 / cpu_slope if cpu_slope > 0 else memcpy_bw  # every byte sent is copied by its sender and receiver
    aggregate_by_size, copy_by_size = _by_size(exchanges, world, overhead + comm_overhead, flow_bw, copy_bw)
    host_mem_bw = min(shared_bw, cores * mem_bw)  # what several kernels at once get, at most a core each
    mem_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 16e9
    lines = [
        f"# Measured by `treering calibrate --procs {world} --backend {args.backend}` on {platform.node()} "
        f"({os.cpu_count()} CPUs), {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC.",
        f"# Point-to-point (ping-pong, {len(pp)} sizes 8 B..32 MiB): one-way = {overhead * 1e6:.2f} us + "
        f"bytes / {flow_bw / 1e9:.3f} GB/s (the overhead fitted on relative error over all sizes, the bandwidth the "
        f"median over messages of {LARGE_MESSAGE >> 20} MiB and more); R^2 = {r2_p2p:.4f}, largest relative residual "
        f"{res_p2p:.1%}.",
        f"# Ring exchanges ({world} ranks each sending N bytes to the next at once right after an attention kernel, "
        "as schedules issue them; last arrival to last return, and the CPU time of all ranks' processes): "
        + ", ".join(f"{_size_text(n)} {w * 1e3:.2f} ms using {c / w:.2f} of {os.cpu_count()} CPUs"
                    for n, w, c in exchanges) + ". "
        f"Aggregate bandwidth (the slope of the time over the bytes from {_size_text(SLOPE_FROM)}): "
        f"{aggregate / 1e9:.3f} GB/s; at each size (bandwidth_by_size: P N / (time - message_overhead - "
        f"comm_overhead), at most P x per-flow): "
        + _curve_text(aggregate_by_size) + ".",
        f"# A {args.heads}-element all_reduce right after every rank's attention kernel (last arrival to last "
        f"return): median {allreduce_s * 1e6:.1f} us -> collective_overhead {collective_overhead * 1e6:.1f} us per "
        f"collective beyond 2(P-1) message overheads; its mean (the slowest 5 % dropped) is "
        f"{stall * 1e6:.1f} us more -> collective_stall (the slow calls' share). A small send/receive with the ring "
        f"neighbours, issued the same way: {p2p_s * 1e6:.1f} us -> comm_overhead {comm_overhead * 1e6:.1f} us per "
        "standalone transfer beyond the ping-pong's message overhead.",
        f"# Small kernels (merge, rescale, finalize of one state; rank 0 alone): median {small * 1e6:.1f} us "
        "-> launch_overhead.",
        f"# Attend kernel ({args.heads} heads x {args.head_dim}, shards {SHARDS[0]}..{SHARDS[-1]} tokens, rank 0 "
        f"alone): launch + bytes / {mem_bw / 1e9:.3f} GB/s in fp32 (largest relative residual {res_mem:.1%}), "
        f"bytes / {mem_bw64 / 1e9:.3f} GB/s in fp64 ({res_mem64:.1%}); the model takes the fp32 figure.",
        f"# Matmul 512^3 (rank 0 alone): fp32 {flops[0] / 1e9:.2f} GFLOP/s, fp64 {flops[1] / 1e9:.2f} GFLOP/s."
        " bf16/fp16 get the fp32 figures on the roofline (kernels with a bf16 profile below are timed from it).",
        f"# host_cores: the {world} ranks share this machine's {cores} CPUs (one thread each). host_mem_bw: "
        f"{concurrent} attend kernels at once moved {shared_bw / 1e9:.3f} GB/s together "
        f"({shared_bw / (concurrent * mem_bw):.0%} of {concurrent} x one alone). host_copy_bw: a loopback transfer "
        f"costs its sender and its receiver a core-second per {copy_bw / 1e9:.3f} GB each (the slope of the "
        f"exchanges' CPU time over the bytes, per side; a lone memcpy moves "
        f"{memcpy_bw / 1e9:.3f} GB/s on one core); "
        "host_copy_bw_by_size, what each size cost (2 P N / the CPU time's share after the delay): "
        + _curve_text(copy_by_size) + ".",
        "# Raw one-way times (bytes: us): " + ", ".join(f"{s}: {t * 1e6:.1f}" for s, t in pp),
        "# Raw fp32 attend times (bytes: us): " + ", ".join(f"{b:.0f}: {t * 1e6:.1f}" for b, t in attend32),
        *_profile_lines(profiles, args.kernels_from, getattr(args, "visits", VISITS)),
    ]
    body = {
        "name": "localhost",
        "devices": {"cpu-rank": {
            "peak_flops": {"fp32": f"{flops[0]:.6g} FLOP/s", "bf16": f"{flops[0]:.6g} FLOP/s",
                           "fp16": f"{flops[0]:.6g} FLOP/s", "fp64": f"{flops[1]:.6g} FLOP/s"},
            "mem_bw": f"{mem_bw:.6g} B/s", "mem": f"{mem_total / world:.6g} B",
            "launch_overhead": f"{launch * 1e6:.6g} us",
            **({"kernels": _kernels_yaml(profiles)} if profiles else {})}},
        "nodes": [{"name": f"local.rank{r}", "kind": "gpu", "device": "cpu-rank"} for r in range(world)]
        + [{"name": "local.tx", "kind": "switch"}, {"name": "local.rx", "kind": "switch"}],
        "links": [{"src": f"local.rank{r}", "dst": "local.tx", "bandwidth": f"{flow_bw:.6g} B/s",
                   "latency": "0 s", "class": "loopback"} for r in range(world)]
        + [{"src": "local.tx", "dst": "local.rx", "bandwidth": f"{aggregate:.6g} B/s", "latency": "0 s",
            "class": "loopback-aggregate", "bandwidth_by_size": aggregate_by_size.to_yaml()}]
        + [{"src": "local.rx", "dst": f"local.rank{r}", "bandwidth": f"{flow_bw:.6g} B/s", "latency": "0 s",
            "class": "loopback"} for r in range(world)],
        "message_overhead": f"{overhead * 1e6:.6g} us",
        "comm_overhead": f"{comm_overhead * 1e6:.6g} us",
        "collective_overhead": f"{collective_overhead * 1e6:.6g} us",
        "collective_stall": f"{stall * 1e6:.6g} us",
        "host_cores": {"local": cores},
        "host_mem_bw": {"local": f"{host_mem_bw:.6g} B/s"},
        "host_copy_bw": {"local": f"{copy_bw:.6g} B/s"},
        "host_copy_bw_by_size": {"local": copy_by_size.to_yaml()},
    }
    text = "\n".join(lines) + "\n" + yaml.safe_dump(body, sort_keys=False, width=120)
    for line in lines:
        print(line.removeprefix("# "))
    return text
