"""NCCL's point-to-point kernels: how many SMs a send or a receive holds while it is in flight.

NCCL runs ``ncclSend`` / ``ncclRecv`` (torch.distributed's ``isend``, ``irecv`` and ``batch_isend_irecv`` on GPUs
call them) as a kernel of one CTA per channel. A P2P plan takes ``NCCL_MAX_NTHREADS`` (640) threads per CTA
(``src/enqueue.cc``, ``plan->threadPerBlock = std::max(plan->threadPerBlock, NCCL_MAX_NTHREADS)``), built to fit
nearly a whole SM's registers, so that "NCCL CTAs won't share an SM with compute kernels" (S. Jeaugey, NVIDIA/nccl
issue 689): every channel of a send or receive in flight is one SM that an overlapped kernel does not have. The
engine slows a rank's kernels by the SMs its transfers hold (:mod:`simulator.engine.core`, "contention").

How many channels (NCCL ``master`` at 5067397; the same rules since 2.19):

* **per peer** (``ncclTopoGetNchannels``, ``src/graph/paths.cc``): an NVLink peer ``2 max(1, floor(path GB/s /
  NVLink GB/s))`` (one NVLink's bandwidth: ``SM80_NVLINK_BW`` 20, ``SM90_NVLINK_BW`` 20.6, ``SM100_NVLINK_BW``
  40.1 GB/s, ``src/graph/topo.h``), a PCIe peer 2, a peer on another server ``max(NICs, ceil(NIC GB/s /
  P2P_PER_CHANNEL_NET_BW))`` with ``NCCL_P2P_PER_CHANNEL_NET_BW`` 14 GB/s (one NIC: a GPU's route to another server
  leaves by one). The communicator (the schedule's GPUs: ``batch_isend_irecv`` runs on the group's communicator,
  as ring attention's implementations call it) takes the fewest over all its peers
  (``ncclTopoComputeP2pChannelsPerPeer``), rounded up to a power of two;
* **the communicator's P2P channels** (``ncclTopoComputeP2pChannels``): its collective channels (NCCL's count for
  the ranks' rings: :func:`simulator.collectives.caps.nccl_channels`) rounded up to a power of two, at most
  ``MAXCHANNELS`` (64). Across servers the per-peer count halves while ``per-peer x ceil(ranks / 8)`` exceeds them
  (``NCCL_MAX_DEV_WORK_P2P_PER_BATCH`` 8 peers per batch); on one server it is capped by them;
* **per operation** (``addP2pToPlan``, ``src/enqueue.cc``): the per-peer count halved while it times the ranks
  exceeds the P2P channels (``nChannelsMin``); then ``min(that, ceil(bytes / minPart))`` channels, doubled (while
  at most half the per-peer count) as long as a part exceeds ``maxPart``. ``minPart`` is half a chunk across
  servers and an eighth inside one, ``maxPart`` a chunk across servers and 32 inside one; the chunk is
  ``NCCL_P2P_NET_CHUNKSIZE`` 128 KiB across servers, ``NCCL_P2P_NVL_CHUNKSIZE`` 512 KiB on an all-NVLink server and
  ``NCCL_P2P_PCI_CHUNKSIZE`` 128 KiB otherwise (``src/init.cc``).

A KB-sized decode message takes one channel; a ring step's MB-sized block of keys and values 2 to 4 (8 x H100 in
one server: 2; 16 servers, one GPU each: 4). A ring step's send to the next rank and receive from the previous one,
grouped, run as one kernel on the larger of their channel counts (``addP2pToPlan``: ``nChannelsMax =
std::max(nChannels[0], nChannels[1])``), and a communicator runs its NCCL kernels one at a time on its stream: a
GPU holds the most any of its transfer ends in flight holds. Only NVIDIA GPUs are counted (RCCL's rules differ and
are not modelled): elsewhere a transfer holds nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simulator.cluster.memo import cluster_memo
from simulator.cluster.topology import Cluster
from simulator.collectives.caps import ARCHS, arch_of, nccl_channels
from simulator.collectives.fabric import MAX_CHANNELS, fabric_of

__all__ = ["P2pChannels", "p2p_channels"]

_GB = 1e9
NET_BW_PER_CHANNEL = 14.0  # GB/s, NCCL_P2P_PER_CHANNEL_NET_BW (src/graph/paths.cc)
NVLINK_BW = {"volta": 20.0, "ampere": 20.0, "hopper": 20.6, "blackwell": 40.1}  # GB/s per NVLink, src/graph/topo.h
PEERS_PER_BATCH = 8  # NCCL_MAX_DEV_WORK_P2P_PER_BATCH (src/include/device.h)
NET_CHUNK = 128 * 1024  # NCCL_P2P_NET_CHUNKSIZE
NVL_CHUNK = 512 * 1024  # NCCL_P2P_NVL_CHUNKSIZE
PCI_CHUNK = 128 * 1024  # NCCL_P2P_PCI_CHUNKSIZE


def _pow2_up(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class P2pChannels:
    """A communicator's P2P channel counts: ``per_peer`` (``p2pnChannelsPerPeer``), ``channels``
    (``p2pnChannels``), over ``ranks`` GPUs on ``nodes`` servers, moving ``chunk``-byte chunks."""

    per_peer: int
    channels: int
    ranks: int
    nodes: int
    chunk: int

    def of(self, nbytes: float) -> int:
        """Channels (CTAs, SMs) one send or receive of ``nbytes`` runs on (module docstring, per operation)."""
        return int(self.of_many(np.array([nbytes], dtype=float))[0])

    def of_many(self, nbytes: np.ndarray) -> np.ndarray:
        """:meth:`of` of every message of ``nbytes`` at once (int64)."""
        least = self.per_peer
        while least * self.ranks > self.channels and least > 1:
            least //= 2
        size = np.ceil(nbytes).astype(np.int64)  # (NCCL counts whole bytes)
        across = self.nodes > 1
        min_part = self.chunk // 2 if across else self.chunk // 8
        max_part = self.chunk if across else self.chunk * 32
        n = np.minimum(least, -(-size // min_part))
        n = np.maximum(n, 1)  # (no bytes: one channel)
        part = np.maximum(min_part, -(-size // n))
        while True:
            grow = (part > max_part) & (n <= self.per_peer // 2)
            if not grow.any():
                break
            n = np.where(grow, n * 2, n)
            part = -(-size // n)
        return n


def p2p_channels(cluster: Cluster, place: Sequence[str]) -> P2pChannels | None:
    """The P2P channels of a communicator of the GPUs ``place`` (node names, one per rank; the first GPU's links
    stand for every GPU's: the servers are alike), or None where they are not NVIDIA GPUs NCCL's rules cover. Kept
    per cluster and placement (the engine asks for every schedule)."""
    memo = cluster_memo(cluster, "p2p channels")
    key = tuple(place)
    if key not in memo:
        memo[key] = _p2p_channels(cluster, place)
    hit: P2pChannels | None = memo[key]
    return hit


def _p2p_channels(cluster: Cluster, place: Sequence[str]) -> P2pChannels | None:
    if len(place) < 2:
        return None
    spec = cluster.specs.get(place[0])
    arch = arch_of(spec.name) if spec is not None else ""
    if arch not in ARCHS or spec is None or spec.sm_count <= 0:
        return None
    index = {node: i for i, node in enumerate(cluster.ranks)}
    if any(node not in index for node in place):
        return None
    fabric = fabric_of(cluster)
    ranks = [index[node] for node in place]
    first = place[0]
    host = cluster.host_of(first)
    near = next((n for n in place[1:] if cluster.host_of(n) == host and n != first), None)
    far = next((n for n in place[1:] if cluster.host_of(n) != host), None)
    counts = []
    if near is not None:
        if fabric.intra == "nvlink":
            bw = cluster.route_bandwidth(cluster.route(first, near)) / _GB
            counts.append(2 * max(1, int(bw / NVLINK_BW[arch])))
        else:
            counts.append(2)
    if far is not None:
        bw = cluster.route_bandwidth(cluster.route(first, far)) / _GB
        counts.append(max(1, math.ceil(int(bw) / NET_BW_PER_CHANNEL)))
    if not counts:
        return None
    nodes = len(fabric.groups(ranks))
    per_peer = _pow2_up(min(counts))
    channels = _pow2_up(min(nccl_channels(fabric, ranks), MAX_CHANNELS))
    if nodes > 1:
        while per_peer * math.ceil(len(place) / PEERS_PER_BATCH) > channels and per_peer > 1:
            per_peer //= 2
    else:
        per_peer = min(channels, per_peer)
    # across servers a Grace (Arm) host with Blackwell GPUs (GB200) doubles the chunk (src/init.cc: "GBx platforms
    # only have 4 GPUs per host")
    grace = spec.name.lower().startswith("gb") and arch == "blackwell"
    chunk = NET_CHUNK * (2 if grace else 1) if nodes > 1 else NVL_CHUNK if fabric.intra == "nvlink" else PCI_CHUNK
    return P2pChannels(per_peer, channels, len(place), nodes, chunk)
