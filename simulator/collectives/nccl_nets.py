"""NCCL's choice of NICs for its rings across servers, on a server whose GPUs are unevenly spread over its NICs.

Where every GPU has its own NIC (the presets), a channel per NIC rail is what NCCL's search finds
(:mod:`simulator.collectives.fabric`'s rail rule). An imported server may hang several GPUs and NICs off one PCIe
switch, or NICs off the host bridge: :func:`nccl_plans` then runs NCCL's own search over the cluster graph
(:class:`_NcclNets`: its paths, PXN, local NICs, each channel's NIC and the bandwidth-bounded ring search, each step
cited) and says, per channel, its NIC and the GPUs a ring may enter and leave the server at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from simulator.cluster.nic_affinity import DIS as _DIS
from simulator.cluster.nic_affinity import EPS as _EPS
from simulator.cluster.nic_affinity import PXB as _PXB
from simulator.cluster.nic_affinity import PXN as _PXN
from simulator.cluster.nic_affinity import NetPath, NetPaths
from simulator.cluster.topology import Cluster

__all__ = ["MAX_CHANNELS", "NVLINK_CLASSES", "nccl_plans", "rail_rule_is_nccls"]

MAX_CHANNELS = 64  # NCCL src/include/device.h MAXCHANNELS
NVLINK_CLASSES = ("nvlink", "infinity-fabric", "xgmi", "mesh")  # NCCL's "NVL" hardware class (RCCL: xGMI)

# NCCL's per-channel speeds (GB/s) its inter-node ring search tries, highest first (src/graph/search.cc
# speedArrayInter, sm90SpeedArrayInter, sm100SpeedArrayInter): by compute capability
_SPEEDS: dict[int, tuple[float, ...]] = {
    80: (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12),
    90: (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
    100: (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2,
          0.24, 0.12),
}
_RING_MAX = MAX_CHANNELS // 2  # src/init.cc: ringGraph->maxChannels = MAXCHANNELS / 2


class _NcclNets(NetPaths):
    """NCCL's choice of NICs for its inter-server rings on one server, over the cluster graph.

    * **Paths** (``src/graph/paths.cc`` ``ncclTopoSetPaths``): a GPU's path to a NIC inside the server (through no
      other GPU), typed ``PIX`` (at most one PCIe switch), ``PXB`` (several), ``PHB`` (through one CPU), ``SYS``
      (across CPUs), its bandwidth the narrowest link's, the NIC's port included.
    * **PXN** (``ncclTopoComputePaths``, on unless ``NCCL_PXN_DISABLE``; RCCL, for AMD GPUs, has it off): a GPU
      reaches a NIC through the NIC's own GPU (``ncclTopoGetLocalGpu``) when that GPU is ``PXB`` or closer to it,
      linked to this one by NVLink, and either nearer the NIC in bandwidth or this GPU's own path crosses a host
      bridge; the path is then ``PXN`` and loads the relay's PCIe links.
    * **Local NICs** (``src/graph/topo.cc`` ``ncclTopoGetLocal``): of a GPU's paths, those of the highest bandwidth,
      of them the lowest type; a NIC's local GPUs likewise over its own (never PXN) paths.
    * **A channel's NIC** (``ncclTopoGetLocalNetType``): the GPU's local NICs are shared by the first one's local
      GPUs, ``ceil(nics / gpus)`` each: GPU ``dev`` starts at ``dev % gpus`` (bits mirrored when the NIC count is a
      power of two) and channel ``c`` adds ``c % ceil(nics / gpus)``. (RCCL starts at the GPU's place among the
      NIC's local GPUs: the same on the servers here.) A NIC's GPU is the first local GPU that some channel puts
      on it (``ncclTopoGetLocalGpu``).
    * **The ring search** (``src/graph/search.cc`` ``ncclTopoCompute``, ``ncclTopoSearchRecNet``,
      ``ncclTopoSearchRecGpu``, ``ncclTopoSelectNets``; ``NCCL_CROSS_NIC`` off: a channel leaves by the NIC it
      came in by): the NICs in ``ncclTopoPrefNetsChannelFirst`` order, channel ``c`` tries them from the ``c``-th,
      skipping one whose port has less than the speed left; it enters at the NIC's GPU (then its other local GPUs)
      and leaves at a GPU whose path to the NIC is of the search's type or closer (on NVSwitch or a mesh a
      neighbour of the entry, ``ncclTopoSearchNextGpuSort``), every link on both paths with the speed left. The
      type starts at the closest any GPU has and widens while nothing is found or it is closer than ``PXN``; the
      speed starts at the highest not above the best path's bandwidth and falls while a slower one could still give
      half as much; a result replaces the kept one only with more channels x speed (``ncclTopoCompareGraphs``),
      then faster speeds are tried for as many channels (pass 2). Bandwidths are NCCL's: a PCIe link at NCCL's
      figure for it (``nic_affinity.NCCL_PCIE``), a NIC port at its speed.

    Not modelled: ``NCCL_CROSS_NIC=1``/``2`` rings (entering by one NIC and leaving by another: tried by NCCL after
    these and kept only if better, which equal budgets never are), the Intel host-bridge P2P overhead on ``PHB``
    paths, ``ncclTopoDupChannels`` (the simulator runs one channel per NIC use, as on the presets), NIC planes and
    rails, GPU Direct RDMA being off (every GPU is taken to be GDR capable), and the intra-server bandwidth of the
    ring (NVLink is never what stops these searches).
    """

    def __init__(self, cluster: Cluster, gpus: Sequence[str], nics: Sequence[str], nvs: bool, mesh: bool) -> None:
        super().__init__(cluster.graph, gpus, nics)
        self.nvs, self.mesh = nvs, mesh

    def local_gpu(self, n: int) -> int:
        """``ncclTopoGetLocalGpu``: the first of NIC ``n``'s local GPUs that puts some channel on it (-1: none)."""
        for c in range(MAX_CHANNELS):
            for g in self.local_gpus(n):
                if self.local_net(g, c) == n:
                    return g
        return -1

    def add_pxn(self, nvlinked: Callable[[int, int], float]) -> None:
        """``ncclTopoComputePaths``' PXN paths, NIC by NIC and GPU by GPU as it makes them (``nvlinked(a, b)``: the
        NVLink bandwidth between two GPUs, 0 if none)."""
        for n in range(len(self.nics)):
            for g in range(len(self.gpus)):
                p = self.local_gpu(n)
                if p in (-1, g):
                    continue
                peer, own = self.paths[p][n], self.paths[g][n]
                nvl = nvlinked(g, p)
                if peer.kind <= _PXB and nvl > 0 and (peer.bw > own.bw + _EPS or own.kind > _PXN):
                    self.paths[g][n] = NetPath(_PXN, min(nvl, peer.bw), peer.links)

    def select_nets(self, kind: int) -> list[int]:
        """``ncclTopoSelectNets`` for the search's start: every GPU's NICs channel by channel
        (``ncclTopoPrefNetsChannelFirst``), then the others of type ``kind`` or closer, by type and GPU."""
        out: list[int] = []
        for g in range(len(self.gpus)):
            first = self.local_net(g, 0)
            for c in range(MAX_CHANNELS):
                n = self.local_net(g, c)
                if n < 0 or (c and n == first):
                    break
                if n not in out:
                    out.append(n)
        for t in range(kind + 1):
            for g in range(len(self.gpus)):
                out += [n for n, p in enumerate(self.paths[g]) if p.kind == t and n not in out]
        return out

    def _exits(self, e: int) -> list[int]:
        """The GPUs a channel entering at ``e`` may leave at, in the order the search reaches them."""
        n = len(self.gpus)
        if n == 1:
            return [e]
        if self.nvs or self.mesh:
            return list(dict.fromkeys([(e - 1) % n, (e + 1) % n]))
        return [(e - j) % n for j in range(1, n)]

    def search(self, speed: float, kind: int, limit: int = _RING_MAX) -> list[tuple[int, int, int]]:
        """Channels ``(nic, entry, exit)`` at ``speed`` GB/s each with paths of type ``kind`` or closer."""
        left: dict[tuple[str, str], float] = {}
        port = list(self.port)

        def take(links: Sequence[tuple[str, str]], bw: float) -> bool:
            for e in links:
                if left.setdefault(e, self.bw(e)) < bw - _EPS:
                    return False
            for e in links:
                left[e] -= bw
            return True

        nets = self.select_nets(kind)
        out: list[tuple[int, int, int]] = []
        while nets and len(out) < limit:
            got = None
            for i in range(len(nets)):
                n = nets[(len(out) + i) % len(nets)]
                if port[n] < speed - _EPS:
                    continue
                own = self.local_gpu(n)
                for e in [own] * (own >= 0) + [g for g in self.local_gpus(n) if g != own]:
                    down = self.raw[e][n]
                    if down.kind > kind or not take([(v, u) for u, v in reversed(down.links)], speed):
                        continue
                    x = next((x for x in self._exits(e) if self.paths[x][n].kind <= kind
                              and take(self.paths[x][n].links, speed)), None)
                    if x is not None:
                        got = (n, e, x)
                        break
                    for u, v in down.links:
                        left[(v, u)] += speed
                if got:
                    break
            if got is None:
                break
            out.append(got)
            port[got[0]] -= speed
        return out

    def channels(self, arch: int) -> tuple[list[tuple[int, int, int]], int]:
        """``ncclTopoCompute`` for a ring (module notes above): the channels and the path type they were found at."""
        usable = [p for row in self.paths for p in row if p.kind < _DIS]
        if not usable:
            return [], _DIS
        speeds = _SPEEDS[arch]
        top = max(p.bw for p in usable)
        lo, hi = min(p.kind for p in usable), max(p.kind for p in usable)
        i = next((j for j, s in enumerate(speeds) if s <= top + _EPS), len(speeds) - 1)
        best: list[tuple[int, int, int]] = []
        best_speed, best_kind = 0.0, lo
        while True:
            kind = lo
            while True:
                got = self.search(speeds[i], kind)
                if len(got) * speeds[i] > len(best) * best_speed + _EPS:
                    best, best_speed, best_kind = got, speeds[i], kind
                if kind < hi and (not best or kind < best_kind or kind < _PXN):
                    kind += 1
                    continue
                break
            if len(best) == _RING_MAX:
                break
            if i + 1 < len(speeds) and (not best or speeds[i + 1] / best_speed > 0.49):
                i += 1
                continue
            break
        j = speeds.index(best_speed) if best else 0
        while best and j > 0:  # pass 2: as many channels, faster
            j -= 1
            got = self.search(speeds[j], best_kind)
            if len(got) >= len(best) and len(got) * speeds[j] > len(best) * best_speed + _EPS:
                best, best_speed = got, speeds[j]
        return best, best_kind


def nccl_plans(cluster: Cluster, gpus: list[str], nics: list[str], nvs: bool, mesh: bool, device: str
                ) -> tuple[tuple[tuple[str, tuple[int, ...], tuple[int, ...], int], ...], tuple[tuple[str, ...], ...]]:
    """NCCL's channels on a server whose GPUs are unevenly spread over its NICs (:class:`_NcclNets`): per channel
    its NIC's name after the server's, the GPUs it may enter at (NCCL's first, then the NIC's other local GPUs) and
    every other GPU it may leave at (NCCL's first, then the others whose path NCCL accepts, nearest first, then the
    rest, nearest first) and how many of those NCCL accepts; and per channel the NICs that are its NIC's twins
    (:attr:`Fabric.nic_twins`). Empty where every
    GPU has at most one local NIC (the rail rule of :func:`_rails` is then NCCL's) or no channel is found."""
    if not nics or not gpus:
        return (), ()
    graph = cluster.graph
    if all(sum(graph.nodes[v].get("kind") == "nic" for v in graph.successors(g)) <= 1 for g in gpus) and all(
            any(v in gpus for v in graph.successors(nic)) for nic in nics):
        return (), ()  # every NIC on its GPU (the presets): the rail rule
    nets = _NcclNets(cluster, gpus, nics, nvs, mesh)
    if all(len(nets.local_nets(g)) <= 1 for g in range(len(gpus))):
        return (), ()
    amd = device.startswith(("mi", "amd"))

    def nvlinked(a: int, b: int) -> float:
        u, v = gpus[a], gpus[b]
        if graph.has_edge(u, v) and graph.edges[u, v].get("cls") in NVLINK_CLASSES:
            return float(graph.edges[u, v]["bandwidth"]) / 1e9
        return max((min(graph.edges[u, s]["bandwidth"], graph.edges[s, v]["bandwidth"]) / 1e9
                    for s in graph.successors(u) if graph.nodes[s].get("kind") == "switch" and graph.has_edge(s, v)
                    and graph.edges[u, s].get("cls") in NVLINK_CLASSES), default=0.0)

    if not amd:  # RCCL: NCCL_PXN_DISABLE defaults to 1 (src/graph/paths.cc)
        nets.add_pxn(nvlinked)
    arch = 100 if device.startswith(("b", "gb")) else 90 if device.startswith(("h", "gh")) else 80
    found, kind = nets.channels(arch)
    plans = []
    for n, e, x in found:
        own = nets.local_gpu(n)
        entries = [e, *(g for g in [own, *nets.local_gpus(n)] if g >= 0 and g != e)]
        # NCCL's exit first, then the others it accepts, then the rest; each by its own path to the NIC (a route
        # relays through no GPU, so PXN's NVLink hop to the NIC's GPU has no counterpart: the route closest to
        # the NIC stands for it)
        order = sorted((g for g in range(len(gpus)) if g != x),
                       key=lambda g: (nets.paths[g][n].kind > kind, nets.raw[g][n].kind, -nets.raw[g][n].bw,
                                      (e - g) % len(gpus)))
        accepted = sum(nets.paths[g][n].kind <= kind for g in order)
        exits = (x, *order) if nets.raw[x][n].kind <= min((nets.raw[g][n].kind for g in order[:accepted]),
                                                          default=_DIS) else (*order[:accepted], x, *order[accepted:])
        plans.append((nics[n].split(".", 1)[-1], tuple(dict.fromkeys(entries)), exits, accepted + 1))

    def seen(k: int) -> list[tuple[int, float]]:
        return [(p.kind, round(p.bw, 6)) for p in (row[k] for row in nets.raw)]

    twins = tuple(tuple(nics[k].split(".", 1)[-1] for k in range(len(nics)) if k != n and seen(k) == seen(n))
                  for n, _, _ in found)
    return tuple(plans), twins


def rail_rule_is_nccls(nics: Sequence[str], plans: Sequence[tuple[str, tuple[int, ...], tuple[int, ...], int]],
                        twins: Sequence[tuple[str, ...]]) -> bool:
    """Whether the rail rule's NICs (``nics``, :func:`_rails`) are NCCL's channels' NICs, one each, up to twins (a
    GPU with three NICs on its switch that NCCL gives one channel: the one its route takes stands for it). The rail
    rule then stays: its hops leave by each GPU's own NIC, where NCCL's would reach the NIC through another GPU."""
    if len(nics) != len(plans):
        return False
    which = []
    for nic in nics:
        name = nic.split(".", 1)[-1]
        which += [k for k, (p, t) in enumerate(zip(plans, twins, strict=True)) if name == p[0] or name in t][:1]
    return sorted(which) == list(range(len(plans)))
