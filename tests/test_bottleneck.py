"""The link that bounds each route (simulator.cluster.bottleneck): `topo show`'s achievable device rates and bounding
links, the route classes, and the what-if notes of a faster link capped by a slower one."""

from __future__ import annotations

from simulator.cli import main
from simulator.cluster.bottleneck import describe, route_classes, whatif_note
from simulator.cluster.topology import load_topology


def test_topo_show_prints_efficiencies_and_bounding_links(capsys):
    assert main(["topo", "show", "dgx-h100", "--set", "nodes=2", "--set", "nic_bandwidth=800Gb/s"]) == 0
    out = capsys.readouterr().out
    assert "achievable: eff_mem 0.89 (2.982 TB/s), eff_flops 0.8" in out
    assert ("GPU -> GPU across nodes, same local index (rail): 64 GB/s, 2.2 us (n0.gpu0 -> n1.gpu0); bound by pcie "
            "(gpu-nic) 64 GB/s, which caps net (nic-switch) 100 GB/s") in out
    assert "GPU -> GPU in a node: 450 GB/s, 0.936 us (n0.gpu0 -> n0.gpu1); bound by nvlink (gpu-switch)" in out


def test_route_classes_name_the_bottleneck():
    default = {rc.name: rc for rc in route_classes(load_topology("dgx-h100", {"nodes": 2}))}
    rail = default["GPU -> GPU across nodes, same local index (rail)"]
    assert rail.bound_by == ("net (nic-switch)", 50e9) and rail.capped == (("pcie (gpu-nic)", 64e9),)
    assert describe(rail).endswith("bound by net (nic-switch) 50 GB/s, which caps pcie (gpu-nic) 64 GB/s")
    assert route_classes(load_topology("cluster", {"nodes": 1, "gpus_per_node": 1})) == []


def test_whatif_notes():
    base = load_topology("dgx-h100", {"nodes": 2})
    capped = whatif_note(base, load_topology("dgx-h100", {"nodes": 2, "nic_bandwidth": "800Gb/s"}), "X")
    assert capped is not None and capped.startswith("X is capped by a slower link: ")
    # a what-if that takes effect says nothing
    assert whatif_note(base, load_topology("dgx-h100", {"nodes": 2, "nic_bandwidth": "200Gb/s"}), "X") is None
    both = {"nodes": 2, "nic_bandwidth": "800Gb/s", "pcie_bandwidth": "128GB/s"}
    note = whatif_note(base, load_topology("dgx-h100", both), "X")
    assert note is not None and "net (nic-switch) 100 GB/s caps pcie (gpu-nic) 128 GB/s" in note
