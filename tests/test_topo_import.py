"""`treering topo import`: real nvidia-smi topo -m outputs and NCCL topology dumps (tests/fixtures/topo/README.md
cites each) -> explicit topology YAML that loads, simulates, and matches the link classes it was read from."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.cluster.hostgraph import ImportOptions, nvlink_bandwidth, pcie_bandwidth
from simulator.cluster.importers import import_topology
from simulator.cluster.summary import bisection_bandwidth
from simulator.cluster.topology import Cluster, build_cluster, load_topology
from simulator.errors import InputError
from simulator.support.yaml_lines import load_yaml_text

FIX = Path(__file__).parent / "fixtures" / "topo"
A100_NVSMI = FIX / "a100-8gpu-8nic_deepep-13.txt"
DGX_H100_NVSMI = FIX / "dgx-h100-12nic_mooncake-2039.txt"
H20_NVSMI = FIX / "h20-8gpu-8nic_sglang-31046.txt"
DGX1_NVSMI = FIX / "dgx1-v100_msccl-tools.txt"
A100_XML = FIX / "a100-8gpu-4nic_simai.xml"
H100_XML = FIX / "h100-8gpu-8nic-vm_ibm-cloud.xml"
MI300X_XML = FIX / "mi300x-8gpu-8nic-vm_rccl.xml"
# DGX H100: 8 ConnectX-7 compute NICs; mlx5_1, 2, 7, 8 are the storage/ethernet ports (the `ibstat` of the
# report the log comes from, tests/fixtures/topo/README.md)
DGX_H100_COMPUTE = ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")
GEN4_X16 = 16e9 * 16 * (128 / 130) / 8
GEN5_X16 = 32e9 * 16 * (128 / 130) / 8


def imported(*paths: Path, **kw) -> Cluster:
    text = import_topology([str(p) for p in paths], **kw)
    return build_cluster(load_yaml_text(text, "<imported>"), "<imported>")


def kinds(c: Cluster) -> Counter:
    return Counter(k for _, k in c.graph.nodes(data="kind"))


def bws(c: Cluster, cls: str) -> set[float]:
    """The bandwidths of a link class, in MB/s (the YAML writes 12 significant digits)."""
    return {round(d["bandwidth"] / 1e6) for _, _, d in c.graph.edges(data=True) if d["cls"] == cls}


def test_link_class_bandwidths():
    assert nvlink_bandwidth(4, 18) == 450e9 and nvlink_bandwidth(3, 12) == 300e9 and nvlink_bandwidth(5, 18) == 900e9
    assert pcie_bandwidth(16, 16) == pytest.approx(31.5077e9, rel=1e-5)
    assert pcie_bandwidth(2.5, 1) == 0.25e9  # 8b/10b below Gen3
    with pytest.raises(InputError, match="unknown NVLink generation 6"):
        nvlink_bandwidth(6, 1)


def test_nvsmi_a100_one_node():
    c = imported(A100_NVSMI)
    assert len(c.ranks) == 8 and kinds(c) == Counter(gpu=8, cpu=2, switch=5, nic=8)  # nvswitch + 4 PCIe switches
    assert bws(c, "nvlink") == {300_000}  # NV12 = 12 x NVLink3
    assert bws(c, "pcie") == {round(GEN4_X16 / 1e6)}  # A100 SXM4: Gen4 x16, assumed and said so
    assert c.specs["n0.gpu0"].name == "a100-sxm"
    # GPU0, GPU1, NIC0, NIC1 are PXB/PIX to each other: one PCIe switch, under NUMA node 0
    assert [v for _, v in c.route("n0.gpu1", "n0.nic1")] == ["n0.pcie0", "n0.nic1"]
    assert [v for _, v in c.route("n0.gpu0", "n0.gpu7")] == ["n0.nvswitch", "n0.gpu7"]


def test_nvsmi_dgx_h100_two_nodes_matches_the_preset():
    c = imported(DGX_H100_NVSMI, nodes=2, opts=ImportOptions(nics=DGX_H100_COMPUTE))
    assert len(c.ranks) == 16 and kinds(c)["nic"] == 16
    assert bws(c, "nvlink") == {450_000} and bws(c, "net") == {50_000}  # NV18 = 18 x NVLink4; NDR 400 Gb/s assumed
    preset = load_topology("dgx-h100", {"nodes": 2})
    assert bisection_bandwidth(c) == pytest.approx(bisection_bandwidth(preset)) == pytest.approx(400e9)
    # rail k joins NIC k of every node; NIC1 is mlx5_3, PIX to GPU1
    assert [v for _, v in c.route("n0.gpu1", "n1.gpu1")] == ["n0.pcie1", "n0.nic1", "rail1", "n1.nic1",
                                                             "n1.pcie1", "n1.gpu1"]


def test_nvsmi_h20_device_and_pcie_grouping():
    c = imported(H20_NVSMI, opts=ImportOptions(device="h100-sxm", nic_Bps=200e9 / 8), nodes=2, fabric_kind="fat-tree")
    assert kinds(c)["gpu"] == 16 and {v for v in c.graph if v.startswith("leaf")} == {"leaf0"}
    # GPU0 shares a switch with NIC0 and NIC1; GPU1 is NODE to every NIC: straight to its CPU
    assert {v for _, v in c.graph.out_edges("n0.gpu1")} == {"n0.nvswitch", "n0.cpu0"}
    assert bws(c, "net") == {25_000}


def test_nvsmi_dgx1_older_format_direct_nvlink_pairs():
    """Tab-separated, NICs named mlx5_* in the header, no NUMA column, and a hybrid cube mesh of NV1/NV2 bonds."""
    with pytest.raises(InputError, match="pass --device"):
        imported(DGX1_NVSMI)  # NV1/NV2 name no GPU model
    c = imported(DGX1_NVSMI, opts=ImportOptions(device="a100-sxm", nvlink_gen=2, pcie_Bps=15.75e9))
    nvlinks = {tuple(sorted((u, v))): d["bandwidth"] for u, v, d in c.graph.edges(data=True) if d["cls"] == "nvlink"}
    assert len(nvlinks) == 16 and sorted(set(nvlinks.values())) == [25e9, 50e9]  # NV1, NV2 x NVLink2
    assert nvlinks[("n0.gpu0", "n0.gpu3")] == 50e9 and ("n0.gpu0", "n0.gpu5") not in nvlinks
    # no NVLink between them: PCIe and the sockets' link (CUDA peer-to-peer), not through a third GPU's NVLinks
    assert [c.graph.edges[e]["cls"] for e in c.route("n0.gpu0", "n0.gpu5")] == ["pcie", "pcie", "smp", "pcie",
                                                                                  "pcie"]
    assert kinds(c)["cpu"] == 2 and kinds(c)["switch"] == 4  # CPU affinity groups; GPU pairs + NIC per PCIe switch
    assert bws(c, "pcie") == {15_750}


def test_xml_a100_nvswitch_links_summed_and_nic_speed_read():
    c = imported(A100_XML, nodes=2)
    assert len(c.ranks) == 16 and kinds(c)["nic"] == 10 and kinds(c)["cpu"] == 4
    assert bws(c, "nvlink") == {300_000}  # 6 NVSwitches x 2 links of sm80 = NVLink3
    assert bws(c, "net") == {25_000}  # <net speed="200000"> Mb/s
    assert bisection_bandwidth(c) == pytest.approx(5 * 25e9)  # 5 rails
    assert c.route_bandwidth(c.route("n0.gpu0", "n0.nic0")) == pytest.approx(GEN4_X16)


def test_xml_h100_vm_counts_and_assumed_width():
    text = import_topology([str(H100_XML)])
    assert "link_width 0 (a virtual machine's): x16 assumed" in text
    c = build_cluster(load_yaml_text(text, "<x>"), "<x>")
    assert bws(c, "nvlink") == {450_000}  # nvlink counts 5 + 5 + 4 + 4 to four NVSwitches
    assert c.route_bandwidth(c.route("n0.gpu0", "n0.nic0")) == pytest.approx(GEN5_X16)
    assert c.specs["n0.gpu7"].name == "h100-sxm"


def test_rccl_mi300x_fully_connected_like_the_preset():
    c = imported(MI300X_XML, nodes=2)
    assert c.specs["n0.gpu0"].name == "mi300x" and len(c.ranks) == 16
    assert sum(1 for *_, d in c.graph.edges(data=True) if d["cls"] == "infinity-fabric") == 2 * 2 * 28
    assert bws(c, "infinity-fabric") == {64_000} and bws(c, "net") == {50_000}  # <net speed="400000">
    preset = load_topology("mi300x")
    for a, b in (("n0.gpu0", "n0.gpu7"), ("n0.gpu3", "n0.gpu4")):
        assert len(c.route(a, b)) == 1
        assert c.route_bandwidth(c.route(a, b)) == preset.route_bandwidth(preset.route(a, b)) == 64e9
    # ranks follow the dump's dev numbers, not its file order (dev 1 comes first in the file)
    assert "<gpu dev=0 gcn=gfx942> at 0011:00:00.0" in import_topology([str(MI300X_XML)])


def test_one_node_per_file():
    text = import_topology([str(H100_XML), str(H20_NVSMI)], opts=ImportOptions(device="h100-sxm"))
    assert "200 Gb/s per NIC (the slowest NIC speed stated in the input; assumed the same for " in text
    c = build_cluster(load_yaml_text(text, "<x>"), "<x>")
    assert c.num_hosts == 2 and bws(c, "net") == {25_000}
    assert "n0.pcie7" in c.graph and "n1.pcie3" in c.graph and "n1.pcie7" not in c.graph  # each node its own file


def test_cli_writes_a_topology_that_shows_and_runs(tmp_path, capsys):
    out = tmp_path / "dgx.yaml"
    assert main(["topo", "import", str(DGX_H100_NVSMI), "--nodes", "2", "--nics", ",".join(DGX_H100_COMPUTE),
                 "-o", str(out)]) == 0
    text = out.read_text()
    assert "assumed h100-sxm from NV18" in text and "NICs left out (not in --nics): mlx5_1, mlx5_2" in text
    assert main(["topo", "show", str(out)]) == 0
    assert "16 GPUs on 2 node(s)" in capsys.readouterr().out
    scen = tmp_path / "s.yaml"
    scen.write_text("name: s\ntopology: dgx.yaml\nworkload: {kind: decode, model: {heads: 16, head_dim: 128}, "
                    "batch: 1, context: 64000, dtype: bf16}\nalgorithms: [ring, tree]\n")
    assert main(["run", str(scen), "-o", str(tmp_path / "o"), "--no-report", "--jobs", "1"]) == 0
    assert (tmp_path / "o" / "results.csv").exists()


def _write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _bad_cases(tmp_path: Path) -> list[tuple[list[str], str]]:
    lines = A100_NVSMI.read_text().splitlines(keepends=True)
    truncated = _write(tmp_path, "trunc.txt", "".join(lines[:15]))
    short_row = _write(tmp_path, "short.txt", "".join([*lines[:3], lines[3].split("NV12")[0] + "\n", *lines[4:]]))
    unknown = _write(tmp_path, "code.txt", "".join([*lines[:2], lines[2].replace("NV12", "NVL", 1), *lines[3:]]))
    xml = A100_XML.read_text()
    bad_xml = _write(tmp_path, "bad.xml", xml[:5000])
    no_sm = _write(tmp_path, "nosm.xml", xml.replace('<gpu dev="3" sm="80"', '<gpu dev="3"'))
    return [
        ([truncated], f"{truncated}:16: NIC6: truncated matrix: expected the row of NIC6"),
        ([short_row], f"{short_row}:4: GPU2: truncated row: 0 cells, expected 16"),
        ([unknown], f"{unknown}:3: GPU1/GPU0: unknown cell code 'NVL'; known: X, NV#, PIX, PXB, PHB, NODE, SYS"),
        ([bad_xml], f"{bad_xml}:61: xml: malformed XML: unclosed token"),
        ([no_sm], f"{no_sm}:61: gpu.sm: <gpu> has no 'sm' attribute"),
        ([_write(tmp_path, "x.txt", "hello\n")], "x.txt:1: unrecognised format"),
        ([str(A100_NVSMI), str(A100_XML), "--nodes", "2"], "--nics: every node needs the same number (> 0)"),
        ([str(A100_NVSMI), "--nodes", "2", "--fabric", "torus"], "--fabric: unknown fabric 'torus'; valid: rail"),
        ([str(A100_NVSMI), "--nics", "mlx5_9"], "--nics: no NIC 'mlx5_9'"),
        ([str(A100_NVSMI), "--nodes", "2", "--nic-bandwidth", "fast"], "--nic-bandwidth: cannot parse 'fast'"),
    ]


def test_malformed_inputs_exit_2_with_a_located_line(tmp_path, capsys):
    for args, message in _bad_cases(tmp_path):
        assert main(["topo", "import", *args, "-o", str(tmp_path / "t.yaml")]) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("treering: error: ") and message in err, (message, err)
    assert not (tmp_path / "t.yaml").exists()
