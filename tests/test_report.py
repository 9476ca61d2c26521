"""Reports and traces: what a user opens after a run."""

from __future__ import annotations

import json

import pandas as pd

from simulator.cli import main
from simulator.support.paths import DEFAULT_SCENARIO


def test_run_writes_a_report_and_report_rewrites_it(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["run", str(DEFAULT_SCENARIO), "-o", str(out), "--timeline-point", "3"]) == 0
    for name in ("results.csv", "timeline.csv", "meta.json", "report.md", "report.html", "latency.png",
                 "speedup.png", "memory.png", "bytes.png", "timeline.png"):
        assert (out / name).is_file(), name
    md = (out / "report.md").read_text()
    assert "treering run" in md and "dgx-h100" in md and "ring/tree" in md
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 5  # self-contained
    meta = json.loads((out / "meta.json").read_text())
    assert meta["timeline_point"] == {"topology_params.nodes": 2, "workload.context": 640000}
    timeline = pd.read_csv(out / "timeline.csv")
    assert set(timeline["algorithm"]) == {"ring", "tree"} and timeline["rank"].max() == 15
    (out / "report.md").unlink()
    assert main(["report", str(out / "results.csv"), "-o", str(tmp_path / "again")]) == 0
    assert "ring/tree" in (tmp_path / "again" / "report.md").read_text()


def test_report_and_trace_errors(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope.csv")]) == 2
    assert main(["run", str(DEFAULT_SCENARIO), "-o", str(tmp_path), "--timeline-point", "9"]) == 2
    assert "--timeline-point: must be between 0 and 5" in capsys.readouterr().err


def test_trace_has_rank_spans_and_link_counters(tmp_path):
    path = tmp_path / "t.json"
    assert main(["trace", str(DEFAULT_SCENARIO), "--point", "2", "-o", str(path)]) == 0
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["cat"] for e in spans} >= {"compute", "send", "recv"}
    assert all(e["dur"] >= 0 for e in spans)
    assert counters and all(0 <= e["args"]["utilisation"] <= 1 + 1e-9 for e in counters)
    names = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert any(n.startswith("ring: rank 0") for n in names) and any(n == "tree: links" for n in names)


def test_speedups_are_over_the_first_algorithm_or_the_named_baseline(tmp_path, capsys):
    one = ["--set", "sweep={}", "--set", "workload.context=4096", "--jobs", "1"]
    assert main(["run", str(DEFAULT_SCENARIO), "-o", str(tmp_path / "a"), *one,
                 "--set", "algorithms=[tree, ring]"]) == 0
    md = (tmp_path / "a" / "report.md").read_text()
    assert "tree/ring" in md and "ring/tree" not in md
    assert json.loads((tmp_path / "a" / "meta.json").read_text())["baseline"] == "tree"
    assert main(["run", str(DEFAULT_SCENARIO), "-o", str(tmp_path / "b"), *one, "--set", "baseline=tree"]) == 0
    assert "tree/ring" in (tmp_path / "b" / "report.md").read_text()
    capsys.readouterr()
    assert main(["run", str(DEFAULT_SCENARIO), "-o", str(tmp_path / "c"), *one, "--set", "baseline=ring-q"]) == 2
    err = capsys.readouterr().err
    assert "baseline: must be one of the algorithms (ring, tree), got 'ring-q'" in err
    assert not (tmp_path / "c").exists()


def test_the_timeline_comes_from_the_sweeps_own_simulation(tmp_path, monkeypatch):
    import simulator.run.commands as commands

    def no_second_simulation(*args, **kwargs):
        raise AssertionError("the timeline point was simulated twice")

    monkeypatch.setattr(commands, "point_runs", no_second_simulation)
    out = tmp_path / "o"
    assert main(["run", str(DEFAULT_SCENARIO), "-o", str(out), "--set", "sweep={}", "--jobs", "1"]) == 0
    timeline = pd.read_csv(out / "timeline.csv")
    assert set(timeline["algorithm"]) == {"ring", "tree"} and timeline["rank"].max() == 7

def test_scope_model_timeline_and_trace_say_they_show_one_layer(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\ntopology: dgx-h100\nworkload: {kind: decode, model: llama-3.2-1b, scope: model, tp: 8, "
                    "batch: 1, context: 65536, dtype: bf16}\nalgorithms: [ring, tree]\n")
    out = tmp_path / "o"
    assert main(["run", str(path), "-o", str(out), "--jobs", "1"]) == 0
    md = (out / "report.md").read_text()
    assert "Scope `model`: this is ONE attention layer (of 16) of the decode step, not the whole step" in md
    assert json.loads((out / "meta.json").read_text())["layers"] == 16
    assert main(["trace", str(path), "-o", str(tmp_path / "t.json")]) == 0
    assert "note: scope: model; this trace shows ONE attention layer of 16" in capsys.readouterr().out
    trace = json.loads((tmp_path / "t.json").read_text())
    assert "ONE attention layer of 16" in trace["otherData"]["note"]
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert "tree (one attention layer of 16): links" in names
