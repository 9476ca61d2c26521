"""NCCL's per-channel bandwidth caps: how fast one channel of an algorithm and protocol can move bytes.

NCCL's cost model (``src/graph/tuning.cc``, ``ncclTunerConstantsDefaults`` and ``ncclTopoTuneModel``, v2.30) bounds
the bus bandwidth a collective reaches by what a channel's threads can push, per GPU architecture (Volta, Ampere,
Hopper, Blackwell: the compute capability) and scale (1, 2, more than 2 nodes), in GB/s:

* ring LL: the whole collective at most ``llMaxBws`` (1 node: by GPU architecture; several: by host CPU, Intel or
  AMD); ring LL128: ``perChMaxRingLL128Bws`` per channel;
* tree allreduce: ``perChMaxTreeBws`` per channel and 0.92 of the channel's bandwidth from NCCL's search (the
  graph's ``bwIntra`` at 1 or 2 nodes: ``busBw = min(nChannels * bw * .92, nChannels * perChMaxTreeBw)``), LL128
  also ``perChMaxTreeLL128Bws``, LL also ``llMaxBws`` in all. NCCL then halves a tree's bus bandwidth into its
  algorithm bandwidth: the up and down pipelines share the channel (``runTreeSplit`` gives each half of its
  threads), which :mod:`.nccl_tree` models by capping each direction at half the channel's cap. Without the
  search's bandwidth in the cap, a tree across two servers (whose NICs carry the payload once each way, where a
  ring's carry it 2(P-1)/P times) would outrun the ring at large sizes, where NCCL's model picks the ring.

NCCL applies them to its channels, which its search (``src/graph/search.cc``) sizes from a table of speeds per
architecture (``speedArrayIntra`` / ``speedArrayInter``, ``sm90...`` for Hopper, ``sm100...`` for Blackwell) and then
doubles (``ncclTopoDupChannels``). One of our channels (a ring over distinct links, :mod:`.fabric`) stands for as
many of NCCL's as that search fits on its narrowest link: ``w = floor(B / s)`` at the fastest speed ``s <= B``,
doubled where ``ncclTopoDupChannels`` doubles (speed >= 25 GB/s, and on Hopper and later not where speed < 50 and
more than 4 channels). Its cap is ``w`` x the per-channel cap (on an 8 x H100 NVSwitch server: 14 of NCCL's channels
per ring, LL128 and tree caps above the link; across DGX H100 nodes: 2 per NIC rail, likewise above the 400 Gb/s
NIC; ``llMaxBws`` binds LL everywhere). The LL cap is the collective's: its channels share it evenly.

Caps are on the payload (bus bandwidth), not the bytes on the wire; RCCL's tuning model differs and is not
modelled here: AMD GPUs (and unknown devices) are not capped. Unknown multi-node CPUs count as Intel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from simulator.cluster.memo import cluster_memo
from simulator.collectives.fabric import Fabric
from simulator.collectives.hops import hop_table

__all__ = ["ARCHS", "arch_of", "channel_cap", "fabric_cap", "nccl_channels", "nccl_speed", "nccl_width"]

_GB = 1e9
ARCHS = ("volta", "ampere", "hopper", "blackwell")  # NCCL's compute-capability index order
_DEVICE_ARCH = (("v100", "volta"), ("a100", "ampere"), ("a10", "ampere"), ("a30", "ampere"), ("a40", "ampere"),
                ("l4", "ampere"), ("l40", "ampere"), ("rtx4090", "ampere"), ("rtx3090", "ampere"),
                ("gh200", "hopper"), ("h100", "hopper"), ("h200", "hopper"), ("h800", "hopper"),
                ("gb200", "blackwell"), ("b200", "blackwell"), ("b100", "blackwell"))  # Ada (sm89) is >= 80: Ampere

# ncclTunerConstantsDefaults (src/graph/tuning.cc, NCCL 2.30), GB/s, columns: 1 node, 2 nodes, more
_LL_MAX = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0),
           "blackwell": (2 * 141.0, 2 * 45.0, 2 * 35.0)}  # rows 0 / 1 for several nodes: Intel / AMD hosts
_LL_MAX_HOST = {"intel": (39.0, 39.0, 20.4), "amd": (87.7, 22.5, 19.0)}
_RING_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 36.7),
               "blackwell": (40.0, 40.0, 40.0)}
_TREE_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0),
               "blackwell": (55.6, 31.67, 20.0)}
_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0),
         "blackwell": (70.0, 42.8, 24.0)}
# src/graph/search.cc: the speeds (GB/s) NCCL's search tries, fastest first: (inside a node, across nodes)
_SPEEDS = {
    "old": ((40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
            (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2)),
    "hopper": ((60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
               (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2)),
    "blackwell": ((90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
                  (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0)),
}


def arch_of(device: str) -> str:
    """NCCL's architecture class of a device name (``""``: not an NVIDIA GPU NCCL's table covers)."""
    name = device.lower()
    for prefix, arch in _DEVICE_ARCH:
        if name.startswith(prefix):
            return arch
    return ""


def _scale(nodes: int) -> int:
    return 0 if nodes <= 1 else 1 if nodes == 2 else 2


def nccl_width(arch: str, link_Bps: float, nodes: int) -> int:
    """How many of NCCL's channels one of ours (narrowest link ``link_Bps``) stands for (module docstring)."""
    speeds = _SPEEDS.get(arch, _SPEEDS["old"])[0 if nodes <= 1 else 1]
    bw = link_Bps / _GB
    speed = next((s for s in speeds if s <= bw), speeds[-1])
    width = max(1, math.floor(bw / speed + 1e-9))
    newer = arch in ("hopper", "blackwell")
    if speed >= 25.0 and not (newer and speed < 50.0 and width > 4):
        width *= 2
    return width


def nccl_speed(arch: str, link_Bps: float, nodes: int) -> float:
    """GB/s NCCL's search gives each of its channels on a narrowest link of ``link_Bps``: the speed it fits
    ``floor(B / s)`` channels at, shared by the duplicates ``ncclTopoDupChannels`` makes (it divides the graph's
    bandwidth by the duplication)."""
    speeds = _SPEEDS.get(arch, _SPEEDS["old"])[0 if nodes <= 1 else 1]
    bw = link_Bps / _GB
    speed = next((s for s in speeds if s <= bw), speeds[-1])
    fit = max(1, math.floor(bw / speed + 1e-9))
    return speed * fit / nccl_width(arch, link_Bps, nodes)


def channel_cap(arch: str, operation: str, family: str, proto: str, *, nodes: int, channels: int, width: int,
                host_cpu: str = "intel", speed: float = math.inf) -> float:
    """Payload bytes/s one of ``channels`` channels can move (``inf``: no cap), each standing for ``width`` of
    NCCL's channels; ``family`` is ``ring``, ``tree`` or ``nvls`` (:func:`.channels.protocol_family`); ``speed``:
    GB/s NCCL's search gives each of its channels (:func:`nccl_speed`; ``inf``: not known)."""
    if arch not in ARCHS or family == "nvls":
        return math.inf
    i = _scale(nodes)
    ll_total = (_LL_MAX[arch] if nodes <= 1 else _LL_MAX_HOST.get(host_cpu, _LL_MAX_HOST["intel"]))[i]
    cap = math.inf
    if family == "tree" and operation == "allreduce":
        cap = width * min(_TREE[arch][i], 0.92 * speed)
        if proto == "LL128":
            cap = min(cap, width * _TREE_LL128[arch][i])
    if family == "ring" and proto == "LL128":
        cap = width * _RING_LL128[arch][i]
    if proto == "LL" and family in ("ring", "tree"):
        cap = min(cap, ll_total / max(1, channels))
    return cap * _GB


def fabric_cap(fabric: Fabric, operation: str, family: str, proto: str, ranks: Sequence[int],
               channels: int) -> float:
    """:func:`channel_cap` on ``fabric``'s cluster (``inf`` without one): its GPUs' architecture, its server count
    for ``ranks`` and the narrowest link of their first channel's ring."""
    cluster = fabric.cluster
    if cluster is None or len(ranks) < 2:
        return math.inf
    arch = arch_of(cluster.specs[cluster.ranks[ranks[0]]].name)
    if arch not in ARCHS or family == "nvls":
        return math.inf
    hit = _narrowest(fabric, ranks)
    if not math.isfinite(hit):  # no link between the ranks: nothing to cap
        return math.inf
    servers = len(fabric.groups(ranks))
    return channel_cap(arch, operation, family, proto, nodes=servers, channels=channels,
                       width=nccl_width(arch, hit, servers), speed=nccl_speed(arch, hit, servers))


def nccl_channels(fabric: Fabric, ranks: Sequence[int]) -> int:
    """How many channels NCCL runs a collective of ``ranks`` on: our channels (:meth:`Fabric.default_channels`)
    times the NCCL channels each stands for (:func:`nccl_width` of the first ring's narrowest link); 1 where the
    ranks share no link or are not GPUs NCCL's table covers."""
    cluster = fabric.cluster
    if cluster is None or len(ranks) < 2:
        return 1
    arch = arch_of(cluster.specs[cluster.ranks[ranks[0]]].name)
    hit = _narrowest(fabric, ranks)
    if arch not in ARCHS or not math.isfinite(hit):
        return 1
    return fabric.default_channels(ranks) * nccl_width(arch, hit, len(fabric.groups(ranks)))


def _narrowest(fabric: Fabric, ranks: Sequence[int]) -> float:
    """Bytes/s of the narrowest link of the first channel's ring over ``ranks`` (kept per cluster)."""
    assert fabric.cluster is not None
    memo = cluster_memo(fabric.cluster, "narrowest ring link")
    key = tuple(ranks)
    hit = memo.get(key)
    if hit is None:
        ring = fabric.rings(ranks, 1)[0]
        table = hop_table(fabric.cluster)
        rows = table.rows(ring, [*ring[1:], ring[0]])  # first: it may add rows
        hit = memo[key] = float(table.free[rows].min())
    return float(hit)
