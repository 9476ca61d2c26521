"""The NIC a GPU's traffic leaves and enters its server by, where several are equally near: NCCL's, for channel 0.

A server may hang two GPUs and two NICs off one PCIe switch (an A100 server of DeepEP #13), or every NIC off the
host bridge (a cloud VM): each GPU then has several NICs at the same distance, and a route between servers could
take any of them. NCCL does not pick by chance: a GPU's *local* NICs are those of its best paths, and GPU ``dev``
puts channel ``c`` on one of them by a fixed rule (``ncclTopoGetLocalNetType``, below); a point-to-point
connection's first channel and a ring's channel 0 take the NIC of channel 0. :func:`home_nics` gives that NIC per
GPU, and the router (:mod:`simulator.cluster.routing`) takes it among a route's equally short next hops, before its
ECMP hash: the source GPU's NIC first, then the destination's. Where a GPU has one nearest NIC (every preset but
the PCIe one) the route is the same either way.

:class:`NetPaths` is NCCL's view of one server that both use (:mod:`simulator.collectives.nccl_nets` runs NCCL's
ring search over it):

* **Paths** (``src/graph/paths.cc`` ``ncclTopoSetPaths``): a GPU's path to a NIC inside the server (through no
  other GPU), typed ``PIX`` (at most one PCIe switch), ``PXB`` (several), ``PHB`` (through one CPU), ``SYS``
  (across CPUs), its bandwidth the narrowest link's, the NIC's port included.
* **Local NICs** (``src/graph/topo.cc`` ``ncclTopoGetLocal``): of a GPU's paths, those of the highest bandwidth,
  of them the lowest type; a NIC's local GPUs likewise over its own paths.
* **A channel's NIC** (``ncclTopoGetLocalNetType``): the GPU's local NICs are shared by the first one's local
  GPUs, ``ceil(nics / gpus)`` each: GPU ``dev`` starts at ``dev % gpus`` (bits mirrored when the NIC count is a
  power of two) and channel ``c`` adds ``c % ceil(nics / gpus)``.

PXN (a GPU reaching a NIC through another GPU over NVLink) is NCCL's too, but a route relays through no GPU, so
:func:`home_nics` reads the paths without it: a GPU with no NIC on its switch takes one of those its own PCIe path
reaches (the host bridge's).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple

import networkx as nx

__all__ = ["NetPaths", "home_nics", "mirror_bits", "natural"]

# NCCL's path types (src/include/graph.h PATH_*), by which it ranks a GPU's paths to the NICs
PIX, PXB, PXN, PHB, SYS, DIS = 4, 5, 7, 8, 9, 11
# NCCL's bandwidth of a PCIe link (src/graph/topo.cc: width x kvDictPciGen / 80 GB/s, 48 for Gen5 x16) over the
# raw rate (128b/130b) the simulator's link carries (63.02 GB/s for Gen5 x16): its paths are in NCCL's figures
NCCL_PCIE = 0.75 * 130 / 128
EPS = 1e-9


class NetPath(NamedTuple):
    """A GPU's path to a NIC as NCCL ranks it: ``kind`` (a PATH_* type), ``bw`` (GB/s, the NIC's port included),
    ``links`` (the graph's directed links a channel over it loads: for PXN, those of the relaying GPU)."""

    kind: int
    bw: float
    links: tuple[tuple[str, str], ...]


def _host(node: str) -> str:
    return node.split(".", 1)[0]


class NetPaths:
    """NCCL's paths from one server's GPUs to its NICs (module docstring): ``raw[g][n]`` as the graph gives them,
    ``paths[g][n]`` as NCCL uses them (the same, until a subclass adds PXN)."""

    def __init__(self, graph: nx.DiGraph, gpus: Sequence[str], nics: Sequence[str]) -> None:
        self.graph = graph
        self.gpus, self.nics = list(gpus), list(nics)
        host = _host(self.gpus[0])
        mine = {v for v in graph.nodes if _host(v) == host}
        others = set(self.gpus)
        self.port = [max((graph.edges[u, v]["bandwidth"] / 1e9 for u, v in graph.out_edges(nic) if v not in mine),
                         default=0.0) for nic in self.nics]

        def weight(u: str, v: str, d: dict[str, Any]) -> float:  # as the router: latency, then host bridges, hops
            return float(d["latency"]) + 1e-15 + (1e-13 if graph.nodes[v].get("kind") == "cpu" else 0.0)

        self.raw: list[list[NetPath]] = []
        for gpu in self.gpus:
            view = nx.subgraph_view(graph, filter_node=lambda v, gpu=gpu: v in mine and (v == gpu or v not in others))
            _, found = nx.single_source_dijkstra(view, gpu, weight=weight)
            self.raw.append([self._typed(found.get(nic), k) for k, nic in enumerate(self.nics)])
        self.paths = [list(row) for row in self.raw]

    def bw(self, link: tuple[str, str]) -> float:
        """A link's bandwidth as NCCL's search counts it (GB/s; PCIe at NCCL's figure, ``NCCL_PCIE``)."""
        d = self.graph.edges[link]
        return float(d["bandwidth"]) / 1e9 * (NCCL_PCIE if d.get("cls") == "pcie" else 1.0)

    def _typed(self, nodes: list[str] | None, k: int) -> NetPath:
        if not nodes:
            return NetPath(DIS, 0.0, ())
        kinds = [self.graph.nodes[v].get("kind") for v in nodes[1:-1]]
        cpus, switches = kinds.count("cpu"), kinds.count("switch")
        kind = SYS if cpus > 1 else PHB if cpus else PXB if switches > 1 else PIX
        links = tuple(itertools.pairwise(nodes))
        bw = min([self.bw(e) for e in links] + [self.port[k]])
        return NetPath(kind, bw, links)

    @staticmethod
    def _local(paths: Sequence[NetPath]) -> list[int]:
        """``ncclTopoGetLocal``: the indices of the highest-bandwidth paths, of them the lowest type."""
        usable = [(i, p) for i, p in enumerate(paths) if p.kind < DIS]
        if not usable:
            return []
        best = max(p.bw for _, p in usable)
        top = [(i, p) for i, p in usable if p.bw >= best - EPS]
        low = min(p.kind for _, p in top)
        return [i for i, p in top if p.kind == low]

    def local_nets(self, g: int) -> list[int]:
        return self._local(self.paths[g])

    def local_gpus(self, n: int) -> list[int]:
        return self._local([row[n] for row in self.raw])

    def local_net(self, g: int, c: int) -> int:
        """``ncclTopoGetLocalNetType``: the NIC GPU ``g`` puts channel ``c`` on (-1: none)."""
        nets = self.local_nets(g)
        if not nets:
            return -1
        sharing = max(1, len(self.local_gpus(nets[0])))
        net = g % sharing
        if len(nets) & (len(nets) - 1) == 0:
            net = mirror_bits(net, len(nets))
        net += c % -(-len(nets) // sharing)
        return nets[net % len(nets)]


def mirror_bits(val: int, pow2: int) -> int:
    """NCCL's ``mirrorBits`` (``src/graph/topo.h``): ``val``'s bits below ``pow2`` in reverse order."""
    out, b, mb = 0, 1, pow2 >> 1
    while b < pow2:
        if val & b:
            out |= mb
        b, mb = b << 1, mb >> 1
    return out


def natural(name: str) -> tuple[str, int]:
    """A node name's sort key by its trailing number (``nic2`` before ``nic10``; no number: -1)."""
    head = name.rstrip("0123456789")
    return head, int(name[len(head):] or -1)


def _local_name(node: str) -> str:
    return node.split(".", 1)[1] if "." in node else node


def _shape(graph: nx.DiGraph, nodes: Sequence[str]) -> tuple[Any, ...]:
    """What :func:`home_nics` reads of a server, its names without the server's: servers of the same shape get the
    same answer."""
    mine = set(nodes)
    inside = tuple(sorted((_local_name(u), _local_name(v), float(d["bandwidth"]), float(d["latency"]),
                           str(d.get("cls", ""))) for u in nodes for _, v, d in graph.out_edges(u, data=True)
                          if v in mine))
    ports = tuple(sorted((_local_name(u), float(d["bandwidth"])) for u in nodes
                         if graph.nodes[u].get("kind") == "nic" for _, v, d in graph.out_edges(u, data=True)
                         if v not in mine))
    kinds = tuple((_local_name(v), str(graph.nodes[v].get("kind"))) for v in nodes)
    return inside, ports, kinds


def home_nics(graph: nx.DiGraph) -> dict[str, str]:
    """Per GPU with several equally near NICs on its server (module docstring), the one NCCL puts its channel 0 on;
    servers whose every NIC is the only one on its switch (or GPU) give none (a route then has no choice of NIC).
    GPUs in the graph's order (a server's ranks), NICs in name order."""
    kind = dict(graph.nodes(data="kind"))
    crowded = set()  # the servers where some node hangs two NICs or more
    for v, k in kind.items():
        if k != "nic" and "." in v and sum(kind.get(w) == "nic" and _host(w) == _host(v)
                                           for w in graph.successors(v)) > 1:
            crowded.add(_host(v))
    if not crowded:
        return {}
    by_host: dict[str, list[str]] = {}
    for v in graph.nodes:
        if "." in v and _host(v) in crowded:
            by_host.setdefault(_host(v), []).append(v)
    out: dict[str, str] = {}
    seen: dict[tuple[Any, ...], list[tuple[str, str]]] = {}
    for host, nodes in by_host.items():
        gpus = [v for v in nodes if kind[v] == "gpu"]
        nics = sorted((v for v in nodes if kind[v] == "nic"), key=natural)
        if not gpus or len(nics) < 2:
            continue
        key = _shape(graph, nodes)
        local = seen.get(key)
        if local is None:
            paths = NetPaths(graph, gpus, nics)
            local = seen[key] = [(_local_name(gpus[g]), _local_name(nics[n])) for g in range(len(gpus))
                                 if len(nets := paths.local_nets(g)) > 1 and paths.raw[g][nets[0]].kind <= PXB
                                 and (n := paths.local_net(g, 0)) >= 0]
        out.update((f"{host}.{g}", f"{host}.{n}") for g, n in local)
    return out

