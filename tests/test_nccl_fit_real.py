"""calibrate --from-nccl-tests on the real 2 x 8 H100 log: the check on sizes the fit did not see (slow: the engine
simulates the 16-rank collectives many times)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main

LOG = str(Path(__file__).parent / "fixtures" / "nccltests" / "all_reduce_h100_2x8_a3mega.log")
HELD_OUT_MEDIAN_PCT = 15.0  # the most a fit itself may leave (simulator.nccl_fit_quality.MAX_MEDIAN_ERROR_PCT)


@pytest.mark.slow
def test_fit_on_every_other_size_predicts_the_others(tmp_path, capsys):
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", "--from-nccl-tests", LOG, "-o", str(out)]) == 0
    said = capsys.readouterr().out
    check = next(line for line in said.splitlines() if line.startswith("held-out check (every-other"))
    assert "fitted on 16 sizes, checked on the other 15" in check
    median = float(check.split("median ")[1].split(" %")[0])
    assert median < HELD_OUT_MEDIAN_PCT
    # the fitted topology, validated against the whole log, shows the fit's error
    assert main(["validate", "--nccl-tests", LOG, "--topology", str(out), "-o", str(tmp_path / "v")]) == 0
    frame = pd.read_csv(tmp_path / "v" / "nccl_validation.csv")
    big = frame[frame["bytes"] >= 2**20]
    assert big["error_pct"].abs().median() < HELD_OUT_MEDIAN_PCT
