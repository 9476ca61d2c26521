"""report.html in a real browser (headless Chromium): every image loads, the console stays clean; for each kind of
report (decode, prefill, generate, collective, a 1,000-point sweep, the plan) and what each must say.

Skipped where Chromium is not installed, except when ``TREERING_REQUIRE_BROWSER=1`` (``.ci/run`` sets it after
installing Debian's ``chromium``), where its absence fails the test.
"""

from __future__ import annotations

import itertools
import os
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from chromium_cdp import chromium_path, open_page
from conftest import run_scenario
from PIL import Image

from simulator.cli import main
from simulator.report.figures import MAX_WIDTH_PX
from simulator.report.plan_report import write_plan_report

pytestmark = pytest.mark.slow

SCENARIO = """\
name: browser
topology: dgx-h100
topology_params: {nodes: 1}
workload: {kind: decode, model: {heads: 16, head_dim: 128}, batch: 1, context: 80000, dtype: bf16}
targets: {latency: 1 ms}
algorithms: [ring, tree, single]
sweep:
  topology_params.nodes: [1, 2]
  workload.context: [80000, 40000000]
"""


@pytest.fixture(scope="module", autouse=True)
def _chromium() -> None:
    if chromium_path() is None:
        if os.environ.get("TREERING_REQUIRE_BROWSER") == "1":
            pytest.fail("TREERING_REQUIRE_BROWSER=1 but chromium is not installed (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")


def _assert_clean(path: Path, images: int) -> None:
    page = open_page(path)
    assert page.errors == []
    assert len(page.images) == images
    for img in page.images:
        assert img["complete"] and img["width"] > 100 and img["height"] > 100, img
        assert img["width"] <= MAX_WIDTH_PX, img


def _sections(md: str) -> list[str]:
    return [line for line in md.splitlines() if line.startswith("## ")]


def test_the_checker_sees_broken_images_and_console_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text("<!doctype html><title>bad</title><img alt=a src='data:image/png;base64,AAAA'>"
                   "<img alt=b src='missing.png'><script>console.error('boom')</script>")
    page = open_page(bad)
    assert [(i["alt"], i["width"]) for i in page.images] == [("a", 0), ("b", 0)]
    assert "console: boom" in page.errors
    assert any("missing.png" in e for e in page.errors)


def test_run_report_loads_in_chromium(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO))
    out = tmp_path / "o"
    assert main(["run", str(path), "-o", str(out), "--jobs", "1"]) == 0
    _assert_clean(out / "report.html", 5)  # latency, speedup, memory, bytes, timeline


def test_plan_report_loads_in_chromium(tmp_path: Path) -> None:
    frame = pd.DataFrame({"algorithm": ["ring", "tree"], "nodes": ["-", 1], "gpus": ["-", 8], "tp": [8, 8],
                          "tbt_ms": [80.2, 9.9], "peak_mem_GB": [10.1, 9.2],
                          "binding": ["latency (not met up to 1 nodes)", "none: one node is enough"]})
    cand = tmp_path / "c.yaml"
    cand.write_text(textwrap.dedent("""\
        name: cand
        topology: dgx-h100
        workload: {kind: decode, model: llama-3.2-1b, scope: model, tp: 8, batch: 1, context: 65536, dtype: bf16}
        algorithms: [ring, tree]
        """))
    assert main(["run", str(cand), "-o", str(tmp_path / "c"), "--no-report", "--jobs", "1"]) == 0
    candidates = pd.read_csv(tmp_path / "c" / "results.csv")
    meta = {"model": "llama-3.2-1b", "context": 65536, "target_s": 0.01, "topology": "dgx-h100",
            "command": "treering plan --model llama-3.2-1b --context 64K --tbt 10ms", "capacity_bytes": 80e9}
    write_plan_report(frame, tmp_path / "p", meta, candidates)
    _assert_clean(tmp_path / "p" / "report.html", 2)


PREFILL = """\
name: prefill
topology: dgx-h100
topology_params: {nodes: 1}
workload: {kind: prefill, model: {heads: 8, kv_heads: 8, head_dim: 64}, batch: 1, sequence: 8K, dtype: bf16,
           causal: true, layout: zigzag, backward: false}
algorithms: [ring, allgather]
sweep:
  topology_params.nodes: [1, 2]
  workload.backward: [false, true]
"""


def test_prefill_report_reads_as_a_prefill(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_scenario(tmp_path, PREFILL)
    printed = capsys.readouterr().out
    header = printed.splitlines()[0].split()
    assert "latency_ms" in header and "moved_GB" in header and "peak_mem_GB" in header
    assert "sequence" not in header and "workload.backward" not in header  # they repeat context and phase
    assert "e-0" not in printed and "e+0" not in printed
    md = (out / "report.md").read_text()
    assert _sections(md)[0] == "## Conclusions"
    assert "decode step" not in md and "Prefill / training step latency (ms)" in md
    assert "| nodes | phase | fastest |" in md  # the flag as the phase it names, one column
    _assert_clean(out / "report.html", 5)  # latency, speedup, memory, bytes, timeline


GENERATE = """\
name: generate
topology: dgx-h100
topology_params: {nodes: 1}
workload: {kind: generate, model: {heads: 8, kv_heads: 8, head_dim: 64}, batch: 1, prompt: 4K, new_tokens: 2,
           prefill: ring, layout: zigzag, dtype: bf16}
algorithms: [ring, tree]
sweep:
  topology_params.nodes: [1, 2]
  workload.prompt: [4K, 16K]
"""


def test_generate_report_gives_ttft_and_tpot_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_scenario(tmp_path, GENERATE)
    header = capsys.readouterr().out.splitlines()[0].split()
    assert {"ttft_ms", "tpot_ms", "latency_ms"} <= set(header) and "ttft_s" not in header
    assert "sequence" not in header and "workload.prompt" not in header
    md = (out / "report.md").read_text()
    conclusions = md.split("## Conclusions")[1].split("##")[0]
    assert "Time to first token (the prefill, `ring`, is the same for every decode schedule)" in conclusions
    assert "`ring`'s time per output token / the fastest's" in conclusions
    assert "whose shared prefill counts in both" in conclusions
    assert "| context | nodes | fastest | ranks | tpot_ms | TPOT speedup over ring |" in md  # 2 x 2 panels, not 4 x 2
    _assert_clean(out / "report.html", 7)  # tpot, speedup, ttft, latency, memory, bytes, timeline


COLLECTIVE = """\
name: coll
topology: dgx-h100
topology_params: {nodes: 1}
workload: {kind: collective, collective: allreduce, bytes: 1 MiB, dtype: bf16}
algorithms: [auto, ring, tree]
sweep:
  workload.bytes: [1 MiB, 64 MiB]
"""


def test_collective_report_concludes_and_labels_the_switch(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = run_scenario(tmp_path, COLLECTIVE, "--timeline-point", "1")  # 64 MiB: auto runs NVLS
    printed = capsys.readouterr().out
    header = printed.splitlines()[0].split()
    assert "time_ms" in header and "moved_GB" in header and "workload.bytes" not in header
    assert "e+0" not in printed and "e-0" not in printed
    md = (out / "report.md").read_text()
    assert _sections(md)[:2] == ["## Conclusions", "## Figures"]
    assert "`auto` (NCCL's choice by its predicted time) is the fastest at" in md
    timeline = pd.read_csv(out / "timeline.csv")
    auto = timeline[timeline["algorithm"] == "auto"]
    assert auto.loc[auto["switch"], "rank"].unique().tolist() == [8]  # the NVSwitch, after the 8 GPUs
    _assert_clean(out / "report.html", 2)  # busbw, timeline


def _thousand_points(like: pd.DataFrame) -> pd.DataFrame:
    """A decode results table of 1,000 points (5 node counts x 20 contexts x 2 batches x 5 head counts, ring and
    tree), shaped like ``like`` (a real results.csv), latencies from a smooth made-up model."""
    rows = []
    grid = itertools.product([1, 2, 4, 8, 16], np.geomspace(1e4, 1e7, 20).round(-3).astype(int), [1, 2],
                             [8, 16, 32, 48, 64])
    for point, (nodes, context, batch, heads) in enumerate(grid):
        for algo, cost in (("ring", 4e-9 * context * nodes), ("tree", 5e-5 + 3e-11 * context * heads / nodes)):
            work = context * batch * heads
            rows.append({**like.iloc[0].to_dict(), "algorithm": algo, "ranks": 8 * nodes, "nodes": nodes,
                         "context": context, "batch": batch, "heads": heads, "latency_s": cost * batch,
                         "compute_s": cost * batch / 3, "comm_s": cost * batch * 2 / 3,
                         "bytes_moved": 1e3 * work if algo == "ring" else 2e2 * heads,
                         "peak_mem_bytes": 512.0 * work / nodes, "oom": work / nodes > 6e9,
                         "topology_params.nodes": nodes, "workload.context": context, "workload.batch": batch,
                         "workload.model.heads": heads, "point": point})
    return pd.DataFrame(rows, columns=list(dict.fromkeys([*like.columns, "workload.batch", "workload.model.heads"])))


def test_a_thousand_point_report_opens_with_summaries_and_stays_small(tmp_path: Path) -> None:
    small = run_scenario(tmp_path, SCENARIO.replace("[80000, 40000000]", "[80000]").replace("[ring, tree, single]",
                                                                                      "[ring, tree]"))
    frame = _thousand_points(pd.read_csv(small / "results.csv"))
    results = tmp_path / "big" / "results.csv"
    results.parent.mkdir()
    frame.to_csv(results, index=False)
    assert main(["report", str(results), "-o", str(tmp_path / "r")]) == 0
    out = tmp_path / "r"
    md = (out / "report.md").read_text()
    assert _sections(md)[:2] == ["## Conclusions", "## Figures"]
    assert "1,000 sweep points: the summaries below" in md and "[results.csv](../big/results.csv)" in md
    assert "### The 10 points with the largest speedup" in md
    assert md.count("\n|") < 60  # summaries, not a row per point
    assert (out / "report.html").stat().st_size < 1_000_000
    for png in out.glob("*.png"):
        with Image.open(png) as image:
            assert image.width <= MAX_WIDTH_PX, png
    _assert_clean(out / "report.html", 4)  # latency, speedup, memory, bytes (no timeline.csv beside it)
