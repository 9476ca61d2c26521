"""Data parallelism: the DP collectives on the real fabric, and their overlap with the backward.

**Which GPUs.** DP replica ``d`` of a GPU is ``tp x cp x pp`` GPUs further on the cluster's order (placement: TP,
then CP, then PP, then DP). Gradients are reduced, and ZeRO shards, over DP x CP, as Megatron-LM does (its
data-parallel group with context parallelism: a CP rank's gradients are its tokens' share of the weights' gradient):
a GPU's *gradient group* is the GPUs of its TP rank and stage in every CP rank of every replica, ``dp x cp`` of them
(:func:`dp_groups`; "DP group" below). The DP groups of every GPU of one server run at the same time in a real step
and share that server's NICs, so :class:`DPCollectives` simulates one collective on the DP groups of all the GPUs of the
representative pipeline's first server at once, as NCCL runs them on the fabric (channels, protocols, the tuner's
choice), and takes the makespan. Every server of the pipeline holds the same shape of groups, so this is the time
of every DP group (the symmetry the tests check on a small cluster against all groups simulated together). Where a
server has a NIC per GPU (a rail-optimised fabric), each group crosses servers on its own GPU's rail and one group
alone takes the time of all of them (tested too): then one group is simulated. A DP group of more than 32 GPUs is
not simulated (a ring of P ranks is P^2 transfers per channel, NCCL's tree over 128 ranks minutes to simulate): its
collective takes the time the ``auto`` tuner's predictor gives (:func:`simulator.collectives.tuner.predict`: NCCL's
cost model form with this cluster's hops and bottleneck bandwidths), for the algorithm and protocol the tuner picks.
On dgx-h100 at 64 and 128 ranks the predictor is within 0-26% of the simulation (equal for all-gathers, 1-6% for
buckets of 800 MB, up to 26% for reduce-scatters of 25 MB with LL128).

**Overlap**: gradients are cut into buckets of ``bucket`` bytes in reverse layer order, as PyTorch DDP and
Megatron-LM do (:func:`bucket_sizes`); ZeRO 1 and 2 all-gather the updated parameters in the same buckets; a
bucket's collective starts when its last gradient was produced (gradients appear at a uniform rate over the work of
the backwards that produce them) and the previous bucket's collective ended (one communication stream). The
pipeline's walk times it (:class:`simulator.training.pipeline.DPStreams`); for one backward at full pace its closed
forms are :func:`overlapped_end` and :func:`equal_buckets_end`.

**What the overlap costs the compute**: NCCL runs a collective as one kernel of a block per channel
(``src/enqueue.cc``, ``ncclLaunchKernel``: ``grid = {nChannels, 1, 1}``), each block resident on an SM for the
collective's whole run, so the kernels beside it run on the SMs left: a kernel's time with ``h`` SMs held is
:func:`simulator.cluster.devices.duration_with_sms_held`'s (the engine's contention model), ``h`` the channel count
the collective runs with (:meth:`DPCollectives.channels`). While a bucket's collective is in flight a stage's
forwards and backwards go at ``1 / ((1 - k) + k s)`` of their pace alone (``k`` the share of a layer's seconds that
is kernels, ``s`` those kernels' seconds with ``h`` SMs held over their seconds alone:
:meth:`simulator.training.step.Pieces.pace`); the buckets and the slowed ops are timed in the pipeline's own walk
(:class:`simulator.training.pipeline.DPStreams`), so later buckets are ready later and the stages that wait for a
slowed backward wait longer. ZeRO-3's per-layer all-gather and reduce-scatter, prefetched under a layer, slow that
layer so (:func:`under`). The collectives' HBM traffic (a few tens of GB/s of link bytes against 2-5 TB/s of HBM)
is left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from simulator.cluster.topology import Cluster
from simulator.collectives import collective, fabric_of
from simulator.collectives.tuner import choose, predict
from simulator.engine.core import simulate
from simulator.schedule.core import Schedule
from simulator.units import DTYPE_BYTES

__all__ = ["MAX_SIMULATED_DP", "DPCollectives", "bucket_sizes", "dp_groups", "equal_buckets_end", "overlapped_end",
           "under"]


def dp_groups(replica_gpus: int, dp: int, gpus: Sequence[int], tp: int = 1, cp: int = 1) -> list[list[int]]:
    """The gradient group (cluster rank indices, ascending) of each GPU of ``gpus`` (indices within the first
    replica): the GPUs of its TP rank and stage in every CP rank of every replica (``tp``, ``cp``: the degrees; with
    ``cp = 1`` its DP group)."""
    groups = []
    for g in gpus:
        t, s = g % tp, g // (tp * cp)
        groups.append(sorted(t + tp * (c + cp * s) + replica_gpus * d for d in range(dp) for c in range(cp)))
    return groups


def bucket_sizes(elements: float, bucket_elements: float) -> list[float]:
    """Gradient elements per bucket: whole buckets of ``bucket_elements``, the last one padded to full as
    Megatron-LM pads its buckets (less than one bucket more, which keeps every bucket of every stage one size: one
    collective simulated serves them all); gradients smaller than a bucket are one bucket of their size."""
    if elements <= 0:
        return []
    count = max(1, math.ceil(elements / bucket_elements - 1e-9))
    return [min(bucket_elements, elements)] * count


def overlapped_end(start: float, duration: float, sizes: Sequence[float], times: Sequence[float],
                   stream_free: float = 0.0) -> float:
    """When the last bucket's collective ends: bucket ``i`` (``sizes[i]`` elements, ``times[i]`` seconds) is ready
    once the backward that started at ``start`` and lasts ``duration`` produced its share of ``sum(sizes)``, and
    starts when it is ready and the stream is free (from ``stream_free``)."""
    total, done, free = sum(sizes), 0.0, stream_free
    for size, t in zip(sizes, times, strict=True):
        done += size
        ready = start + duration * done / total
        free = max(free, ready) + t
    return free


def equal_buckets_end(start: float, duration: float, count: int, seconds: float, stream_free: float = 0.0) -> float:
    """:func:`overlapped_end` of ``count`` equal buckets of ``seconds`` each, in closed form: bucket ``i`` is ready
    at ``start + duration (i + 1) / count``; the stream ends at the latest of ``stream_free + count x seconds`` and
    ``ready_i + (count - i) x seconds``, which is linear in ``i`` and so largest at the first or the last bucket."""
    if count <= 0:
        return stream_free
    return max(stream_free + count * seconds, start + duration / count + count * seconds,
               start + duration + seconds)


def under(work: float, phases: Sequence[tuple[float, float]]) -> float:
    """Seconds of ``work`` seconds of compute (its pace alone) that starts with collectives run one after another
    beside it, ``phases`` (seconds, the compute's pace while that one runs), until both are done: ZeRO-3's layer
    with its prefetched collectives. With every pace 1, ``max(work, their seconds)``, the same floats."""
    busy = sum(seconds for seconds, _ in phases)
    if all(pace >= 1.0 for _, pace in phases):
        return max(work, busy)
    t, left = 0.0, work
    for seconds, pace in phases:
        if left <= seconds * pace:
            return max(busy, t + left / pace)
        t, left = t + seconds, left - seconds * pace
    return t + left


MAX_SIMULATED_DP = 32  # larger DP groups are timed by the collectives' predictor (module docstring)


class DPCollectives:
    """Times of DP collectives of ``n`` elements on the cluster (memoised per operation and size)."""

    def __init__(self, cluster: Cluster, replica_gpus: int, dp: int, dtype: str, tp: int = 1, cp: int = 1) -> None:
        self.cluster, self.replica_gpus, self.dtype = cluster, replica_gpus, dtype
        self.dp = dp * cp  # the GPUs of a gradient group
        self.fabric = fabric_of(cluster)
        host0 = self.fabric.hosts[0]
        first = [r for r in range(min(replica_gpus, len(cluster.ranks))) if self.fabric.hosts[r] == host0]
        groups = dp_groups(replica_gpus, dp, first, tp, cp)
        self.groups = [g for i, g in enumerate(groups) if g not in groups[:i]]  # a CP group's GPUs share one
        if self.fabric.rails >= len(first):  # a NIC per GPU: each group on its own rail, one group is them all
            self.groups = self.groups[:1]
        self.memo: dict[tuple[str, int], float] = {}
        self.held: dict[tuple[str, int], int] = {}  # per (operation, n): the channels (SMs) its kernel holds
        self.sent: dict[tuple[str, int], float] = {}  # bytes the simulated groups sent, per (operation, n)
        self.events = 0

    def time(self, operation: str, n: float) -> float:
        """Seconds of ``operation`` (``allreduce``, ``reduce-scatter``, ``allgather``) of ``n`` elements (the full
        buffer) on every DP group of the first server at once; 0 with dp = 1."""
        n_int = round(n)
        if self.dp == 1 or n_int <= 0:
            return 0.0
        key = (operation, n_int)
        if key not in self.memo and self.dp > MAX_SIMULATED_DP:
            group, eb = self.groups[0], DTYPE_BYTES[self.dtype]
            choice = choose(operation, group, n_int, self.fabric, elem_bytes=eb, dtype=self.dtype)
            self.memo[key] = predict(operation, group, n_int, choice, self.fabric, elem_bytes=eb, dtype=self.dtype)
            self.held[key] = choice.channels
        if key not in self.memo:
            used = sorted({r for g in self.groups for r in g})
            sched = Schedule(max(used) + 1, placement=tuple(self.cluster.ranks[: max(used) + 1]), name=operation)
            held = 0
            for i, g in enumerate(self.groups):
                _, choice = collective(sched, operation, g, f"g{i}", n_int, self.fabric,
                                       elem_bytes=DTYPE_BYTES[self.dtype], dtype=self.dtype, tag=f"dp{i}", deps={})
                held = max(held, choice.channels)
            self.held[key] = held
            result = simulate(sched, self.cluster)
            self.events += result.events
            self.memo[key], self.sent[key] = result.makespan, result.bytes_sent()
        return self.memo[key]

    def channels(self, operation: str, n: float) -> int:
        """The channels (one block, one SM each, for the collective's whole run: NCCL's grid) of the collective
        :meth:`time` timed; 0 with dp = 1."""
        n_int = round(n)
        if self.dp == 1 or n_int <= 0:
            return 0
        self.time(operation, n)
        return self.held[(operation, n_int)]
