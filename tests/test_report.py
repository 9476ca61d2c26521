"""Reports and traces: what a user opens after a run, and how reports and printed tables read."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from simulator.cli import main
from simulator.report.collective import collective_blocks
from simulator.report.conclude import overview, summary, times
from simulator.report.document import Heading, Image, Table, plain_number, short_names
from simulator.report.figures import dims_of, facet_figure, png, readable_log_axis
from simulator.report.labels import printed_table
from simulator.report.pages import write_pages
from simulator.report.timeline import gantt
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


# ---- how reports and printed tables read (synthetic rows: no simulation) ----

def _decode_rows(points: list[dict], algos: dict[str, float]) -> pd.DataFrame:
    """Decode-like rows: one per point and algorithm, latency = the algorithm's factor x the point's context."""
    rows = []
    for i, point in enumerate(points):
        for algo, factor in algos.items():
            lat = factor * point.get("context", 1000) * 1e-9
            rows.append({"scenario": "s", "algorithm": algo, "topology": "dgx-h100", "ranks": 8, "nodes": 1,
                         "context": 1000, "batch": 1, "heads": 8, "head_dim": 128, "dtype": "bf16",
                         "latency_s": lat, "compute_s": lat / 4, "comm_s": lat * 3 / 4, "bytes_moved": 1.03109e6,
                         "peak_mem_bytes": 2.5e9, "oom": False, "events": 10, "sim_wall_s": 0.01, **point,
                         "point": i})
    return pd.DataFrame(rows)


def test_printed_table_one_unit_per_quantity_plain_numbers_no_repeated_column() -> None:
    frame = pd.DataFrame([{
        "scenario": "g", "algorithm": "tree", "topology": "dgx-h100", "ranks": 8, "nodes": 1, "context": 32768,
        "batch": 1, "heads": 32, "head_dim": 128, "dtype": "bf16", "latency_s": 0.00199164, "compute_s": 0.0016,
        "comm_s": 0.0004, "bytes_moved": 1.03109e6, "peak_mem_bytes": 1.51781e8, "oom": False, "phase": "generate",
        "sequence": 32768, "ttft_s": 0.00144992, "tpot_s": 5.41719e-05, "allreduce": float("nan"),
        "events": 5, "sim_wall_s": 0.1, "workload.prompt": "32K", "workload.layout": "zigzag", "layout": "zigzag",
        "point": 0}])
    text = printed_table(frame)
    header = text.splitlines()[0].split()
    assert {"latency_ms", "ttft_ms", "tpot_ms", "moved_GB", "peak_mem_GB"} <= set(header)
    assert not {"latency_s", "ttft_s", "tpot_s", "sequence", "workload.prompt", "workload.layout", "events",
                "point"} & set(header)
    assert header.count("layout") == 1
    row = dict(zip(header, text.splitlines()[1].split(), strict=True))
    assert (row["tpot_ms"], row["ttft_ms"], row["moved_GB"], row["peak_mem_GB"]) == ("0.05417", "1.45", "0.001031",
                                                                                     "0.1518")
    assert row["allreduce"] == "-" and "e-0" not in text and "e+0" not in text


def test_plain_numbers_and_ratios() -> None:
    assert [plain_number(v) for v in (1031094.3, 0.99996, 0.098, 6.192e-05, 3e-9)] == \
        ["1031094", "1", "0.098", "0.00006192", "3.000e-09"]
    assert (times(1.0004), times(1.0), times(23.41), times(4519.2)) == ("1.000x", "1x", "23.4x", "4,519x")


def test_a_flag_is_drawn_as_categories_and_the_legend_lists_only_what_is_drawn() -> None:
    frame = _decode_rows([{"workload.backward": False, "phase": "prefill"},
                          {"workload.backward": True, "phase": "train"}], {"ring": 2.0, "ulysses": 1.0})
    dims = dims_of(frame)
    assert (dims.x, dims.categorical) == ("phase", True)  # the flag is the phase it names, as categories
    fig = facet_figure(frame, "latency_s", "ms", scale=1e3)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["prefill", "train"]
    assert all(line.get_linestyle() == "None" for line in ax.get_lines() if len(line.get_xdata()) > 1)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["ring", "ulysses"]  # no out-of-memory entry: nothing is out of memory
    plt.close(fig)


def test_a_narrow_log_axis_still_has_readable_ticks() -> None:
    fig, ax = plt.subplots()
    ax.set_yscale("log")
    ax.set_ylim(0.5, 1.1)
    readable_log_axis(ax.yaxis, 0.5, 1.1)
    fig.canvas.draw()
    shown = [t.get_text() for t in ax.get_yticklabels() if 0.5 <= t.get_position()[1] <= 1.1]
    plt.close(fig)
    assert shown == ["0.5", "0.6", "0.7", "0.8", "0.9", "1"]


def test_the_nvswitch_is_labelled_in_the_timeline() -> None:
    rows = [("auto", r, "send", "x", 0.0, 1e-3, 8.0, 1, r == 0, 2, r == 2) for r in range(3)]
    frame = pd.DataFrame(rows, columns=["algorithm", "rank", "kind", "name", "start_s", "end_s", "bytes", "ops",
                                        "critical", "ranks_total", "switch"])
    fig = gantt(frame)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0*", "1", "NVSwitch"]
    assert ax.get_title().startswith("auto: all ranks + the NVSwitch (NVLS")
    plt.close(fig)


def test_a_large_sweep_of_one_algorithm_summarises_its_latency() -> None:
    frame = _decode_rows([{"context": c, "workload.context": c, "workload.layout": lay}
                          for c in range(1000, 61000, 1000) for lay in ("a", "b")], {"ring": 1.0})
    table = summary(frame)
    parts = overview(table, ["workload.layout"], 3, compare=False)
    assert list(parts["per facet"].columns) == ["workload.layout", "points", "latency_ms: min", "median", "max"]
    assert parts["largest"]["context"].tolist() == [60000, 60000, 59000]
    assert "fastest" not in parts["largest"] and "speedup over ring" not in parts["largest"]


def test_a_full_disk_leaves_no_truncated_figure_and_names_the_file(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "report.md").write_text("the old report")
    real = Path.write_bytes

    def full(self: Path, data: bytes) -> int:
        if self.name.startswith(".b.png."):
            real(self, data[:10])  # a part written, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    fig = plt.figure()
    data = png(fig)
    with pytest.raises(OSError) as err:
        write_pages(tmp_path, "t", [Heading("t"), Image("a.png", data), Image("b.png", data)],
                    {"a.png": data, "b.png": data})
    assert err.value.filename == str(tmp_path / "b.png") and err.value.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]  # no PNG, no temporary file
    assert (tmp_path / "report.md").read_text() == "the old report"


def test_a_large_collective_sweep_is_summarised_per_node_count() -> None:
    rows = []
    for point, (nodes, size) in enumerate((n, 2**k) for n in (1, 2, 4) for k in range(10, 30)):
        for algo, rate in (("auto", 3.0), ("ring", 2.0 if nodes > 1 else 3.0), ("tree", 1.0)):
            rows.append({"algorithm": algo, "ranks": 8 * nodes, "nodes": nodes, "bytes": size,
                         "time_s": size / (rate * 1e9), "busbw_GBps": rate * (1 + size / 2**30),
                         "chosen": "ring/Simple" if algo != "tree" else "tree/LL", "collective": "allreduce",
                         "topology_params.nodes": nodes, "workload.bytes": f"{size} B", "point": point})
    blocks = collective_blocks(pd.DataFrame(rows), large=50)
    assert isinstance(blocks[0], Heading) and blocks[0].text == "Conclusions"
    summary_table = next(b.frame for b in blocks if isinstance(b, Table))
    assert summary_table["nodes"].tolist() == [1, 2, 4] and summary_table["points"].tolist() == [20, 20, 20]
    assert summary_table["fastest"].tolist() == ["auto at 20, ring at 20", "auto at 20", "auto at 20"]
    assert summary_table["at"].tolist() == ["512 MiB, ring/Simple"] * 3  # the largest size: the highest busbw


def test_swept_keys_print_by_their_last_name_unless_it_would_mislead() -> None:
    assert short_names(["workload.layout", "workload.flows.1.bytes", "bytes", "workload.model.heads", "heads"]) == \
        {"workload.layout": "layout"}
