"""Virtual links for ranks that share a host's CPU cores and memory (processes on one machine, as in real runs).

Per host with ``host_cores`` C, in units of bytes of copying (``host_copy_bw`` s per core; 1 when not given):

* a host link of C x s: every kernel and, with ``host_copy_bw``, every byte copied by a transfer's sender and by
  its receiver (the loopback transport copies through the kernel on the CPU) share the host's cores max-min; with
  ``host_copy_bw_by_size``, a message of n bytes costs ``s / copy_bw(n)`` bytes of copying per byte (its weight on
  the link, :mod:`simulator.cluster.size_curve`);
* a rank link of s: one rank's kernels run one at a time on at most one core;
* with ``host_mem_bw``, a memory link of ``host_mem_bw / mem_bw`` x s that memory-bound kernels also cross, except
  kernels timed from a profile measured with the host's other cores running the same kernel (``loaded`` > 1: the
  sharing of memory is in the measured time already, :mod:`simulator.distributed.host_load`);
* with profiles that say how much faster a kernel runs alone (``alone``, :mod:`simulator.kernels.profiles`), timed
  loaded on every core of the host (``loaded`` = ``host_cores``: what the ratio is relative to), a contention link
  of s: such a kernel of profiled (loaded) duration d and ratio R < 1 is a flow of R d x s that loads the contention
  link 1 / (loaded R) per byte. Alone it runs at s: R d. With ``loaded`` copies at once (of one R) the contention
  link holds each to R s: d, the time profiled. Limits of the model: kernels of different ratios on it get one rate
  (max-min), so one of R near 1 beside one of small R runs slower than loaded while they overlap (R 0.95 beside
  0.5: 1.45 times); kernels without a ratio (roofline kernels, merges, copies), or with R = 1, do not cross it, so
  a kernel with a ratio beside them runs at its alone speed; a profile loaded on fewer cores than the host has gets
  no ratio (the time of more copies at once was not measured).

A kernel of roofline (or profiled) duration d is a flow of d x s: alone on the host it takes exactly d (R d with
an ``alone`` ratio).
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.cluster.devices import DeviceSpec, kernel_profile, roofline
from simulator.cluster.size_curve import SizeCurve
from simulator.cluster.topology import Cluster
from simulator.schedule.core import Op

__all__ = ["HostResources"]


class HostResources:
    """Adds the virtual links to ``capacity`` (a list of link capacities) and says which a flow crosses."""

    def __init__(self, cluster: Cluster, place: Sequence[str], capacity: list[float]) -> None:
        self.cluster = cluster
        self.place = place
        self.scale: dict[int, float] = {}  # rank -> bytes of copying per core-second
        self.cores: dict[int, int] = {}  # rank -> its host's cores
        self.rank_link: dict[int, int] = {}
        self.host_link: dict[int, int] = {}  # rank -> its host's core link
        self.mem_link: dict[int, int] = {}
        self.contention_link: dict[int, int] = {}  # rank -> its host's contention link (profiles with ratios alone)
        self.copies: dict[int, bool] = {}  # rank -> do its transfers cost CPU
        # host core link -> (bytes of copying per core-second, what a byte of a message of each size costs)
        self.copy_curves: dict[int, tuple[float, SizeCurve]] = {}
        hosts: dict[str, tuple[int, int | None]] = {}
        contention: dict[str, int] = {}
        for r, node in enumerate(place):
            host = cluster.host_of(node)
            cores = cluster.host_cores.get(host)
            if cores is None:
                continue
            s = cluster.host_copy_bw.get(host, 1.0)
            if host not in hosts:
                core = len(capacity)
                capacity.append(cores * s)
                mem = None
                if host in cluster.host_mem_bw:
                    mem = len(capacity)
                    capacity.append(cluster.host_mem_bw[host] / cluster.specs[node].mem_bw_Bps * s)
                hosts[host] = (core, mem)
            core, mem = hosts[host]
            if any(p.alone and p.loaded == cores for p in cluster.specs[node].kernels.values()):
                if host not in contention:
                    contention[host] = len(capacity)
                    capacity.append(s)
                self.contention_link[r] = contention[host]
            if host in cluster.host_copy_bw_by_size:
                self.copy_curves[core] = (s, cluster.host_copy_bw_by_size[host])
            self.scale[r] = s
            self.cores[r] = cores
            self.host_link[r] = core
            self.rank_link[r] = len(capacity)
            capacity.append(s)
            if mem is not None:
                self.mem_link[r] = mem
            self.copies[r] = host in cluster.host_copy_bw

    def shares(self, rank: int) -> bool:
        """Whether the rank's kernels run as flows over its host's cores."""
        return rank in self.rank_link

    def kernel(self, op: Op, duration: float) -> tuple[tuple[int, ...], float, tuple[float, ...] | None]:
        """The links a kernel crosses, its size (duration in the host's unit) and its weights on them (None: 1)."""
        r = op.rank
        links: tuple[int, ...] = (self.rank_link[r], self.host_link[r])
        spec = self.cluster.specs[self.place[r]]
        profile = None if op.fused else kernel_profile(spec, op.fn, op.dtype, op.dims)
        loaded = profile is not None and profile.loaded > 1
        if r in self.mem_link and _memory_bound(spec, op) and not loaded:
            links = (*links, self.mem_link[r])
        if loaded and r in self.contention_link and profile is not None and profile.alone and \
                profile.loaded == self.cores[r]:
            ratio = profile.alone_ratio(op.dims)
            if ratio < 1.0:  # (a kernel that runs alone as fast as loaded contends for nothing: no link)
                return ((*links, self.contention_link[r]), ratio * duration * self.scale[r],
                        (*(1.0 for _ in links), 1.0 / (profile.loaded * ratio)))
        return links, duration * self.scale[r], None

    def transfer(self, src: int, dst: int) -> tuple[int, ...]:
        """The host core links a transfer's copies cross (sender's host, then receiver's; once each)."""
        return tuple(self.host_link[r] for r in (src, dst) if self.copies.get(r))


def _memory_bound(spec: DeviceSpec, op: Op) -> bool:
    """Roofline memory time above both the compute time and the launch overhead."""
    t_flops, t_mem = roofline(spec, op.flops, op.nbytes, op.dtype, op.fn)
    return t_mem > t_flops and t_mem > (0.0 if op.fused else spec.launch_s)
