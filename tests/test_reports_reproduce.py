"""The committed reports' numbers are what the engine computes today: re-simulating their scenarios at the
committed points (the cheap ones) reproduces ``reports/*/results.csv`` to 1e-12 relative.

A change that makes the engine faster must not change an answer; if a model change does on purpose, regenerate
the reports (the command is in each ``meta.json``) in the same commit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from simulator.run.prepare import run_point
from simulator.run.scenario import load_scenario

REPO = Path(__file__).resolve().parent.parent
REPORTS = sorted(p for p in (REPO / "reports").iterdir() if (p / "results.csv").is_file())
NUMBERS = ["latency_s", "compute_s", "comm_s", "bytes_moved", "peak_mem_bytes"]
MAX_RANKS = 16  # cheap points only: the suite stays fast
RTOL = 1e-12


def _committed(report: Path) -> tuple[pd.DataFrame, list]:
    meta = json.loads((report / "meta.json").read_text())
    points = load_scenario(str(REPO / meta["source"]), [])
    return pd.read_csv(report / "results.csv"), points


@pytest.mark.parametrize("report", REPORTS, ids=[p.name for p in REPORTS])
def test_committed_results_are_reproduced(report):
    frame, points = _committed(report)
    checked = 0
    for point in points:
        swept = point.columns()  # as the results hold them (lists and mappings as JSON)
        mine = frame
        for key, value in swept.items():
            mine = mine[mine[key].astype(str) == str(value)]
        if not len(mine) or mine["ranks"].max() > MAX_RANKS:
            continue
        rows = {row["algorithm"]: row for row in run_point(point)}
        assert set(rows) == set(mine["algorithm"]), swept
        for _, old in mine.iterrows():
            new = rows[old["algorithm"]]
            for col in NUMBERS:
                assert math.isclose(new[col], old[col], rel_tol=RTOL, abs_tol=0.0), (swept, old["algorithm"], col)
            assert bool(new["oom"]) == bool(old["oom"])
            checked += 1
    assert checked >= 4  # every report has cheap points
