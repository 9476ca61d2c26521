"""report.html in a real browser (headless Chromium): every image loads, the console stays clean.

Skipped where Chromium is not installed, except when ``TREERING_REQUIRE_BROWSER=1`` (``.ci/run`` sets it after
installing Debian's ``chromium``), where its absence fails the test.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from chromium_cdp import chromium_path, open_page

from simulator.cli import main
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
