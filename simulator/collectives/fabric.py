"""What a collective needs to know about the cluster: servers, NIC rails, link classes, and its channels' rings.

NCCL (and RCCL) run a collective as several **channels**, each a ring (or tree) over all ranks that moves its share
of the bytes concurrently with the others. Its topology search (``src/graph/search.cc``) looks for rings that do not
share links: across servers one ring per NIC rail (the ring enters and leaves each server through the same NIC
index, so a rail-optimised fabric carries each channel on its own rail), inside a server one ring per set of
distinct GPU-to-GPU links. We follow that rule on the cluster graph:

* several servers: one channel per NIC of a server that NCCL would use (``rails``); channel ``c`` enters server
  ``i`` at a GPU nearest NIC ``c`` and leaves it at its neighbour, servers visited as a snake so that every
  server-to-server hop joins GPUs of the same local index (one rail). A GPU's nearest NIC is the one its route to
  the next server leaves by: routes pass through no GPU, so that is over PCIe, and of equal latencies through the
  fewest host bridges, as NCCL ranks paths (``PIX``/``PXB`` before ``PHB`` before ``SYS``, ``src/graph/paths.cc``);
  a NIC that is no GPU's nearest carries no channel (a storage NIC behind the host bridge). Where two neighbours
  share a NIC (a PCIe switch with two GPUs and their NIC) the channel enters at the second and leaves at the first,
  so that it goes on to the next server by the NIC it came in by (NCCL's rings leave a server by the NIC they
  entered it by where they can, ``src/graph/search.cc``) and every NIC carries its channel;
* several servers whose GPUs are unevenly spread over their NICs (a GPU with two NICs on its PCIe switch, GPUs with
  none, every NIC behind the host bridge of a VM), where the rule above misses the NICs NCCL uses: NCCL's own
  assignment (:class:`_NcclNets`: ``ncclTopoGetLocalNet``, PXN, the ring search), each channel on the NIC the
  search gives it, entering a server at a GPU local to that NIC and leaving at one whose path to it NCCL accepts
  (its own, or through the NIC's GPU: PXN). A route's NIC, among equally near ones, is its ECMP hash's pick for the
  GPU pair, so each hop joins a pair whose route takes the channel's NIC or its twin (a NIC on the same switch) and
  loads no link twice where another pair would not (:meth:`Fabric._planned`);
* one server whose GPUs are all directly linked (a mesh: MI300X's Infinity Fabric): rings of pairwise distinct
  directed links, as many as the links allow (:func:`mesh_rings`: 7 rings on 8 GPUs, every xGMI link used once in
  each direction);
* one server whose GPUs hang off one switch or host bridge (NVSwitch, PCIe): every ring crosses the same GPU
  links, so there is one ring of distinct links: 1 channel.

The count is capped at NCCL's ``MAXCHANNELS`` (64, ``src/include/device.h``). A channel count given by the user
that exceeds the distinct rings reuses them (channels then share links, which the flow engine divides).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from simulator.cluster.nic_affinity import natural
from simulator.cluster.topology import Cluster
from simulator.collectives.nccl_nets import MAX_CHANNELS, NVLINK_CLASSES, nccl_plans, rail_rule_is_nccls

__all__ = ["MAX_CHANNELS", "NVLS_DEVICES", "Fabric", "fabric_of", "mesh_rings"]

_SEARCH_MAX = 8  # GPUs up to which mesh rings come from a search (beyond: steps coprime with the count)
NVLS_DEVICES = ("h100", "h200", "gh200", "b200", "gb200")  # NVSwitch gen 3+ with NVLink SHARP (Hopper and later)


@dataclass(frozen=True)
class Fabric:
    """The collective-relevant view of a cluster, per rank (index into ``cluster.ranks``).

    ``hosts[r]``: server index; ``local[r]``: index among its server's GPUs; ``rails``: NICs per server (0 on one
    server); ``nic_gpu[k]``: local index of the GPU where a channel on NIC ``k`` enters a server (its rail's entry:
    a GPU nearest the NIC, module docstring); ``nic_plans[k]``: where NCCL's own assignment applies (servers with
    GPUs unevenly spread over NICs), channel ``k``'s NIC (its name after the server's, ``nic3``), the GPUs it may
    enter a server at, those it may leave at and how many of those NCCL accepts, NCCL's choice first
    (:class:`_NcclNets`); ``nic_twins[k]``: the NICs that stand where channel ``k``'s does for NCCL (the same
    local GPUs, by paths of the same type and bandwidth: two NICs on one PCIe switch); ``intra``: NCCL's
    hardware class inside a server (``nvlink`` or ``pci``); ``mesh``: every GPU pair of a server directly linked;
    ``nvls``: the server's GPUs share an NVSwitch with NVLink SHARP; ``switch``: that switch's node name per host;
    ``device``: the GPUs' device name; ``link_class``: the class of a server's GPU-to-GPU (or GPU-to-switch) links
    (:mod:`.goodput`). ``cluster``: the cluster itself (the ``auto`` tuner simulates candidates on it).
    """

    hosts: tuple[int, ...]
    local: tuple[int, ...]
    rails: int = 0
    nic_gpu: tuple[int, ...] = ()
    nic_plans: tuple[tuple[str, tuple[int, ...], tuple[int, ...], int], ...] = ()
    nic_twins: tuple[tuple[str, ...], ...] = ()
    intra: str = "nvlink"
    mesh: bool = False
    nvls: bool = False
    switch: tuple[str, ...] = ()
    device: str = ""
    link_class: str = ""
    cluster: Cluster | None = field(default=None, compare=False, repr=False)
    _groups: dict[tuple[int, ...], tuple[tuple[int, ...], ...]] = field(default_factory=dict, init=False,
                                                                        compare=False, repr=False)
    # what the collectives work out once per fabric (a channel's trees: collectives.nccl_tree.channel_trees)
    memo: dict[Any, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def nodes(self) -> int:
        return len(set(self.hosts))

    def groups(self, ranks: Sequence[int]) -> list[list[int]]:
        """``ranks`` grouped by server (servers in order of first appearance, ranks by local index); kept per
        ``ranks`` (a tuner and a build ask for the same ones many times)."""
        key = tuple(ranks)
        hit = self._groups.get(key)
        if hit is None:
            by_host: dict[int, list[int]] = {}
            for r in key:
                by_host.setdefault(self.hosts[r], []).append(r)
            hit = self._groups[key] = tuple(tuple(sorted(g, key=lambda r: self.local[r])) for g in by_host.values())
        return [list(g) for g in hit]

    def hw(self, a: int, b: int) -> str:
        """NCCL's hardware class of a hop: ``net`` between servers, else the intra-server class."""
        return "net" if self.hosts[a] != self.hosts[b] else self.intra

    def entry(self, c: int, size: int) -> int:
        """Position, in a server's group of ``size`` GPUs, where channel ``c`` enters (the GPU of its NIC)."""
        if self.rails:
            k = c % self.rails
            pos = self.nic_gpu[k] if k < len(self.nic_gpu) else k
            return pos % size
        return 0

    def default_channels(self, ranks: Sequence[int]) -> int:
        """NCCL's channel count for these ranks (module docstring)."""
        groups = self.groups(ranks)
        if len(groups) > 1:
            return max(1, min(self.rails or 1, MAX_CHANNELS))
        if self.mesh and len(ranks) > 2:
            return min(len(mesh_rings(len(ranks))), MAX_CHANNELS)
        return 1

    def rings(self, ranks: Sequence[int], channels: int) -> list[list[int]]:
        """One ring (an order of ``ranks``) per channel; beyond the distinct rings they repeat."""
        groups = self.groups(ranks)
        distinct = self.default_channels(ranks)
        planned = self._planned(groups) if self.nic_plans and len(groups) > 1 else None
        out = []
        for c in range(channels):
            k = c % distinct
            if planned is not None:
                out.append([r for i, (g, (e, x)) in enumerate(zip(groups, planned[k], strict=True))
                            for r in _through(g, e, x, up=i % 2 == 0)])
                continue
            if len(groups) == 1 and self.mesh and len(ranks) > 2:
                out.append([groups[0][i] for i in mesh_rings(len(ranks))[k]])
                continue
            order: list[int] = []
            for i, g in enumerate(groups):
                s = self.entry(k, len(g))
                if i % 2 == 0:  # enter at the GPU of NIC k, leave at its left neighbour ...
                    order += [g[(s + j) % len(g)] for j in range(len(g))]
                else:  # ... where the next server is entered, walking the other way round
                    order += [g[(s - 1 - j) % len(g)] for j in range(len(g))]
            out.append(order)
        return out

    def _planned(self, groups: list[list[int]]) -> list[list[tuple[int, int]]] | None:
        """Per channel of ``nic_plans``, where it enters and leaves each of ``groups`` (local indices, ``(e, x)``),
        or None where a group is not a whole server or the servers differ in size (then the rail rule's rings).

        A hop from one server to the next is a route, and of the NICs a GPU is equally near, the route's ECMP hash
        picks one per GPU pair: the pair decides the NIC. So each hop takes, of the pairs of an exit of the
        channel's plan and an entry (the plan's, then any GPU: a route relays through no GPU, so where the NIC's
        own GPUs cannot all be reached by it, NCCL's relays have no counterpart but a route through the host
        bridge): one that leaves and arrives by the channel's NIC or a twin of it (``nic_twins``: the same to NCCL;
        else by one at one end), of those one whose route leaves the most bandwidth, counting the hops placed
        before (NCCL's search puts no two channels on a link that holds one, ``followPath``), then one by the
        channel's NIC itself, then one into an entry of the plan, then the first in NCCL's order; channel by
        channel, the first server's entry (one of the plan's) the one whose ring does best."""
        size = Counter(self.hosts)
        if (any(len(g) != size[self.hosts[g[0]]] for g in groups) or len({len(g) for g in groups}) > 1
                or self.cluster is None):
            return None
        key = ("nic-rings", tuple(tuple(g) for g in groups))
        hit = self.memo.get(key)
        if hit is not None:
            return list(hit)
        cluster = self.cluster
        graph = cluster.graph
        names = [[cluster.ranks[r] for r in g] for g in groups]
        n = len(groups)
        cluster.prepare_routes({(names[i][x], names[(i + 1) % n][e]) for _, _, exits, _ in self.nic_plans
                                for i in range(n) for x in exits for e in range(len(names[(i + 1) % n]))})
        load: Counter[tuple[str, str]] = Counter()

        def score(a: str, b: str, twins: tuple[str, ...], extra: Counter[tuple[str, str]]) -> tuple[int, float, int]:
            route = cluster.route(a, b)
            left = min(graph.edges[e]["bandwidth"] / (load[e] + extra[e] + 1) for e in route) / 1e9
            on = [v.split(".", 1)[-1] for _, v in route if graph.nodes[v].get("kind") == "nic"]
            ends = on[:1] + on[-1:]
            return sum(v in twins for v in ends), round(left, 3), sum(v == twins[0] for v in ends)

        def pick(k: int) -> tuple[list[tuple[int, int]], Counter[tuple[str, str]]]:
            (nic, entries, exits, _), twins = self.nic_plans[k], self.nic_twins[k]
            best: tuple[tuple[int, float, int], list[tuple[int, int]], Counter[tuple[str, str]]] | None = None
            anywhere = [*entries, *(g for g in range(len(groups[0])) if g not in entries)]
            for first in entries:
                ends, used, worst, near, match, e = [], Counter[tuple[str, str]](), math.inf, 0, 0, first
                for i in range(n):
                    j = (i + 1) % n
                    options = [(x, e2) for x in exits if x != e or len(exits) == 1
                               for e2 in ([first] if j == 0 else anywhere)]
                    scored = [((*score(names[i][x], names[j][e2], (nic, *twins), used), e2 in entries), x, e2)
                              for x, e2 in options]
                    (t, got, m, _), x, e2 = max(scored, key=lambda o: o[0])
                    worst, near, match = min(worst, got), near + t, match + m
                    used.update(cluster.route(names[i][x], names[j][e2]))
                    ends.append((e, x))
                    e = e2
                if best is None or (near, worst, match) > best[0]:
                    best = ((near, worst, match), ends, used)
            assert best is not None
            return best[1], best[2]

        plans = []
        for k in range(len(self.nic_plans)):
            ends, used = pick(k)
            load.update(used)
            plans.append(ends)
        self.memo[key] = tuple(plans)
        return plans


@functools.cache
def mesh_rings(n: int) -> tuple[tuple[int, ...], ...]:
    """Rings over ``n`` fully connected GPUs that use pairwise distinct directed links.

    Where one exists (every ``n`` but 4 and 6: Tillson, "A Hamiltonian decomposition of K*_2m", 1980), the complete
    digraph split into ``n - 1`` Hamiltonian cycles, found by depth-first search for ``n <= 8`` (a fraction of a
    millisecond); otherwise one ring ``i -> i + s`` per step ``s`` coprime with ``n``.
    """
    if 2 < n <= _SEARCH_MAX and n not in (4, 6):
        found = _hamiltonian_decomposition(n)
        if found:
            return found
    return tuple(tuple((i * s) % n for i in range(n)) for s in range(1, n) if math.gcd(s, n) == 1) or ((0,),)


def _hamiltonian_decomposition(n: int) -> tuple[tuple[int, ...], ...]:
    used: set[tuple[int, int]] = set()
    cycles: list[tuple[int, ...]] = []

    def cycles_from(path: list[int]) -> Iterator[tuple[int, ...]]:
        if len(path) == n:
            if (path[-1], 0) not in used:
                yield tuple(path)
            return
        for v in range(n):
            if v not in path and (path[-1], v) not in used:
                yield from cycles_from([*path, v])

    def search() -> bool:
        if len(cycles) == n - 1:
            return True
        for cyc in cycles_from([0]):
            arcs = {(cyc[i], cyc[(i + 1) % n]) for i in range(n)}
            used.update(arcs)
            cycles.append(cyc)
            if search():
                return True
            used.difference_update(arcs)
            cycles.pop()
        return False

    return tuple(cycles) if search() else ()


def fabric_of(cluster: Cluster) -> Fabric:
    """The :class:`Fabric` of ``cluster``'s ranks, read off its graph (NIC nodes, link classes, switches): worked
    out once per cluster and kept on it (it refers to the cluster, so it goes with it), so that every point,
    collective and training layer on the cluster shares it and what its memo works out."""
    memo = cluster.owned("fabric")
    hit: Fabric | None = memo.get("fabric")
    if hit is None:
        hit = memo["fabric"] = _read_fabric(cluster)
    return hit


def _read_fabric(cluster: Cluster) -> Fabric:
    graph = cluster.graph
    host_index: dict[str, int] = {}
    hosts: list[int] = []
    local: list[int] = []
    count: dict[int, int] = {}
    for node in cluster.ranks:
        h = host_index.setdefault(cluster.host_of(node), len(host_index))
        hosts.append(h)
        local.append(count.get(h, 0))
        count[h] = count.get(h, 0) + 1
    first_host = cluster.host_of(cluster.ranks[0])
    gpus = [n for n in cluster.ranks if cluster.host_of(n) == first_host]
    nics = sorted((n for n, k in graph.nodes(data="kind") if k == "nic" and cluster.host_of(n) == first_host),
                  key=natural)
    nic_gpu: list[int] = []
    all_nics = nics
    if len(host_index) > 1:
        second = next(h for h in host_index if h != first_host)
        nics, nic_gpu = _rails(cluster, gpus, [n for n in cluster.ranks if cluster.host_of(n) == second], nics)
    classes = {graph.edges[u, v].get("cls", "") for u in gpus for v in graph.successors(u)
               if graph.nodes[v].get("kind") != "nic"}
    intra = "nvlink" if classes & set(NVLINK_CLASSES) else "pci"
    link_class = min(classes & set(NVLINK_CLASSES), default=min(classes, default=""))
    mesh = len(gpus) > 1 and all(graph.has_edge(a, b) for a in gpus for b in gpus if a != b)
    switch = []
    by_host: dict[str, list[str]] = {}
    for node in cluster.ranks:
        by_host.setdefault(cluster.host_of(node), []).append(node)
    for host in host_index:
        members = by_host[host]
        shared = set.intersection(*(set(graph.successors(g)) for g in members))
        sw = sorted(n for n in shared if graph.nodes[n].get("kind") == "switch")
        switch.append(sw[0] if sw and len(members) > 1 else "")
    device = cluster.specs[cluster.ranks[0]].name.lower()
    nvls = intra == "nvlink" and all(switch) and device.startswith(NVLS_DEVICES)
    plans, twins = ((), ()) if len(host_index) < 2 else nccl_plans(cluster, gpus, all_nics, bool(switch[0]), mesh,
                                                                     device)
    if plans and rail_rule_is_nccls(nics, plans, twins):
        plans, twins = (), ()
    if plans:  # GPUs unevenly spread over the NICs, and the rail rule misses NCCL's: NCCL's own channels
        nics, nic_gpu = [p[0] for p in plans], [p[1][0] for p in plans]
    return Fabric(tuple(hosts), tuple(local), rails=len(nics) if len(host_index) > 1 else 0,
                  nic_gpu=tuple(nic_gpu), nic_plans=plans, nic_twins=twins, intra=intra, mesh=mesh, nvls=nvls,
                  switch=tuple(switch), device=device, link_class=link_class, cluster=cluster)


def _rails(cluster: Cluster, gpus: list[str], peers: list[str], nics: list[str]) -> tuple[list[str], list[int]]:
    """The NICs of a server that channels run on, and where a channel on each enters the server (local GPU index):
    each GPU leaves the server by the NIC its route to its peer (the GPU of its local index on the next server)
    takes, its nearest (no route passes through a GPU; of equal latencies, the fewest host bridges); the NICs some
    GPU leaves by carry the channels, in name order; a channel on NIC ``k`` enters at a GPU that leaves by ``k``:
    of two neighbours ``j - 1, j`` that both do, ``j``, so that the ring, which leaves the server at ``j - 1``,
    goes on by the NIC it came in by. Where no route takes a NIC (GPUs on the fabric itself), every NIC, entered at
    the GPU it hangs off."""
    pairs = list(zip(gpus, peers, strict=False))
    cluster.prepare_routes(pairs)
    first = set(nics)
    leaves = [next((v for _, v in cluster.route(a, b) if v in first), None) for a, b in pairs]
    used = [nic for nic in nics if nic in leaves]
    if not used:
        graph = cluster.graph
        return nics, [next((gpus.index(v) for v in graph.successors(nic) if v in gpus), 0) for nic in nics]
    entries = []
    for nic in used:
        by = [j for j, v in enumerate(leaves) if v == nic]
        pair = [j for j in by if (j - 1) % len(leaves) != j and (j - 1) % len(leaves) in by]
        entries.append(pair[0] if pair else by[0])
    return used, entries


def _through(group: list[int], e: int, x: int, up: bool) -> list[int]:
    """``group`` (a server's ranks by local index) as one channel crosses it, entering at ``e`` and leaving at
    ``x``: upwards from ``e`` (``up``) or downwards, ``x`` kept for last, as the rail rule walks the servers (up on
    the even ones, from ``s`` round to ``s - 1``, down on the odd ones): on a mesh the direction decides which
    links the channels share, as on the presets."""
    n = len(group)
    step = 1 if up else -1
    return [group[e], *(group[(e + step * j) % n] for j in range(1, n) if (e + step * j) % n != x)] + (
        [group[x]] if x != e else [])


