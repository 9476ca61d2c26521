"""NCCL's NICs on imported servers whose GPUs are unevenly spread over their NICs (issue 39, item 6): a GPU with two
NICs on its PCIe switch, GPUs with none, every NIC behind the host bridge of a VM. The fabric assigns channels to
NICs as NCCL does (``src/graph/topo.cc`` ``ncclTopoGetLocalNet``, ``src/graph/paths.cc`` PXN, ``src/graph/search.cc``
ring search: :class:`simulator.collectives.nccl_nets._NcclNets`) and each ring crosses between servers by a GPU pair
whose route takes that NIC (or its twin behind the same switch)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from simulator.algorithms.prefill import build_prefill
from simulator.cluster.hostgraph import ImportOptions
from simulator.cluster.importers import import_topology
from simulator.cluster.nic_affinity import PXN as _PXN
from simulator.cluster.nic_affinity import home_nics, natural
from simulator.cluster.nic_affinity import mirror_bits as _mirror_bits
from simulator.cluster.routing import Router
from simulator.cluster.topology import Cluster, build_cluster, load_topology
from simulator.collectives import fabric_of
from simulator.collectives.nccl_nets import _NcclNets
from simulator.collectives.standalone import collective_schedule
from simulator.engine.core import simulate
from simulator.run.prepared import layout_of
from simulator.support.yaml_lines import load_yaml_text
from simulator.workloads.prefill_shape import PrefillShape

FIX = Path(__file__).parent / "fixtures" / "topo"
GiB = 1 << 30


def imported(name: str, opts: ImportOptions | None = None) -> Cluster:
    text = import_topology([FIX / name], nodes=2, opts=opts)
    return build_cluster(load_yaml_text(text, name), name)


@pytest.fixture(scope="module")
def h20() -> Cluster:
    return imported("h20-8gpu-8nic_sglang-31046.txt")


@pytest.fixture(scope="module")
def a100() -> Cluster:
    return imported("a100-8gpu-8nic_deepep-13.txt")


@pytest.fixture(scope="module")
def mi300x() -> Cluster:
    return imported("mi300x-8gpu-8nic-vm_rccl.xml")


def crossings(cluster: Cluster) -> Counter[tuple[str, str, str]]:
    """(server, NIC, ``out``/``in``) -> channels of a 2-server ring allreduce that leave or enter by it."""
    fabric = fabric_of(cluster)
    ranks = list(range(len(cluster.ranks)))
    used: Counter[tuple[str, str, str]] = Counter()
    for ring in fabric.rings(ranks, fabric.default_channels(ranks)):
        for a, b in zip(ring, [*ring[1:], ring[0]], strict=True):
            if fabric.hosts[a] != fabric.hosts[b]:
                on = [v for _, v in cluster.route(cluster.ranks[a], cluster.ranks[b])
                      if cluster.graph.nodes[v]["kind"] == "nic"]
                used[(cluster.host_of(on[0]), on[0].split(".")[1], "out")] += 1
                used[(cluster.host_of(on[-1]), on[-1].split(".")[1], "in")] += 1
    return used


def nets_of(cluster: Cluster) -> _NcclNets:
    gpus = [r for r in cluster.ranks if cluster.host_of(r) == "n0"]
    nics = sorted((n for n, k in cluster.graph.nodes(data="kind") if k == "nic" and cluster.host_of(n) == "n0"),
                  key=natural)
    fabric = fabric_of(cluster)
    return _NcclNets(cluster, gpus, nics, nvs=bool(fabric.switch[0]), mesh=fabric.mesh)


def allreduce_s(cluster: Cluster) -> float:
    sched, _ = collective_schedule(cluster, fabric_of(cluster), "allreduce", GiB // 2, 2, "bf16", "ring")
    return simulate(sched, cluster).makespan


def test_mirror_bits_is_nccls():
    """``mirrorBits`` (src/graph/topo.h): the bits below the power of two, reversed."""
    assert [_mirror_bits(v, 4) for v in range(4)] == [0, 2, 1, 3]
    assert [_mirror_bits(v, 8) for v in range(8)] == [0, 4, 2, 6, 1, 5, 3, 7]
    assert _mirror_bits(1, 2) == 1


def test_h20_paths_and_pxn(h20):
    """H20 (sglang #31046): GPUs 0, 2, 4, 6 each PIX to two NICs, GPUs 1, 3, 5, 7 to none. Without PXN GPU1's local
    NICs are the four of its socket (PHB); with PXN every NIC, through its GPU over NVLink (type PXN, the relay's
    PCIe bandwidth); GPU0 keeps its two."""
    nets = nets_of(h20)
    assert nets.local_nets(0) == [0, 1]
    assert nets.local_nets(1) == [0, 1, 2, 3]
    assert [nets.local_gpu(n) for n in range(8)] == [0, 0, 2, 2, 4, 4, 6, 6]
    nets.add_pxn(lambda a, b: 450.0)
    assert nets.local_nets(0) == [0, 1]
    assert nets.local_nets(1) == list(range(8))
    assert {p.kind for p in nets.paths[1]} == {_PXN}
    assert nets.paths[1][0].links == nets.raw[0][0].links  # PXN loads GPU0's PCIe, not GPU1's


def test_h20_runs_one_channel_per_pcie_switch(h20):
    """NCCL's search on the H20: a Gen5 x16 switch link is 48 GB/s to NCCL, a 400 Gb/s port 50, so a channel at
    48 GB/s fills a GPU's PCIe link and the second NIC behind it is left: 4 channels, on NIC0, NIC2, NIC4, NIC6
    (``ncclTopoSelectNets`` order; 8 x 24 GB/s would be no more), each entering at the NIC's GPU and leaving at
    its neighbour by PXN. In the simulator each switch's NIC pair carries one channel out and one in per server,
    and the allreduce runs as the dgx-h100 preset with 4 NICs (one per PCIe switch of two GPUs)."""
    fabric = fabric_of(h20)
    assert fabric.rails == 4
    assert [p[0] for p in fabric.nic_plans] == ["nic0", "nic2", "nic4", "nic6"]
    assert fabric.nic_gpu == (0, 2, 4, 6)
    assert fabric.nic_twins == (("nic1",), ("nic3",), ("nic5",), ("nic7",))
    used = crossings(h20)
    pair = Counter((host, int(nic[3:]) // 2, way) for (host, nic, way), k in used.items() for _ in range(k))
    assert pair == Counter({(h, s, w): 1 for h in ("n0", "n1") for s in range(4) for w in ("out", "in")})
    preset = load_topology("dgx-h100", {"nodes": 2, "nics_per_node": 4})
    assert allreduce_s(h20) == pytest.approx(allreduce_s(preset), rel=0.03)


def test_a100_puts_a_channel_on_every_nic(a100):
    """A100 (DeepEP #13): GPUs 2k, 2k+1 and NICs 2k, 2k+1 behind one switch (PXB). Each GPU's local NICs are the
    two, shared by the two GPUs: one each (``ncclTopoGetLocalNet``: GPU j on NIC j), and at 24 GB/s (Gen4 x16 to
    NCCL, the 200 Gb/s port 25) one channel per GPU link: 8 channels, NIC k entered at GPU k and left at its
    switch partner. Every NIC of both servers carries one channel out and one in."""
    nets = nets_of(a100)
    assert [nets.local_nets(g) for g in (0, 1, 6)] == [[0, 1], [0, 1], [6, 7]]
    assert [nets.local_net(g, c) for g in range(8) for c in range(2)] == [g for g in range(8) for _ in range(2)]
    fabric = fabric_of(a100)
    assert [p[0] for p in fabric.nic_plans] == [f"nic{k}" for k in range(8)]
    assert fabric.nic_gpu == tuple(range(8))
    assert [p[2][0] for p in fabric.nic_plans] == [1, 0, 3, 2, 5, 4, 7, 6]
    assert crossings(a100) == Counter({(h, f"nic{k}", w): 1 for h in ("n0", "n1") for k in range(8)
                                       for w in ("out", "in")})


def test_mi300x_vm_puts_a_channel_on_every_nic_and_runs_as_the_preset(mi300x):
    """MI300X VM (RCCL issue dump): every GPU and NIC under its socket's host bridge (PHB); RCCL has no PXN. A
    GPU's local NICs are the four of its socket, one each: GPU d on ``mirrorBits(d % 4)`` of them. 8 channels, one
    per NIC; every NIC of both servers carries one channel out and one in (it was 6 of 8), and the allreduce runs
    as the mi300x preset (a NIC per GPU) within 5 % (it was 12 % slower)."""
    nets = nets_of(mi300x)
    assert [nets.local_net(g, 0) for g in range(8)] == [0, 2, 1, 3, 4, 6, 5, 7]
    fabric = fabric_of(mi300x)
    assert [p[0] for p in fabric.nic_plans] == ["nic0", "nic2", "nic1", "nic3", "nic4", "nic6", "nic5", "nic7"]
    assert fabric.nic_gpu == tuple(range(8))
    assert crossings(mi300x) == Counter({(h, f"nic{k}", w): 1 for h in ("n0", "n1") for k in range(8)
                                         for w in ("out", "in")})
    preset = load_topology("mi300x", {"nodes": 2})
    assert allreduce_s(mi300x) == pytest.approx(allreduce_s(preset), rel=0.05)


@pytest.mark.parametrize("preset", [("dgx-h100", {}), ("dgx-a100", {}), ("mi300x", {}),
                                    ("dgx-h100", {"nics_per_node": 4})])
def test_presets_keep_the_rail_rule(preset):
    """A NIC per GPU, or one per PCIe switch of GPUs: no GPU has two local NICs, the rail rule is NCCL's."""
    name, params = preset
    assert fabric_of(load_topology(name, {"nodes": 2, **params})).nic_plans == ()


def test_where_the_rail_rule_is_nccls_it_stays():
    """Mooncake's DGX H100 (#2039): GPU0 and GPU4 each have three NICs on their switch, the other GPUs one. NCCL
    gives each GPU one channel (a 48 GB/s channel fills the GPU's link), on one NIC per GPU: those the rail rule
    uses, up to the NICs' twins. The rail rule stays (each hop leaves by its GPU's own NIC), and the allreduce
    runs as the dgx-h100 preset's."""
    c = imported("dgx-h100-12nic_mooncake-2039.txt")
    assert fabric_of(c).nic_plans == ()
    assert fabric_of(c).rails == 8
    assert allreduce_s(c) == pytest.approx(allreduce_s(load_topology("dgx-h100", {"nodes": 2})), rel=0.01)


def test_h20_with_200g_nics_uses_all_eight():
    """The same H20 with 200 Gb/s ports (25 GB/s): the search runs at 24 GB/s, two channels fit a GPU's PCIe link,
    so both NICs behind each switch carry one (GPU0 puts channel c on NIC c % 2, ``ncclTopoGetLocalNet``): 8
    channels, every NIC once each way. The NICs follow the bandwidths, not the fixture."""
    c = imported("h20-8gpu-8nic_sglang-31046.txt", ImportOptions(nic_Bps=25e9))
    fabric = fabric_of(c)
    assert [p[0] for p in fabric.nic_plans] == [f"nic{k}" for k in range(8)]
    assert fabric.nic_gpu == (0, 0, 2, 2, 4, 4, 6, 6)
    assert crossings(c) == Counter({(h, f"nic{k}", w): 1 for h in ("n0", "n1") for k in range(8)
                                    for w in ("out", "in")})


def test_a100_gpus_leave_by_their_own_nic_and_run_as_the_preset(a100):
    """Of the two NICs on a GPU's PCIe switch, a route between servers takes the one NCCL puts the GPU's channel 0
    on (``ncclTopoGetLocalNetType``: GPU k on NIC k), not the one an ECMP hash of the pair picks: each channel then
    crosses on its own GPU's PCIe link, and the 1 GiB allreduce runs as the dgx-a100 preset's (it was 35 % slower:
    two channels on one GPU's link). The compiled walks and the whole-graph definition give the same routes."""
    homes = home_nics(a100.graph)
    assert homes == {f"n{s}.gpu{k}": f"n{s}.nic{k}" for s in range(2) for k in range(8)}
    router = Router(a100.graph)
    for a in a100.ranks:
        for b in a100.ranks:
            if a != b:
                assert a100.route(a, b) == router.plain_route(a, b)
                if a100.host_of(a) != a100.host_of(b):
                    assert a100.route(a, b)[1][1] == homes[a]  # GPU -> its PCIe switch -> its own NIC
    preset = load_topology("dgx-a100", {"nodes": 2})
    assert allreduce_s(a100) == pytest.approx(allreduce_s(preset), rel=0.01)


def test_a_gpu_has_a_home_nic_only_where_nics_tie_behind_its_switch(h20, mi300x):
    """A GPU with two NICs on its switch gets one (H20: GPUs 0, 2, 4, 6); a GPU whose NICs are all behind a host
    bridge (the H20's others, every GPU of the MI300X VM: NCCL reaches them by PXN or anyhow) keeps the ECMP hash;
    the presets hang one NIC per GPU or switch: none."""
    assert home_nics(h20.graph) == {f"n{s}.gpu{k}": f"n{s}.nic{k}" for s in range(2) for k in (0, 2, 4, 6)}
    assert home_nics(mi300x.graph) == {}
    for name in ("dgx-h100", "dgx-a100", "mi300x", "hgx-h200", "rtx4090-pcie"):
        assert home_nics(load_topology(name, {"nodes": 2}).graph) == {}


@pytest.mark.parametrize(("name", "preset", "params"), [
    ("a100-8gpu-8nic_deepep-13.txt", "dgx-a100", {}),
    ("h20-8gpu-8nic_sglang-31046.txt", "dgx-h100", {"nics_per_node": 4}),
    ("mi300x-8gpu-8nic-vm_rccl.xml", "mi300x", {}),
])
def test_imported_servers_run_ring_prefill_as_their_presets(name, preset, params):
    """Ring prefill forward + backward (16 ranks, 128K tokens, zigzag) on each import within 5 % of the preset."""
    shape = PrefillShape(batch=1, heads=32, head_dim=128, kv_heads=8, sequence=16 * 8192, dtype="bf16",
                         causal=True, layout="zigzag", backward=True)
    got, want = (simulate(build_prefill("ring", {"overlap": True}, shape, layout_of(c)), c).makespan
                 for c in (imported(name), load_topology(preset, {"nodes": 2, **params})))
    assert got == pytest.approx(want, rel=0.05)
