"""The command line: runs, outputs, device efficiencies and token counts set in a scenario, `topo list`, `--version`,
help on every option, and one-line located errors with exit code 2."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import _parser, main


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


FLOWS = """
name: t
topology: dgx-h100
topology_params: {nodes: 2}
workload:
  kind: flows
  flows:
    - {src: n0.gpu0, dst: n1.gpu0, bytes: 1 GB, start: 0}
    - {src: n0.gpu1, dst: n1.gpu0, bytes: 1 GB, start: 0}
sweep:
  topology_params.nodes: [2, 4]
  workload.flows.1.bytes: [0.5 GB, 1 GB]
"""


def test_run_writes_results_for_every_sweep_point(tmp_path, capsys):
    scen = write(tmp_path, "s.yaml", FLOWS)
    assert main(["run", str(scen), "-o", str(tmp_path / "out")]) == 0
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    assert list(df.columns) == ["flow", "src", "dst", "bytes", "start_s", "finish_s",
                                "topology_params.nodes", "workload.flows.1.bytes", "point"]
    assert len(df) == 2 * 2 * 2
    # both flows end on n1.gpu0's NIC (50 GB/s): 1.5 GB and 2 GB in total
    overhead_lat = 6.6e-6 + 2.2e-6  # same-rail flow; the other crosses a spine (+0.6 us)
    last = df.groupby(["topology_params.nodes", "workload.flows.1.bytes"])["finish_s"].max()
    assert last[(2, "1 GB")] == pytest.approx(2e9 / 50e9 + overhead_lat, rel=1e-3)
    assert "results.csv" in capsys.readouterr().out


def test_set_overrides_before_the_sweep(tmp_path):
    scen = write(tmp_path, "s.yaml", FLOWS)
    assert main(["run", str(scen), "-o", str(tmp_path / "o"), "--set", "sweep={}",
                 "--set", "topology=dgx-a100"]) == 0
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert len(df) == 2 and df["finish_s"].max() == pytest.approx(2e9 / 25e9, rel=1e-3)


def test_default_scenario_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run"]) == 0
    assert (tmp_path / "out" / "quickstart" / "results.csv").exists()


def test_topo_show(capsys):
    assert main(["topo", "show", "dgx-h100", "--set", "nodes=2"]) == 0
    assert "16 GPUs" in capsys.readouterr().out


def _gpus_linked(gpus: int, *links: str) -> str:
    """A topology file of ``gpus`` H100s g0, g1, ... and these links (flow-style YAML mappings)."""
    nodes = "".join(f"  - {{name: g{i}, kind: gpu, device: h100-sxm}}\n" for i in range(gpus))
    return "nodes:\n" + nodes + "links:\n" + "".join(f"  - {link}\n" for link in links)


TOPO_ERRORS = {
    "unknown device spec": ("""
        nodes:
          - {name: g0, kind: gpu, device: h100-sxm}
          - {name: g1, kind: gpu, device: h999}
        links:
          - {a: g0, b: g1, bandwidth: 10 GB/s}
        """, "t.yaml:3: nodes.1.device: unknown device spec 'h999'"),
    "non-positive bandwidth": ("""
        nodes:
          - {name: g0, kind: gpu, device: h100-sxm}
          - {name: g1, kind: gpu, device: h100-sxm}
        links:
          - {a: g0, b: g1, bandwidth: 0 GB/s}
        """, "t.yaml:5: links.0.bandwidth: must be positive"),
    "negative latency": ("""
        nodes:
          - {name: g0, kind: gpu, device: h100-sxm}
          - {name: g1, kind: gpu, device: h100-sxm}
        links:
          - {a: g0, b: g1, bandwidth: 10 GB/s, latency: -2 us}
        """, "t.yaml:5: links.0.latency: must not be negative"),
    "unreachable device": ("""
        nodes:
          - {name: g0, kind: gpu, device: h100-sxm}
          - {name: g1, kind: gpu, device: h100-sxm}
          - {name: g2, kind: gpu, device: h100-sxm}
        links:
          - {a: g0, b: g1, bandwidth: 10 GB/s}
          - {src: g1, dst: g2, bandwidth: 10 GB/s}
        """, "t.yaml:5: links: device g0 is unreachable from g2"),
    "duplicate names": ("""
        nodes:
          - {name: g0, kind: gpu, device: h100-sxm}
          - {name: g0, kind: gpu, device: h100-sxm}
        links: []
        """, "t.yaml:3: nodes.1.name: duplicate node name 'g0'"),
    "bad units": ("""
        nodes:
          - {name: g0, kind: gpu, device: h100-sxm}
          - {name: g1, kind: gpu, device: h100-sxm}
        links:
          - {a: g0, b: g1, bandwidth: 10 GB/z}
        """, "t.yaml:5: links.0.bandwidth: cannot parse '10 GB/z'"),
    # each distinct quantity is parsed once: a figure seen before with its unit does not pass a bare number of the
    # same value, and a value that is no quantity at all is refused where it stands
    "bare number after the same figure with its unit": (_gpus_linked(
        3, "{a: g0, b: g1, bandwidth: 1 GB/s, latency: 2 us}", "{a: g1, b: g2, bandwidth: 1 GB/s, latency: 2 us}",
        "{a: g0, b: g2, bandwidth: 1000000000, latency: 2 us}"), "t.yaml:8: links.2.bandwidth: give a unit"),
    "a list as a bandwidth": (_gpus_linked(3, "{a: g0, b: g1, bandwidth: 10 GB/s}",
                                           "{a: g1, b: g2, bandwidth: [10 GB/s]}"),
                              "t.yaml:7: links.1.bandwidth: expected a bandwidth"),
    "a list as a link's end": (_gpus_linked(2, "{a: [g0], b: g1, bandwidth: 10 GB/s}"),
                               "t.yaml:5: links.0.a: unknown node"),
    "duplicate link": (_gpus_linked(2, "{a: g0, b: g1, bandwidth: 10 GB/s}", "{src: g1, dst: g0, bandwidth: 10 GB/s}"),
                       "t.yaml:6: links.1: duplicate link g1 -> g0"),
    "bad yaml": ("""
        nodes: [
        """, "t.yaml:2: invalid YAML"),
}


@pytest.mark.parametrize("case", sorted(TOPO_ERRORS))
def test_topology_errors_exit_2_with_one_located_line(case, tmp_path, capsys, monkeypatch):
    text, expected = TOPO_ERRORS[case]
    write(tmp_path, "t.yaml", text)
    monkeypatch.chdir(tmp_path)
    assert main(["topo", "show", "t.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"treering: error: {expected}"), err


SCENARIO_ERRORS = {
    "unknown preset": (FLOWS.replace("topology: dgx-h100", "topology: dgx-h101"),
                       "s.yaml:2: topology: unknown topology preset 'dgx-h101'"),
    "bad param": (FLOWS.replace("{nodes: 2}", "{nodes: 0}").split("sweep:")[0],
                  "s.yaml:3: topology_params.nodes: must be a positive integer, got 0"),
    "bad flow unit": (FLOWS.replace("bytes: 1 GB, start: 0}\n    - {src: n0.gpu1", "bytes: 1 GQ}\n    - {src: n0.gpu1"),
                      "s.yaml:7: workload.flows.0.bytes: cannot parse '1 GQ'"),
    "unknown key": (FLOWS.replace("name: t", "name: t\nalgoritms: [ring]"), "s.yaml:2: algoritms: unknown key"),
    "bad sweep value": (FLOWS.replace("[2, 4]", "[2, -4]"),
                        "s.yaml:10: topology_params.nodes: must be a positive integer, got -4"),
    "endpoint missing at one sweep point": (FLOWS.replace("[2, 4]", "[2, 1]"),
                                            "s.yaml:7: workload.flows.0.dst: unknown device 'n1.gpu0'"),
}


@pytest.mark.parametrize("case", sorted(SCENARIO_ERRORS))
def test_scenario_errors_exit_2_and_keep_previous_results(case, tmp_path, capsys):
    text, expected = SCENARIO_ERRORS[case]
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("previous\n")
    scen = write(tmp_path, "s.yaml", text)
    assert main(["run", str(scen), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"treering: error: {tmp_path}/{expected}"), err
    assert (out / "results.csv").read_text() == "previous\n"
    assert sorted(p.name for p in out.iterdir()) == ["results.csv"]


def test_cli_argument_errors_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--bogus"])
    assert exc.value.code == 2
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read file" in capsys.readouterr().err
    scen = write(tmp_path, "s.yaml", FLOWS)
    (tmp_path / "afile").write_text("x")
    assert main(["run", str(scen), "-o", str(tmp_path / "afile")]) == 2
    assert main(["run", str(scen), "--set", "novalue"]) == 2
    assert "expected key=value" in capsys.readouterr().err


def test_zip_groups_vary_together(tmp_path):
    text = FLOWS.replace("""sweep:
  topology_params.nodes: [2, 4]
  workload.flows.1.bytes: [0.5 GB, 1 GB]""", """sweep:
  topology: [dgx-h100, dgx-a100]
  zip:
    - {topology_params.nodes: [2, 3, 4], workload.flows.1.bytes: [0.5 GB, 1 GB, 2 GB]}""")
    scen = write(tmp_path, "z.yaml", text)
    assert main(["run", str(scen), "-o", str(tmp_path / "o")]) == 0
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    pairs = set(zip(df["topology_params.nodes"], df["workload.flows.1.bytes"], strict=True))
    assert pairs == {(2, "0.5 GB"), (3, "1 GB"), (4, "2 GB")}
    assert len(df) == 2 * 3 * 2


def test_zip_groups_need_equal_lengths(tmp_path, capsys):
    text = FLOWS.replace("""  topology_params.nodes: [2, 4]
  workload.flows.1.bytes: [0.5 GB, 1 GB]""", """  zip:
    - {topology_params.nodes: [2, 3], workload.flows.1.bytes: [1 GB]}""")
    scen = write(tmp_path, "z.yaml", text)
    assert main(["run", str(scen), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "z.yaml:11: sweep.zip.0: keys that vary together need non-empty lists of one length" in err


def test_schema_is_json_schema(capsys):
    import json

    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "Scenario" and "workload" in schema["properties"]


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
