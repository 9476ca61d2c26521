"""Reports that conclude: the summary, out-of-memory points, targets, figures readable at many series."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_scenario

from simulator.cli import main
from simulator.report.conclude import feasible, headline, summary
from simulator.report.document import Code, Heading, Items, Para, Table, to_html, to_markdown
from simulator.report.figures import dims_of, facet_figure, png

OOM_SCENARIO = """\
name: oom
topology: dgx-h100
topology_params: {nodes: 1}
workload: {kind: decode, model: {heads: 16, head_dim: 128}, batch: 1, context: 80000, dtype: bf16}
targets: {latency: 1 ms}
algorithms: [ring, tree, single]
sweep:
  workload.context: [80000, 40000000]
"""

MANY_SERIES = """\
name: many
topology: dgx-h100
topology_params: {nodes: 1}
workload: {kind: decode, model: {heads: 8, head_dim: 128}, batch: 1, context: 8192, dtype: bf16}
algorithms: [ring, ring-q, tree, {name: tree, allreduce: ring}, {name: tree, allreduce: recursive-doubling},
  tree-p2p, {name: tree-p2p, topology_aware: true}]
sweep:
  topology_params.nodes: [1, 2]
  workload.context: [8192, 65536]
  workload.batch: [1, 2]
  workload.model.heads: [8, 32]
"""


@pytest.fixture(scope="module")
def oom_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_scenario(tmp_path_factory.mktemp("oom"), OOM_SCENARIO)


def test_summary_names_the_fastest_feasible_and_lists_oom(oom_run: Path) -> None:
    frame = pd.read_csv(oom_run / "results.csv")
    big = frame[frame["context"] == 40_000_000].set_index("algorithm")
    # 327 GB of KV on one 80 GB GPU; ring's 40 GB shard plus its receive buffer: 81.9 GB
    assert big["oom"].to_dict() == {"ring": True, "tree": False, "single": True}
    table = summary(frame, 1e-3).set_index("context")
    assert table.loc[40_000_000, "fastest"] == "tree"
    assert table.loc[40_000_000, "out of memory"] == "ring, single"
    assert table.loc[40_000_000, "speedup over ring"] == "(ring out of memory)"  # no speedup over an OOM baseline
    assert table.loc[80_000, "out of memory"] == "-"
    small = frame[frame["context"] == 80_000].set_index("algorithm")["latency_s"]
    assert table.loc[80_000, "speedup over ring"] == f"{small['ring'] / small['tree']:.3g}x"
    assert table.loc[80_000, "next best"] == f"single ({small['single'] / small['tree']:.3g}x the latency of tree)"
    assert table.loc[40_000_000, "target 1 ms"].startswith("missed")
    assert table.loc[80_000, "target 1 ms"] == "met"
    md = (oom_run / "report.md").read_text()
    assert md.index("## Conclusions") < md.index("## Figures") < md.index("## Decode step latency (ms)")
    assert "Out of device memory: 2 rows at 1 points" in md
    assert f"| 40000000 | 8 | {big.loc['ring', 'latency_s'] * 1e3:.4g} OOM |" in md
    assert json.loads((oom_run / "meta.json").read_text())["targets"] == {"latency_s": 0.001}


def test_an_oom_row_never_wins_nor_serves_as_the_baseline(oom_run: Path) -> None:
    """The real results, with the fastest algorithm marked out of memory as well: the runner-up wins."""
    frame = pd.read_csv(oom_run / "results.csv")
    frame.loc[frame["algorithm"] == "tree", "oom"] = True
    table = summary(frame).set_index("context")
    assert table.loc[80_000, "fastest"] == "single" and table.loc[80_000, "out of memory"] == "tree"
    assert table.loc[40_000_000, "fastest"] == "none (all out of memory)"
    assert table.loc[40_000_000, "out of memory"] == "ring, tree, single"
    lines = headline(summary(frame), frame)
    assert lines[0] == "Fastest algorithm that fits in memory: `single` at 1 of 2 sweep points."
    assert "4 rows at 2 points" in lines[-1]
    assert list(frame.loc[feasible(frame), "algorithm"]) == ["ring", "single"]


def test_target_needs_a_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(OOM_SCENARIO.replace("latency: 1 ms", "latency: 50"))
    assert main(["run", str(path), "-o", str(tmp_path / "o")]) == 2
    assert "s.yaml:5: targets.latency: give a unit, e.g. '50 ms', got 50" in capsys.readouterr().err


def test_oom_points_are_drawn_hollow_and_crossed(oom_run: Path) -> None:
    frame = pd.read_csv(oom_run / "results.csv")
    fig = facet_figure(frame, "latency_s", "ms", scale=1e3)
    hollow = [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_markerfacecolor() == "none"]
    crosses = [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_marker() == "x"]
    assert len(hollow) == len(crosses) == 2  # ring and single at 40M tokens
    drawn = sorted(y for ln in hollow for y in ln.get_ydata())
    assert drawn == sorted(frame.loc[frame["oom"], "latency_s"] * 1e3)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "out of memory (hollow, crossed)" in labels
    png(fig)


def test_many_series_colour_is_the_algorithm_style_the_parameter_legend_outside(tmp_path: Path) -> None:
    out = run_scenario(tmp_path, MANY_SERIES, "--no-report")
    frame = pd.read_csv(out / "results.csv")
    dims = dims_of(frame)
    assert (dims.x, dims.col, dims.row, dims.style) == ("ranks", "context", "batch", ("heads",))  # the rows' names
    fig = facet_figure(frame, "latency_s", "decode step latency (ms)", scale=1e3)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 4
    series = [ln for ax in axes for ln in ax.get_lines() if ln.get_linestyle() != "None"]
    assert len(series) == 7 * 2 * 4  # algorithms x heads, in each of the 4 panels
    by_algo: dict[str, set[object]] = {}
    legend = fig.legends[0]
    labels = [t.get_text() for t in legend.get_texts()]
    colours = {label: tuple(h.get_color()) for label, h in zip(labels, legend.legend_handles, strict=True)
               if not label.startswith("heads=")}
    assert len(set(colours.values())) == len(colours) == 7  # one distinct colour per algorithm
    styles = {label: (h.get_linestyle(), h.get_marker()) for label, h in zip(labels, legend.legend_handles,
                                                                             strict=True) if label.startswith("heads=")}
    assert set(styles) == {"heads=8", "heads=32"} and len(set(styles.values())) == 2
    for ln in series:
        by_algo.setdefault(ln.get_color(), set()).add(ln.get_linestyle())
    assert all(len(s) == 2 for s in by_algo.values())
    fig.canvas.draw()
    box = legend.get_window_extent()
    assert all(not box.overlaps(ax.get_window_extent()) for ax in axes)  # the legend covers no data
    assert box.x1 <= fig.bbox.x1 + 1 and box.y0 >= fig.bbox.y0 - 1  # and is not cut off
    (tmp_path / "many.png").write_bytes(png(fig))


def test_html_has_code_and_tables_without_empty_columns() -> None:
    frame = pd.DataFrame({"context": [80000], "tree": [0.07289], "note": ["a | b"]})
    blocks = [Heading("t", 1), Items(("scenario: `s.yaml`",)), Code("treering run s.yaml"), Para("x < y"),
              Table(frame)]
    page = to_html(blocks, "t")
    assert "<code>s.yaml</code>" in page and "<pre><code>treering run s.yaml</code></pre>" in page
    assert "<th></th>" not in page and "<td></td>" not in page and "x &lt; y" in page
    assert "<tr><th>context</th><th>tree</th><th>note</th></tr>" in page
    md = to_markdown(blocks)
    assert "| context | tree | note |" in md and "a \\| b" in md and "```\ntreering run s.yaml\n```" in md


def test_plan_report_states_the_answer(tmp_path: Path) -> None:
    from simulator.plan.cli import plan_frame
    from simulator.plan.decode import PlanRequest, plan
    from simulator.report.plan_report import write_plan_report

    req = PlanRequest(model="llama-3.2-1b", context=65536, tbt_s=0.01, topology="dgx-h100",
                      algorithms=["ring", "tree"], max_nodes=2)
    table = plan_frame(plan(req), req)
    meta = {"model": req.model, "context": req.context, "target_s": req.tbt_s, "topology": req.topology,
            "command": "treering plan --model llama-3.2-1b --context 64K --tbt 10ms --max-nodes 2", "version": "x"}
    written = write_plan_report(table, tmp_path / "p", meta)
    assert {p.name for p in written} == {"report.md", "report.html", "plan.csv", "meta.json"}
    md = (tmp_path / "p" / "report.md").read_text()
    assert table["nodes"].tolist() == [1, 1]  # both meet 10 ms on one node: the faster is the answer
    best = table.sort_values("tbt_ms").iloc[0]
    assert (f"Smallest configuration that meets a time between tokens of 10 ms: `{best['algorithm']}` on 1 node(s), "
            f"8 GPUs, 8 way tensor parallel, {best['tbt_ms']:.4g} ms, {best['peak_mem_GB']:.4g} GB per GPU.") in md
    assert "# treering plan: llama-3.2-1b, context 65,536 tokens" in md
    assert pd.read_csv(tmp_path / "p" / "plan.csv")["algorithm"].tolist() == ["ring", "tree"]


def test_speedups_are_over_the_first_algorithm_unless_a_baseline_is_named(oom_run: Path) -> None:
    frame = pd.read_csv(oom_run / "results.csv")
    assert "speedup over ring" in summary(frame).columns  # ring is the scenario's first algorithm
    flipped = pd.concat([frame[frame["algorithm"] == "tree"], frame[frame["algorithm"] != "tree"]])
    table = summary(flipped).set_index("context")
    assert table.loc[80_000, "speedup over tree"] == "1x"  # tree is the fastest: 1x over itself
    assert "over `tree`" in headline(summary(flipped), flipped)[1]
    assert summary(frame, baseline="single").set_index("context").loc[40_000_000, "speedup over single"] == \
        "(single out of memory)"


def test_plan_report_when_nothing_meets_the_target_shows_the_fastest_that_fits() -> None:
    from simulator.report.plan_report import plan_conclusion

    # the planner's table: nodes is None where nothing fits; met False with the fastest fitting configuration
    frame = pd.DataFrame.from_records([
        {"algorithm": "ring", "met": False, "nodes": None, "gpus": None, "tp": None, "tbt_ms": None,
         "peak_mem_GB": None, "binding": "memory", "bottleneck": None},
        {"algorithm": "tree", "met": False, "nodes": 3, "gpus": 24, "tp": 8, "tbt_ms": 61.5, "peak_mem_GB": 70.2,
         "binding": "latency", "bottleneck": "attention over NICs"}])
    lines = plan_conclusion(frame, {"target_s": 0.05})
    assert lines == ["No algorithm meets a time between tokens of 50 ms within the search.",
                     "The fastest configuration that fits: `tree` on 3 node(s), 24 GPUs, 8 way tensor parallel, "
                     "61.5 ms, 70.2 GB per GPU.",
                     "`ring` does not meet it (binding: memory).",
                     "`tree` does not meet it (binding: latency; bottleneck: attention over NICs)."]


def test_point_views_kept_are_the_same_views_handed_out_as_copies():
    """Laying out a report works each frame's point view out once (point_views_kept): the same view and keys as
    without it, and a copy each time (a caller that adds a column changes no later caller's view)."""
    from simulator.report.conclude import point_view, point_views_kept

    frame = pd.DataFrame({"algorithm": ["ring", "tree"] * 4, "nodes": [1, 1, 2, 2] * 2,
                          "topology_params.nodes": [1, 1, 2, 2] * 2, "context": [80000] * 4 + [640000] * 4,
                          "workload.context": [80000] * 4 + [640000] * 4,
                          "latency_s": [1e-3 * (i + 1) for i in range(8)]})
    view, keys = point_view(frame)
    with point_views_kept():
        first, first_keys = point_view(frame)
        first["_key"] = "changed"
        first_keys.append("_key")
        again, again_keys = point_view(frame)
        other = point_view(frame[frame["algorithm"] == "ring"])[0]
    pd.testing.assert_frame_equal(again, view)
    assert again_keys == keys == ["context", "nodes"]
    pd.testing.assert_frame_equal(other, point_view(frame[frame["algorithm"] == "ring"])[0])


def test_summary_of_a_point_ties_oom_and_points_in_sweep_order() -> None:
    """Per point, in the points' order: the fastest feasible row (a tie: the first in the results' order), the
    baseline's speedup, the runner-up, the rows out of memory (in the results' order) or ``-``; a point whose rows all
    ran out of memory has no fastest."""
    frame = pd.DataFrame({
        "algorithm": ["ring", "tree", "single"] * 3,
        "latency_s": [2e-3, 1e-3, 1e-3, 4e-3, 5e-3, 9e-3, 1e-3, 2e-3, 3e-3],
        "comm_s": [1.5e-3, 1e-4, 0.0, 3e-3, 1e-3, 0.0, 5e-4, 1e-3, 0.0],
        "ranks": [8, 8, 1, 16, 16, 1, 32, 32, 1],
        "oom": [False, False, False, False, True, True, True, True, True],
        "nodes": [1, 1, 1, 2, 2, 2, 4, 4, 4],
        "topology_params.nodes": [1, 1, 1, 2, 2, 2, 4, 4, 4],
        "workload.context": [8192, 8192, 8192, 4096, 4096, 4096, 1024, 1024, 1024],
        "context": [8192, 8192, 8192, 4096, 4096, 4096, 1024, 1024, 1024],
    })
    table = summary(frame, target_s=3e-3)  # points by context (the first key), ascending
    assert list(table["context"]) == [1024, 4096, 8192] and list(table["nodes"]) == [4, 2, 1]
    assert list(table["fastest"]) == ["none (all out of memory)", "ring", "tree"]
    assert list(table["speedup over ring"]) == ["", "1x", "2x"]
    assert table["next best"][2] == "single (1x the latency of tree)" and table["next best"][1] == ""
    assert list(table["out of memory"]) == ["ring, tree, single", "tree, single", "-"]
    assert list(table["bound by"]) == ["memory", "communication (75% of the latency)",
                                       "compute (90% of the latency)"]
    assert list(table["target 3 ms"]) == ["not met", "missed (1.33x over)", "met"]
    assert table["ranks"][2] == 8 and table["latency_ms"][2] == 1.0
