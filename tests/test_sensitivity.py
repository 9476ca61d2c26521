"""``treering sensitivity``: variations around one point, the tornado's spans, and whether the ranking flips."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main
from simulator.errors import InputError
from simulator.report.sensitivity import conclusions, ranking, spans
from simulator.run.scenario import load_scenario
from simulator.run.sensitivity import parse_vary, run_sensitivity, variations

SCENARIO = """
name: sens
topology: dgx-h100
topology_params: {nodes: 2}
workload: {kind: decode, model: {heads: 16, head_dim: 128}, context: 64000, dtype: bf16}
algorithms: [ring, tree]
"""


def _scenario(tmp_path: Path, text: str = SCENARIO) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_factors_scale_the_base_value_as_it_is_written(tmp_path: Path) -> None:
    (base,) = load_scenario(_scenario(tmp_path))
    runs = variations([parse_vary("nic_bandwidth=0.5x,2x"), parse_vary("context=2x"), parse_vary("eff_mem=0.8"),
                       parse_vary("workload.batch=3")], base)
    assert [(v.paths, v.value) for v in runs] == [
        (("topology_params.nic_bandwidth",), ["25 GB/s"]),  # the preset's 400 Gb/s = 50 GB/s
        (("topology_params.nic_bandwidth",), ["100 GB/s"]),
        (("workload.context",), [128000]),
        (("devices.h100-sxm.eff_mem",), [0.8]),
        (("workload.batch",), [3]),
    ]
    with pytest.raises(InputError, match="unknown input 'nic_bandwith'"):
        variations([parse_vary("nic_bandwith=2x")], base)
    with pytest.raises(InputError, match="expected KEY=V1,V2"):
        parse_vary("nic_bandwidth")


def test_a_slower_nic_slows_the_ring_and_the_records_hold_every_variation(tmp_path: Path) -> None:
    records, metric = run_sensitivity(_scenario(tmp_path), ["nic_bandwidth=0.5x,2x"])
    frame = pd.DataFrame.from_records(records)
    assert metric == "latency_s" and len(frame) == 6
    ring = frame[frame["algorithm"] == "ring"].set_index("value")["outcome"]
    assert ring["0.5x"] > ring["base"] > ring["2x"]


def test_spans_and_a_flipped_ranking_are_said() -> None:
    rows = [("base", "base", "ring", 1.0), ("base", "base", "tree", 2.0),
            ("nic", "0.5x", "ring", 3.0), ("nic", "0.5x", "tree", 2.5),
            ("nic", "2x", "ring", 0.5), ("nic", "2x", "tree", 2.0),
            ("eff", "0.8", "ring", 1.1), ("eff", "0.8", "tree", 2.2)]
    frame = pd.DataFrame(rows, columns=["key", "value", "algorithm", "outcome"])
    assert ranking(frame[frame["key"] == "base"]) == ["ring", "tree"]
    table = spans(frame)
    ring = table[table["algorithm"] == "ring"].iloc[0]
    assert (ring["key"], ring["low_pct"], ring["high_pct"]) == ("nic", -50.0, 200.0)
    text = " ".join(conclusions(frame, "latency_s"))
    assert "flips under 1 variation(s): nic=0.5x: tree < ring" in text
    same = frame[frame["value"] != "0.5x"]
    assert "(ring < tree) holds under every variation" in " ".join(conclusions(same, "latency_s"))


def test_the_verb_writes_the_chart_and_refuses_a_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _scenario(tmp_path)
    out = tmp_path / "o"
    assert main(["sensitivity", str(path), "--vary", "eff_mem=0.8,1.0", "-o", str(out)]) == 0
    assert (out / "tornado.png").stat().st_size > 1000
    assert len(pd.read_csv(out / "sensitivity.csv")) == 6  # the base and two values, two algorithms each
    assert "The ranking of the algorithms" in (out / "sensitivity.md").read_text()
    capsys.readouterr()
    assert main(["sensitivity", str(path), "--vary", "eff_mem=0.8", "-o", str(tmp_path / "p"),
                 "--set", "sweep={workload.context: [1000, 2000]}"]) == 2
    assert "sweep: sensitivity varies one point" in capsys.readouterr().err
