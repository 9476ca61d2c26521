"""Routes as the hardware runs them (issue 39): an imported server's GPUs reach the fabric through their nearest NICs,
NCCL's channels spread over every NIC, and no route passes through a GPU (CUDA peer-to-peer without a direct NVLink
goes over PCIe and the host; a GPU forwards nothing)."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cluster.hostgraph import ImportOptions
from simulator.cluster.importers import import_topology
from simulator.cluster.routing import HOP_EPSILON, HOST_EPSILON, Router
from simulator.cluster.topology import Cluster, build_cluster, load_topology
from simulator.collectives import fabric_of
from simulator.collectives.standalone import collective_schedule
from simulator.engine.core import simulate
from simulator.errors import InputError
from simulator.support.yaml_lines import load_yaml_text

FIX = Path(__file__).parent / "fixtures" / "topo"
GiB = 1 << 30


def nvsmi(n_gpus: int, bonds: dict[tuple[int, int], int], nic_gpus: list[list[int]], numa: list[int]) -> str:
    """An ``nvidia-smi topo -m`` matrix: GPU pairs ``NV{k}`` where ``bonds`` says (else ``NODE`` on one NUMA node,
    ``SYS`` across), NIC ``k`` ``PIX`` with the GPUs ``nic_gpus[k]`` (on its NUMA node), GPU ``j`` on NUMA node
    ``numa[j]``."""
    devs = [f"GPU{j}" for j in range(n_gpus)] + [f"NIC{k}" for k in range(len(nic_gpus))]

    def node(d: str) -> int:
        i = int(d[3:])
        return numa[i] if d.startswith("GPU") else numa[nic_gpus[i][0]]

    def switch(d: str) -> object:
        i = int(d[3:])
        if d.startswith("NIC"):
            return i
        return next((k for k, gs in enumerate(nic_gpus) if i in gs), ("gpu", i))

    def cell(a: str, b: str) -> str:
        if a == b:
            return "X"
        if a.startswith("GPU") and b.startswith("GPU"):
            k = bonds.get((min(int(a[3:]), int(b[3:])), max(int(a[3:]), int(b[3:]))), 0)
            if k:
                return f"NV{k}"
        if switch(a) == switch(b):
            return "PIX"
        return "NODE" if node(a) == node(b) else "SYS"

    lines = ["\t" + "\t".join(devs) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for a in devs:
        extra = [f"{node(a) * 48}-{node(a) * 48 + 47}", str(node(a)), "N/A"] if a.startswith("GPU") else []
        lines.append(a + "\t" + "\t".join([cell(a, b) for b in devs] + extra))
    lines += ["", "Legend:", "", "  X    = Self", "", "NIC Legend:", ""]
    lines += [f"  NIC{k}: mlx5_{k}" for k in range(len(nic_gpus))]
    return "\n".join(lines) + "\n"


def imported(tmp_path: Path, text: str, **kw: object) -> Cluster:
    src = tmp_path / "topo.txt"
    src.write_text(text)
    yaml_text = import_topology([src], **kw)  # type: ignore[arg-type]
    return build_cluster(load_yaml_text(yaml_text, "<imported>"), "<imported>")


def h100_server(nics: int) -> str:
    """8 x H100 on NVSwitch (NV18 every pair), ``nics`` NICs each PIX with ``8 / nics`` neighbouring GPUs, two
    sockets."""
    per = 8 // nics
    return nvsmi(8, {(a, b): 18 for a, b in itertools.combinations(range(8), 2)},
                 [list(range(k * per, (k + 1) * per)) for k in range(nics)], [j // 4 for j in range(8)])


def allreduce_s(cluster: Cluster, gib: float = 1.0) -> float:
    sched, _ = collective_schedule(cluster, fabric_of(cluster), "allreduce", int(gib * GiB) // 2, 2, "bf16", "ring")
    return simulate(sched, cluster).makespan


def nics_by_channel(cluster: Cluster) -> Counter[tuple[str, str]]:
    """How many channels of a 2-server ring allreduce cross each (NIC, direction) of the first server."""
    fabric = fabric_of(cluster)
    ranks = list(range(len(cluster.ranks)))
    used: Counter[tuple[str, str]] = Counter()
    for ring in fabric.rings(ranks, fabric.default_channels(ranks)):
        for a, b in zip(ring, [*ring[1:], ring[0]], strict=True):
            if fabric.hosts[a] != fabric.hosts[b]:
                src, dst = cluster.ranks[a], cluster.ranks[b]
                nic = next(v for _, v in cluster.route(src, dst) if cluster.graph.nodes[v]["kind"] == "nic"
                           and cluster.host_of(v) == "n0")
                used[(nic, "out" if fabric.hosts[a] == 0 else "in")] += 1
    return used


@pytest.mark.parametrize("nics", [2, 4, 8])
def test_an_imported_server_uses_every_nic_and_runs_as_the_preset(tmp_path, nics):
    """8 x H100, ``nics`` NICs each on a PCIe switch with its GPUs, two servers: every NIC carries one channel out
    and one in, and a 1 GiB ring allreduce takes what the dgx-h100 preset with as many NICs takes (within 3 %; it
    was 4x slower on 4 NICs: two of them carried every channel)."""
    c = imported(tmp_path, h100_server(nics), nodes=2)
    used = nics_by_channel(c)
    assert used == Counter({(f"n0.nic{k}", way): 1 for k in range(nics) for way in ("out", "in")})
    preset = load_topology("dgx-h100", {"nodes": 2, "nics_per_node": nics})
    assert nics_by_channel(preset) == used
    assert allreduce_s(c) == pytest.approx(allreduce_s(preset), rel=0.03)


def test_a_preset_with_fewer_nics_than_gpus_shares_pcie_switches():
    """``nics_per_node: 4`` on 8 GPUs: NIC k and GPUs 2k, 2k+1 share PCIe switch ``pcie{k}`` (no route passes
    through a GPU), and a channel on NIC k enters at GPU 2k+1 and leaves at 2k, both on NIC k."""
    c = load_topology("dgx-h100", {"nodes": 2, "nics_per_node": 4})
    assert sorted(c.graph.successors("n0.pcie1")) == ["n0.gpu2", "n0.gpu3", "n0.nic1"]
    assert fabric_of(c).nic_gpu == (1, 3, 5, 7)
    assert [v for _, v in c.route("n0.gpu3", "n1.gpu3")] == ["n0.pcie1", "n0.nic1", "rail1", "n1.nic1", "n1.pcie1",
                                                              "n1.gpu3"]


def test_a_nic_behind_the_host_bridge_carries_no_channel():
    """The A100 dump of SimAI (5 x 200 Gb/s: four NICs behind the GPUs' PCIe switches, one behind the CPU's host
    bridge): each GPU leaves by a NIC on its own PCIe tree (``PXB`` before ``PHB``, as NCCL ranks paths), so the
    four carry a channel each, in and out, and the allreduce runs as the dgx-a100 preset with four NICs."""
    text = import_topology([FIX / "a100-8gpu-4nic_simai.xml"], nodes=2)
    c = build_cluster(load_yaml_text(text, "<xml>"), "<xml>")
    used = nics_by_channel(c)
    assert sorted({nic for nic, _ in used}) == ["n0.nic1", "n0.nic2", "n0.nic3", "n0.nic4"]
    assert set(used.values()) == {1}
    preset = load_topology("dgx-a100", {"nodes": 2, "nics_per_node": 4})
    assert allreduce_s(c, 0.25) == pytest.approx(allreduce_s(preset, 0.25), rel=0.03)


def test_a_partial_nvlink_mesh_routes_unlinked_gpus_over_pcie(tmp_path):
    """4 GPUs, NVLink 0-1, 1-3, 0-2, 2-3 only: GPU0 -> GPU3 goes over PCIe and the sockets' link, not GPU0 -> GPU1
    -> GPU3 over NVLink (it did); linked pairs take their NVLink."""
    bonds = {(0, 1): 4, (1, 3): 4, (0, 2): 4, (2, 3): 4}
    c = imported(tmp_path, nvsmi(4, bonds, [[0], [3]], [0, 0, 1, 1]), opts=ImportOptions(device="h100-sxm"))
    route = c.route("n0.gpu0", "n0.gpu3")
    assert [c.graph.edges[e]["cls"] for e in route] == ["pcie", "pcie", "smp", "pcie", "pcie"]
    assert [v for _, v in route][-1] == "n0.gpu3"
    assert [c.graph.edges[e]["cls"] for e in c.route("n0.gpu0", "n0.gpu1")] == ["nvlink"]


def test_gpus_joined_only_through_a_gpu_are_refused():
    """A line of GPUs with nothing else: the ends reach each other only through the middle GPU, which forwards
    nothing: a located error when the topology loads."""
    raw = {"name": "line", "nodes": [{"name": f"g{i}", "kind": "gpu", "device": "h100-sxm"} for i in range(3)],
           "links": [{"a": "g0", "b": "g1", "bandwidth": "10 GB/s"}, {"a": "g1", "b": "g2", "bandwidth": "10 GB/s"}]}
    with pytest.raises(InputError, match=r"device g0 is unreachable from g2 \(a route may not pass through a GPU\)"):
        build_cluster(raw, "t.yaml")
    raw["nodes"].append({"name": "host", "kind": "cpu"})
    raw["links"] += [{"a": f"g{i}", "b": "host", "bandwidth": "1 GB/s"} for i in range(3)]
    c = build_cluster(raw, "t.yaml")
    assert [v for _, v in c.route("g0", "g2")] == ["host", "g2"]


def _interior_gpus(cluster: Cluster, route: tuple[tuple[str, str], ...]) -> list[str]:
    return [v for _, v in route[:-1] if cluster.graph.nodes[v]["kind"] == "gpu"]


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_route_of_an_imported_matrix_passes_through_a_gpu(tmp_path, data):
    """Random nvidia-smi matrices (2-8 GPUs, any NVLink bonds, 1-4 NICs on random GPUs, one or two sockets), one or
    two servers: no route between GPUs passes through a GPU, GPUs bonded by NVLink take that link, and every route
    is the whole-graph search's."""
    n = data.draw(st.integers(2, 8))
    pairs = list(itertools.combinations(range(n), 2))
    linked = data.draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs)))
    bonds = {p: data.draw(st.integers(1, 18)) for p in linked}
    if len(set(bonds.values())) == 1 and len(bonds) == len(pairs):  # every pair bonded alike: an NVSwitch
        bonds[pairs[0]] = bonds[pairs[0]] % 18 + 1
    n_nics = data.draw(st.integers(1, 4))
    nic_gpus = [sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=2))) for _ in range(n_nics)]
    taken: set[int] = set()
    for k, gs in enumerate(nic_gpus):  # a GPU on one NIC's PCIe switch at most
        nic_gpus[k] = [g for g in gs if g not in taken] or [gs[0]]
        taken.update(nic_gpus[k])
    sockets = data.draw(st.integers(1, 2))
    numa = [j * sockets // n for j in range(n)]
    nodes = data.draw(st.integers(1, 2))
    c = imported(tmp_path, nvsmi(n, bonds, nic_gpus, numa), nodes=nodes, opts=ImportOptions(device="h100-sxm"))
    router = Router(c.graph)
    ends = [(a, b) for a in c.ranks for b in c.ranks if a != b]
    router.prepare(ends)
    for a, b in ends:
        route = router.route(a, b)
        assert route == router.plain_route(a, b)
        assert not _interior_gpus(c, route)
        ia, ib = int(a.rsplit("gpu", 1)[1]), int(b.rsplit("gpu", 1)[1])
        if c.host_of(a) == c.host_of(b) and (min(ia, ib), max(ia, ib)) in bonds:
            assert route == ((a, b),)


def _random_graph(rng: np.random.Generator) -> nx.DiGraph:
    """Servers ``h{i}`` of GPUs, switches and CPUs joined at random and to fabric switches, latencies from a small
    set (many equal-cost paths)."""
    g = nx.DiGraph()
    names: list[str] = []
    for i in range(int(rng.integers(2, 5))):
        for j in range(int(rng.integers(2, 5))):
            names.append(f"h{i}.x{j}")
            g.add_node(names[-1], kind=str(rng.choice(["gpu", "gpu", "switch", "cpu"])))
    for k in range(3):
        names.append(f"sw{k}")
        g.add_node(names[-1], kind="switch")
    for _ in range(3 * len(names)):
        u, v = rng.choice(len(names), size=2, replace=False)
        lat = float(rng.choice([1e-7, 2e-7, 3e-7]))
        g.add_edge(names[u], names[v], latency=lat)
        g.add_edge(names[v], names[u], latency=lat)
    return g


@pytest.mark.parametrize("seed", range(8))
def test_routes_avoid_gpus_on_random_graphs(seed):
    """Random graphs with GPUs among their nodes: a pair has a route iff a path joins it whose interior holds no
    GPU; the route is the shortest such path (networkx over the graph less the other GPUs, each link weighing its
    latency, a hop's epsilon and, into a CPU, the host's), passes through no GPU, and is the whole-graph search's,
    routed in batches."""
    g = _random_graph(np.random.default_rng(400 + seed))
    router = Router(g)
    gpus = {v for v, k in g.nodes(data="kind") if k == "gpu"}

    def weight(u: str, v: str, d: dict[str, float]) -> float:
        return d["latency"] + HOP_EPSILON + (HOST_EPSILON if g.nodes[v]["kind"] == "cpu" else 0.0)

    routable = []
    for a, b in itertools.permutations(sorted(g), 2):
        sub = g.subgraph(set(g) - (gpus - {a, b}))
        try:
            best = nx.dijkstra_path_length(sub, a, b, weight=weight)
        except nx.NetworkXNoPath:
            with pytest.raises(KeyError, match="no route"):
                router.plain_route(a, b)
            continue
        routable.append((a, b, best))
    for k in range(2):
        router.prepare([(a, b) for a, b, _ in routable[k::2]])
    for a, b, best in routable:
        route = router.route(a, b)
        assert route == router.plain_route(a, b)
        assert not [v for _, v in route[:-1] if v in gpus]
        assert sum(weight(u, v, g.edges[u, v]) for u, v in route) == pytest.approx(best, rel=1e-12, abs=0)


@pytest.mark.parametrize("seed", range(3))
def test_routes_avoid_gpus_behind_wide_switches(seed):
    """Servers of GPUs, switches and CPUs on three switches wider than the router's vector threshold (the
    successors it keeps per switch), the switches' own links longer than a detour through a server (which a GPU
    may not give): every route is the whole-graph search's and passes through no GPU; where a
    server's GPU is a route's only way out, the pair has no route."""
    rng = np.random.default_rng(500 + seed)
    g = nx.DiGraph()
    switches = [f"sw{k}" for k in range(3)]
    g.add_nodes_from(switches, kind="switch")
    lats = [1e-7, 2e-7, 3e-7]
    for i in range(48):
        members = [f"h{i}.x{j}" for j in range(int(rng.integers(1, 4)))]
        for m in members:
            g.add_node(m, kind=str(rng.choice(["gpu", "gpu", "switch", "cpu"])))
        for a, b in itertools.pairwise(members):
            lat = float(rng.choice(lats))
            g.add_edge(a, b, latency=lat)
            g.add_edge(b, a, latency=lat)
        for m in members:
            for s in rng.choice(switches, size=int(rng.integers(1, 3)), replace=False).tolist():
                lat = float(rng.choice(lats))
                g.add_edge(m, s, latency=lat)
                g.add_edge(s, m, latency=lat)
    for a, b in [("sw0", "sw1"), ("sw1", "sw2"), ("sw0", "sw2")]:  # longer than a detour through a server
        g.add_edge(a, b, latency=5e-7)
        g.add_edge(b, a, latency=5e-7)
    assert max(d for _, d in g.out_degree(switches)) > 32
    router = Router(g)
    gpus = {v for v, k in g.nodes(data="kind") if k == "gpu"}
    nodes = sorted(g)
    pairs = [(nodes[a], nodes[b]) for a, b in rng.integers(0, len(nodes), size=(600, 2)).tolist() if a != b]
    routable = []
    for a, b in pairs:
        try:
            routable.append((a, b, router.plain_route(a, b)))
        except KeyError:
            sub = g.subgraph(set(g) - (gpus - {a, b}))
            assert not nx.has_path(sub, a, b)
    for k in range(3):
        router.prepare([(a, b) for a, b, _ in routable[k::3]])
    for a, b, plain in routable:
        assert router.route(a, b) == plain
        assert not [v for _, v in plain[:-1] if v in gpus]
