"""treering validate --nccl-tests: a real nccl-tests log against the simulator, per size, nothing fitted."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main

LOG = str(Path(__file__).parent / "fixtures" / "nccltests" / "all_reduce_h100_2x8_a3mega.log")


def test_a_log_is_compared_size_by_size(tmp_path, capsys):
    out = tmp_path / "v"
    assert main(["validate", "--nccl-tests", LOG, "--topology", "dgx-h100", "--set", "topology_params.nodes=2",
                 "-o", str(out)]) == 0
    frame = pd.read_csv(out / "nccl_validation.csv")
    assert len(frame) == 31 and set(frame["collective"]) == {"allreduce"} and (frame["ranks"] == 16).all()
    assert frame["bytes"].min() == 8 and frame["bytes"].max() == 8 * 2**30
    assert (frame["predicted_busbw_GBps"] > 0).all()
    # the error is the prediction's, relative to the measurement (rows measured at 0 GB/s have none)
    ok = frame[frame["measured_busbw_GBps"] > 0]
    expected = 100 * (ok["predicted_busbw_GBps"] - ok["measured_busbw_GBps"]) / ok["measured_busbw_GBps"]
    assert ok["error_pct"].to_numpy() == pytest.approx(expected.to_numpy())
    assert frame[frame["measured_busbw_GBps"] == 0]["error_pct"].isna().all()
    # large messages run ring over the 8 NIC rails, small ones NCCL's tree with LL, as NCCL's tuning picks them
    assert frame.iloc[-1]["chosen"].startswith("ring/") and frame.iloc[-1]["channels"] == 8
    assert frame.iloc[0]["chosen"] == "tree/LL"
    summary = (out / "summary.md").read_text()
    assert "median |error| of the bus bandwidth" in summary and "sizes of 1 MiB and more" in summary
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["--nccl-tests", LOG, "--topology", "dgx-h100"],
     "all_reduce_h100_2x8_a3mega.log:30: --topology: the topology has 8 GPUs; the nccl-tests run has 16 ranks"),
    (["--nccl-tests", LOG], "--topology: --nccl-tests needs --topology"),
    ([], "validate: needs a scenario (real runs of its schedules) or --nccl-tests LOG"),
])
def test_bad_nccl_tests_validations_exit_2(argv, message, tmp_path, capsys):
    assert main(["validate", *argv, "-o", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "v" / "nccl_validation.csv").exists()
