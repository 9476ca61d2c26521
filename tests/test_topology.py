"""Presets (H200, B200 and GB200 NVL72 among them), device specs with their cited efficiencies and per-field
overrides, the parametric builder, routing and topology validation."""

from __future__ import annotations

import functools
import hashlib
import itertools

import networkx as nx
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cluster import routing
from simulator.cluster.routecore import blake2b_8
from simulator.cluster.routing import Router
from simulator.cluster.summary import bisection_bandwidth, summarize
from simulator.cluster.topology import device_library, list_presets, load_topology, override_devices
from simulator.errors import InputError
from simulator.support.paths import TOPOLOGY_DIR


def test_presets_listed():
    assert {"dgx-h100", "dgx-a100", "mi300x", "rtx4090-pcie", "cluster"} <= set(list_presets())


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_dgx_h100_shape(nodes):
    c = load_topology("dgx-h100", {"nodes": nodes})
    assert len(c.ranks) == 8 * nodes and c.num_hosts == nodes
    assert c.ranks[:2] == ("n0.gpu0", "n0.gpu1")
    spec = c.specs["n0.gpu0"]
    assert spec.peak_flops["bf16"] == 989.4e12 and spec.mem_bw_Bps == 3.35e12 and spec.mem_bytes == 80e9
    intra = c.route("n0.gpu0", "n0.gpu5")
    assert [c.graph.edges[e]["cls"] for e in intra] == ["nvlink", "nvlink"]
    assert c.route_bandwidth(intra) == 450e9
    assert c.route_latency(intra) == pytest.approx(936e-9, rel=1e-12)
    if nodes > 1:
        inter = c.route("n0.gpu3", "n1.gpu3")  # rail-aligned: PCIe, NIC, rail switch, NIC, PCIe
        assert c.route_bandwidth(inter) == 50e9
        assert len(inter) == 4


def test_dgx_a100_and_mi300x_and_rtx4090():
    a100 = load_topology("dgx-a100", {"nodes": 2})
    assert a100.route_bandwidth(a100.route("n0.gpu0", "n0.gpu1")) == 300e9
    assert a100.route_bandwidth(a100.route("n0.gpu0", "n1.gpu0")) == 25e9
    mi = load_topology("mi300x")
    assert len(mi.route("n0.gpu0", "n0.gpu7")) == 1  # fully connected
    assert mi.route_bandwidth(mi.route("n0.gpu0", "n0.gpu7")) == 64e9
    rtx = load_topology("rtx4090-pcie", {"gpus": 4})
    path = rtx.route("n0.gpu0", "n0.gpu3")
    assert [v for _, v in path] == ["n0.host", "n0.gpu3"]  # staged through host memory
    assert rtx.specs["n0.gpu0"].mem_bytes == 24e9


def test_fat_tree_oversubscription_halves_bisection():
    full = load_topology("cluster", {"nodes": 8, "gpus_per_node": 1, "nodes_per_leaf": 2, "spines": 2})
    half = load_topology("cluster", {"nodes": 8, "gpus_per_node": 1, "nodes_per_leaf": 2, "spines": 2,
                                     "oversubscription": 2})
    assert bisection_bandwidth(full) == pytest.approx(4 * 50e9)
    assert bisection_bandwidth(half) == pytest.approx(2 * 50e9)


def test_single_switch_and_rail_fabrics():
    ss = load_topology("cluster", {"nodes": 3, "gpus_per_node": 2, "inter": "single-switch"})
    assert [v for _, v in ss.route("n0.gpu0", "n2.gpu0")][1:3] == ["fabric", "n2.nic0"]
    rail = load_topology("cluster", {"nodes": 3, "gpus_per_node": 2, "inter": "rail"})
    assert "rail1" in {v for _, v in rail.route("n0.gpu1", "n2.gpu1")}


def test_summary_mentions_classes_and_bisection():
    text = summarize(load_topology("dgx-h100", {"nodes": 2}))
    assert "16 GPUs on 2 node(s)" in text and "nvlink" in text and "bisection bandwidth" in text
    assert "400 GB/s" in text  # 8 rails x 50 GB/s between the two halves


def test_unknown_preset_lists_presets():
    with pytest.raises(InputError, match="unknown topology preset 'nope'; presets: cluster"):
        load_topology("nope")


def test_bad_param_names_field():
    with pytest.raises(InputError) as exc:
        load_topology("dgx-h100", {"nodes": -1})
    assert exc.value.field == "topology_params.nodes"
    with pytest.raises(InputError, match="unknown parameter"):
        load_topology("dgx-h100", {"gpus": 2})


@pytest.mark.parametrize(("preset", "params"), [("dgx-h100", {"nodes": 6}), ("gb200-nvl72", {"nodes": 2}),
                                                ("rtx4090-pcie", {"nodes": 3}), ("mi300x", {"nodes": 3}),
                                                ("cluster", {"nodes": 12, "gpus_per_node": 2, "nodes_per_leaf": 2,
                                                             "spines": 3, "oversubscription": 2})])
def test_routes_match_the_whole_graph_search(preset, params):
    """Every shortcut the router takes (bounded search near the destination, distances through a server's entry
    links) gives the route of a Dijkstra over the whole graph, ECMP picks included."""
    cluster = load_topology(preset, params)
    router = Router(cluster.graph)
    nodes = [*cluster.ranks, *(n for n, k in cluster.graph.nodes(data="kind") if k == "switch")]
    pairs = [(a, b) for a in nodes for b in nodes if a != b]
    pairs = _routable(router, [pairs[i] for i in np.random.default_rng(0).permutation(len(pairs))[:1500]])
    router.prepare(pairs)
    assert [router.route(a, b) for a, b in pairs] == [router.plain_route(a, b) for a, b in pairs]


def _routable(router: Router, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The pairs with a route (none passes through a GPU: another server's NVSwitch is out of a GPU's reach)."""
    out = []
    for a, b in pairs:
        try:
            router.plain_route(a, b)
        except KeyError:
            continue
        out.append((a, b))
    return out


def _random_grouped_graph(rng: np.random.Generator) -> tuple[nx.DiGraph, list[tuple[str, str]]]:
    """Groups ``h.x`` joined to each other and to ``sw`` switches, latencies from a small set (many equal-cost
    paths), and every pair of nodes with a path."""
    g = nx.DiGraph()
    names = [f"h{i}.x{j}" for i in range(6) for j in range(int(rng.integers(1, 5)))] + [f"sw{k}" for k in range(3)]
    for _ in range(4 * len(names)):
        u, v = rng.choice(len(names), size=2, replace=False)
        lat = float(rng.choice([1e-7, 2e-7, 3e-7]))
        g.add_edge(names[u], names[v], latency=lat)
        g.add_edge(names[v], names[u], latency=lat)
    reach = dict(nx.all_pairs_shortest_path_length(g))
    return g, [(a, b) for a in g for b in g if a != b and b in reach[a]]


@pytest.mark.parametrize("seed", range(6))
def test_routes_match_on_random_grouped_graphs(seed):
    """Random graphs of ``h.x`` groups joined to each other and to ``sw`` switches, with latencies from a small
    set (many equal-cost paths): the router's routes are the whole-graph search's."""
    g, pairs = _random_grouped_graph(np.random.default_rng(seed))
    router = Router(g)
    router.prepare(pairs)
    assert [router.route(a, b) for a, b in pairs] == [router.plain_route(a, b) for a, b in pairs]


@pytest.mark.parametrize("seed", range(6))
def test_routes_match_when_a_destination_comes_back_in_later_batches(seed):
    """The same random grouped graphs, their pairs prepared in three batches that each hold every destination
    with other sources (a destination's bounded search or composed distances, and its walks' successors, are kept
    from one batch to the next; searched again where a later batch needs a larger bound): the whole-graph search's
    routes."""
    rng = np.random.default_rng(50 + seed)
    g, pairs = _random_grouped_graph(rng)
    router = Router(g)
    order = rng.permutation(len(pairs))
    for k in range(3):
        router.prepare([pairs[i] for i in order[k::3]])
    assert [router.route(a, b) for a, b in pairs] == [router.plain_route(a, b) for a, b in pairs]


_SIZES = {"dgx-h100": [2, 9, 40], "mi300x": [2, 17], "gb200-nvl72": [1, 3],
          "cluster": [4, 12, 24]}  # cluster: 2 GPUs per node, 2 nodes per leaf, 3 spines


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_routes_match_on_random_pairs_in_batches(data):
    """Random pairs of a preset at several sizes, prepared in a few batches (the kept distances, columns and
    minima carry from one batch to the next, as in a collective's build): every route is the whole-graph
    search's, hop for hop."""
    preset = data.draw(st.sampled_from(sorted(_SIZES)))
    nodes = data.draw(st.sampled_from(_SIZES[preset]))
    params: dict[str, object] = {"nodes": nodes}
    if preset == "cluster":
        params.update(gpus_per_node=2, nodes_per_leaf=2, spines=3)
    cluster = _cached_cluster(preset, tuple(sorted(params.items())))
    router = Router(cluster.graph)
    names = [*cluster.ranks, *(n for n, k in cluster.graph.nodes(data="kind") if k == "switch")]
    index = st.integers(0, len(names) - 1)
    pairs = [(names[a], names[b]) for a, b in data.draw(st.lists(st.tuples(index, index), min_size=1, max_size=60))]
    pairs = _routable(router, pairs)
    for batch in (pairs[: len(pairs) // 3], pairs[len(pairs) // 3:]):
        router.prepare(batch)
    assert [router.route(a, b) for a, b in pairs] == [router.plain_route(a, b) for a, b in pairs]


@functools.cache
def _cached_cluster(preset, params):
    return load_topology(preset, dict(params))


@pytest.mark.parametrize("seed", range(4))
def test_routes_match_behind_wide_switches(seed):
    """Random servers (``h.x`` groups) on switches wider than the router's vector threshold, latencies from a
    small set: the minima kept per switch and entry constants give the whole-graph search's routes."""
    rng = np.random.default_rng(100 + seed)
    g = nx.DiGraph()
    switches = [f"sw{k}" for k in range(3)]
    lats = [1e-7, 2e-7, 3e-7]
    for i in range(48):
        members = [f"h{i}.x{j}" for j in range(int(rng.integers(1, 4)))]
        for a, b in itertools.pairwise(members):
            lat = float(rng.choice(lats))
            g.add_edge(a, b, latency=lat)
            g.add_edge(b, a, latency=lat)
        for m in members:
            for s in rng.choice(switches, size=int(rng.integers(1, 3)), replace=False).tolist():
                lat = float(rng.choice(lats))
                g.add_edge(m, s, latency=lat)
                g.add_edge(s, m, latency=lat)
    for a, b in [("sw0", "sw1"), ("sw1", "sw2"), ("sw0", "sw2")]:
        g.add_edge(a, b, latency=1e-7)
        g.add_edge(b, a, latency=1e-7)
    router = Router(g)
    nodes = sorted(g)
    pairs = [(nodes[a], nodes[b]) for a, b in rng.integers(0, len(nodes), size=(600, 2)).tolist() if a != b]
    for k in range(3):
        router.prepare(pairs[k::3])
    assert [router.route(a, b) for a, b in pairs] == [router.plain_route(a, b) for a, b in pairs]


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=400))
def test_the_compiled_ecmp_hash_is_hashlibs_blake2b(data):
    """The compiled walks pick among equal-cost successors by BLAKE2b of ``src|dst|hop`` computed in numba: the
    same 8-byte digest as hashlib's, over one block and many (names of any length)."""
    buf = np.frombuffer(data + b"\0", dtype=np.uint8)
    assert int(blake2b_8(buf, len(data))) == int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@pytest.mark.parametrize("seed", range(3))
def test_routes_asked_one_at_a_time_between_batches(seed):
    """Pairs routed one at a time (``route``) between batches (``prepare``) and read back as arrays (``paths``,
    same-node pairs and repeats among them): each is the whole-graph search's route, its link ids those of its
    edges in the graph's order, its latency ``route_latency``'s float."""
    rng = np.random.default_rng(200 + seed)
    g, pairs = _random_grouped_graph(rng)
    router = Router(g)
    order = rng.permutation(len(pairs))
    for k, i in enumerate(order.tolist()):
        if k % 7 == 0:
            router.prepare([pairs[j] for j in order[k:k + 5].tolist()])
        assert router.route(*pairs[i]) == router.plain_route(*pairs[i])
    asked = [pairs[i] for i in order[:40].tolist()] + [(pairs[0][0], pairs[0][0])] + [pairs[order[0]]]
    starts, ids, latency = router.paths(asked)
    edges = list(g.edges)
    lat = dict(((u, v), w) for u, v, w in g.edges(data="latency"))
    for k, (a, b) in enumerate(asked):
        route = router.plain_route(a, b)
        assert [edges[e] for e in ids[starts[k]:starts[k + 1]].tolist()] == list(route)
        assert latency[k] == sum(map(lat.__getitem__, route))


def test_a_large_batch_is_routed_in_parts_cut_between_destinations(monkeypatch):
    """A batch is routed a part at a time (back in Python between parts, where an interrupt lands), each part
    holding every source of its destinations: with parts of a few pairs, the same routes as the whole-graph
    search's."""
    monkeypatch.setattr(routing, "_PART", 7)
    g, pairs = _random_grouped_graph(np.random.default_rng(300))
    router = Router(g)
    router.prepare(pairs)
    assert [router.route(a, b) for a, b in pairs] == [router.plain_route(a, b) for a, b in pairs]


@pytest.mark.parametrize(("preset", "gpus", "device", "mem", "intra_Bps"), [
    ("hgx-h200", 8, "h200-sxm", 141e9, 450e9),
    ("hgx-b200", 8, "b200", 180e9, 900e9),
    ("gb200-nvl72", 72, "gb200", 186e9, 900e9),
])
def test_new_presets(preset, gpus, device, mem, intra_Bps):
    c = load_topology(preset, {"nodes": 2})
    assert len(c.ranks) == 2 * gpus and c.num_hosts == 2
    spec = c.specs["n0.gpu0"]
    assert spec.name == device and spec.mem_bytes == mem
    assert c.route_bandwidth(c.route("n0.gpu0", f"n0.gpu{gpus - 1}")) == intra_Bps  # one NVLink domain per node
    assert c.route_bandwidth(c.route("n0.gpu0", "n1.gpu0")) == 50e9


def test_every_device_constant_and_efficiency_has_a_comment():
    """Each device spec in devices.yaml is preceded by a comment citing its source; efficiencies below 1 too."""
    lines = (TOPOLOGY_DIR / "devices.yaml").read_text().splitlines()
    specs = device_library()
    for name, spec in specs.items():
        start = lines.index(f"  {name}:")
        assert lines[start + 1].strip().startswith("#"), name
        block = "\n".join(lines[start: start + 14])
        if spec.eff_mem < 1 or spec.eff_flops < 1:
            assert "triad" in block or "MAMF" in block, name
    assert specs["h100-sxm"].eff_mem == 0.89 and specs["h100-sxm"].eff_flops == 0.80
    assert yaml.safe_load((TOPOLOGY_DIR / "devices.yaml").read_text())["devices"]["rtx4090"].get("eff_mem") is None


def test_override_devices_replaces_only_named_fields():
    c = override_devices(load_topology("dgx-h100"), {"h100-sxm": {"eff_flops": 0.5}})
    assert c.specs["n0.gpu3"].eff_flops == 0.5 and c.specs["n0.gpu3"].eff_mem == 0.89
    with pytest.raises(InputError, match="its devices: h100-sxm"):
        override_devices(c, {"mi300x": {"eff_mem": 0.5}})


def test_the_device_library_is_read_once_and_handed_out_as_a_new_dict():
    """A sweep builds a cluster per point: devices.yaml is parsed once (per version of the file), and each caller
    gets its own dict (build_cluster adds a topology's own devices to it)."""
    first = device_library()
    first["mine"] = first["h100-sxm"]
    again = device_library()
    assert "mine" not in again and again["h100-sxm"] is first["h100-sxm"]


def _unreachable_pairs(graph: nx.DiGraph) -> list[tuple[str, str]]:
    """The definition, pair by pair: device ``a`` reaches device ``b`` over a direct link, or from a successor of
    ``a`` to a predecessor of ``b`` (either may be ``a`` or ``b`` itself where it is no GPU) through nodes that are
    not GPUs. (b, a) for every device b that some device a does not reach, in node order."""
    kinds = dict(graph.nodes(data="kind"))
    devices = [n for n, k in kinds.items() if k in ("gpu", "cpu")]
    inner = graph.subgraph([n for n, k in kinds.items() if k != "gpu"])
    out = []
    for b in devices:
        for a in devices:
            if a == b or graph.has_edge(a, b):
                continue
            starts = [x for x in (a, *graph.successors(a)) if x in inner]
            stops = {x for x in (b, *graph.predecessors(b)) if x in inner}
            if not any(stops & ({s} | nx.descendants(inner, s)) for s in starts):
                out.append((b, a))
    return out


@settings(max_examples=300, deadline=None)
@given(kinds=st.lists(st.sampled_from(["gpu", "gpu", "cpu", "switch", "nic"]), min_size=1, max_size=12),
       data=st.data())
def test_reachability_check_is_its_definition(kinds, data):
    """The topology check (over arrays: components, each device's pairs) refuses exactly the graphs where some
    device does not reach another as routes may go, naming the first such device and the first that misses it."""
    from simulator.cluster.topology import _check_reachable

    n = len(kinds)
    graph = nx.DiGraph()
    graph.add_nodes_from((f"x{i}", {"kind": k}) for i, k in enumerate(kinds))
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=4 * n))
    graph.add_edges_from((f"x{a}", f"x{b}") for a, b in pairs if a != b)
    missing = _unreachable_pairs(graph)
    if not missing:
        _check_reachable(graph, lambda path, err: err)
        return
    b, a = missing[0]
    with pytest.raises(InputError, match=rf"^device {b} is unreachable from {a} \("):
        _check_reachable(graph, lambda path, err: err)
