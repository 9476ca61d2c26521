"""What users asked for beyond the planner: H200 / B200 / GB200 NVL72 presets, measured efficiencies and the
link bounding each route, llama-3.1-405b and user-defined models, separate weight and KV dtypes, token counts in
YAML, `topo list`, `--version`, help on every option."""

from __future__ import annotations

import argparse
import textwrap

import pandas as pd
import pytest
import yaml

from simulator.cli import _parser, main
from simulator.cluster.bottleneck import describe, route_classes, whatif_note
from simulator.cluster.topology import device_library, load_topology, override_devices
from simulator.errors import InputError
from simulator.models.presets import PRESETS, custom_model
from simulator.support.paths import TOPOLOGY_DIR


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


def test_device_efficiencies_set_from_a_scenario(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\ntopology: dgx-h100\nworkload: {kind: decode, model: {heads: 8, head_dim: 128}, "
                    "context: 1M}\nalgorithms: [tree]\nsweep: {devices.h100-sxm.eff_mem: [0.5, 1.0]}\n")
    assert main(["run", str(path), "-o", str(tmp_path / "o"), "--no-report", "--jobs", "1"]) == 0
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert df["context"].tolist() == [2**20, 2**20]
    assert df["compute_s"][0] > 1.8 * df["compute_s"][1]  # KV reads dominate: half the bandwidth, ~twice the time
    assert main(["run", str(path), "-o", str(tmp_path / "p"), "--set", "devices.h999.eff_mem=0.5"]) == 2
    err = capsys.readouterr().err
    assert "devices.h999: no device of topology 'dgx-h100' uses spec 'h999'; its devices: h100-sxm" in err
    assert main(["run", str(path), "-o", str(tmp_path / "p"), "--set", "devices.h100-sxm.eff_mem=2"]) == 2
    assert "devices.h100-sxm.eff_mem: must be at most 1.0, got 2" in capsys.readouterr().err


def test_override_devices_replaces_only_named_fields():
    c = override_devices(load_topology("dgx-h100"), {"h100-sxm": {"eff_flops": 0.5}})
    assert c.specs["n0.gpu3"].eff_flops == 0.5 and c.specs["n0.gpu3"].eff_mem == 0.89
    with pytest.raises(InputError, match="its devices: h100-sxm"):
        override_devices(c, {"mi300x": {"eff_mem": 0.5}})


def test_llama_405b_preset_matches_its_shapes():
    m = PRESETS["llama-3.1-405b"]
    again = custom_model(m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.intermediate, m.vocab)
    assert again.params == pytest.approx(m.params, rel=1e-4)
    # the published 70B count agrees with the same formula to within the norms
    m70 = PRESETS["llama-3.1-70b"]
    assert custom_model(m70.layers, m70.hidden, m70.heads, m70.kv_heads, m70.head_dim, m70.intermediate,
                        m70.vocab).params == pytest.approx(m70.params, rel=2e-3)


MODEL = """
name: m
topology: dgx-h100
workload:
  kind: decode
  model: {model}
  scope: model
  tp: 8
  context: 64K
  {extra}
algorithms: [tree]
"""
SHAPES_8B = "{layers: 32, hidden: 4096, heads: 32, kv_heads: 8, head_dim: 128, intermediate: 14336, vocab: 128256}"


def _run(tmp_path, model: str, extra: str = "") -> pd.Series:
    path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(textwrap.dedent(MODEL.format(model=model, extra=extra)).lstrip())
    out = path.with_suffix("")
    assert main(["run", str(path), "-o", str(out), "--no-report", "--jobs", "1"]) == 0
    return pd.read_csv(out / "results.csv").iloc[0]


def test_user_defined_model_runs_like_the_preset_of_its_shapes(tmp_path):
    custom = _run(tmp_path, SHAPES_8B)
    preset = _run(tmp_path, "llama-3.1-8b")
    assert custom["model"] == "custom" and custom["context"] == 65536
    assert custom["latency_s"] == pytest.approx(preset["latency_s"], rel=1e-12)  # same kernels
    # memory differs only by the parameter count: 8.03e9 published vs the shapes' count
    weights = custom_model(32, 4096, 32, 8, 128, 14336, 128256).params
    assert custom["peak_mem_bytes"] - preset["peak_mem_bytes"] == pytest.approx((weights - 8.03e9) / 8 * 2, rel=1e-6)


def test_a_model_block_without_its_whole_shape_is_refused_for_scope_model(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(MODEL.format(model="{heads: 32, head_dim: 128, layers: 2}", extra="")).lstrip())
    assert main(["run", str(path), "-o", str(tmp_path / "o")]) == 2
    assert "lacks hidden, intermediate, vocab" in capsys.readouterr().err


def test_weight_and_kv_dtypes(tmp_path):
    base = _run(tmp_path, "llama-3.1-8b")
    fp8_weights = _run(tmp_path, "llama-3.1-8b", "weight_dtype: fp8")
    fp8_kv = _run(tmp_path, "llama-3.1-8b", "kv_dtype: fp8")
    weights = 8.03e9 / 8
    assert base["peak_mem_bytes"] - fp8_weights["peak_mem_bytes"] == pytest.approx(weights, rel=1e-9)
    kv = 32 * 2 * 65536 * 1 * 128  # layers x (K, V) x tokens x 1 KV head per GPU x head_dim, 1 byte saved each
    assert base["peak_mem_bytes"] - fp8_kv["peak_mem_bytes"] == pytest.approx(kv, rel=0.01)
    assert fp8_weights["latency_s"] < base["latency_s"] and fp8_kv["latency_s"] < base["latency_s"]


@pytest.mark.parametrize(("value", "message"), [("1.5M", None), ("12Q", "expected a token count"),
                                                ("-5", "must be a positive integer")])
def test_token_counts_in_yaml(value, message, tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\ntopology: dgx-h100\nworkload: {{kind: decode, model: {{heads: 8, head_dim: 64}}, "
                    f"context: {value}}}\nalgorithms: [tree]\n")
    rc = main(["run", str(path), "-o", str(tmp_path / "o"), "--no-report", "--jobs", "1"])
    if message is None:
        assert rc == 0 and pd.read_csv(tmp_path / "o" / "results.csv")["context"][0] == 1572864
    else:
        assert rc == 2 and f"s.yaml:3: workload.context: {message}" in capsys.readouterr().err


def test_topo_list_and_version(capsys):
    assert main(["topo", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("dgx-h100", "hgx-h200", "hgx-b200", "gb200-nvl72"):
        assert any(line.startswith(name + " ") for line in out.splitlines())
    assert "NVIDIA GB200 NVL72: one rack of 72 B200-class GPUs" in out
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == "treering 0.1.0"


def _parsers(p: argparse.ArgumentParser):
    yield p
    for action in p._actions:  # argparse keeps subparsers here; there is no public accessor
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_option_has_help():
    missing = [f"{p.prog} {a.option_strings or a.dest}" for p in _parsers(_parser()) for a in p._actions
               if not isinstance(a, argparse._SubParsersAction) and not a.help]
    assert missing == []
