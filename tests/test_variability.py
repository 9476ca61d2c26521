"""Run-to-run variability (simulator.engine.trials, a scenario's variability:): closed forms, determinism, bounds."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator.cli import main
from simulator.cluster.devices import compute_time
from simulator.engine import simulate
from simulator.engine.trials import lognormal_factors, trial_makespans
from simulator.run.prepare import run_point
from simulator.run.scenario import load_scenario
from simulator.schedule.core import Schedule
from tests.conftest import star


def test_the_draws_have_mean_one_and_the_coefficient_of_variation_asked_for() -> None:
    for cv in (0.03, 0.3, 1.0):
        x = lognormal_factors(np.random.default_rng(7), 400_000, cv)
        assert x.min() > 0
        assert x.mean() == pytest.approx(1.0, abs=4 * cv / math.sqrt(len(x)) + 1e-4)
        assert x.std() / x.mean() == pytest.approx(cv, rel=0.03)
    assert (lognormal_factors(np.random.default_rng(7), 5, 0.0) == 1.0).all()


def test_one_kernel_lasts_its_duration_times_each_draw() -> None:
    """Closed form: a schedule of one kernel takes t x the trial's factor, the factors drawn in trial order."""
    cluster = star(2)
    s = Schedule(2)
    s.add_compute(0, "k", flops=1e12, dtype="bf16")
    t = compute_time(cluster.specs["h0"], 1e12, 0.0, "bf16")
    times = trial_makespans(s, cluster, 20, 0.2, 0.0, seed=3)
    expected = [t * lognormal_factors(np.random.default_rng((3, k)), 1, 0.2)[0] for k in range(20)]
    assert times.tolist() == expected
    assert trial_makespans(s, cluster, 20, 0.2, 0.0, seed=3, jobs=3).tolist() == expected  # shared by processes


def test_one_transfer_drains_its_bytes_times_each_draw() -> None:
    """A transfer's latency stays, its bytes' time over the link is stretched by the draw."""
    cluster = star(2, bw="10 GB/s", lat="1 us")
    s = Schedule(2)
    s.add_transfer(0, 1, 1e8, "x")
    times = trial_makespans(s, cluster, 10, 0.0, 0.5, seed=5)
    for k, got in enumerate(times.tolist()):
        f = lognormal_factors(np.random.default_rng((5, k)), 1, 0.5)[0]
        assert got == pytest.approx(2e-6 + 1e8 * f / 10e9, rel=1e-12)


def test_no_variation_gives_the_plain_simulation_to_the_last_float() -> None:
    cluster = star(4, bw="20 GB/s", lat="1 us")
    s = Schedule(4)
    k = [s.add_compute(r, "k", flops=1e11 * (r + 1), dtype="bf16") for r in range(4)]
    for r in range(4):
        s.add_transfer(r, (r + 1) % 4, 1e7, "x", send_deps=(k[r],))
    plain = simulate(s, cluster).makespan
    assert trial_makespans(s, cluster, 3, 0.0, 0.0, seed=1).tolist() == [plain] * 3


SCENARIO = """
name: v
topology: dgx-h100
topology_params: {nodes: 2}
workload: {kind: decode, model: {heads: 16, head_dim: 128}, context: 64000, dtype: bf16}
algorithms: [ring, tree]
variability: %s
"""


def _rows(tmp_path: Path, variability: str) -> list[dict[str, object]]:
    path = tmp_path / "v.yaml"
    path.write_text(textwrap.dedent(SCENARIO % variability))
    (point,) = load_scenario(path)
    return run_point(point)


def test_one_trial_without_variation_reproduces_the_row(tmp_path: Path) -> None:
    for row in _rows(tmp_path, "{trials: 1}"):
        assert row["trials"] == 1
        assert row["p50_s"] == row["p90_s"] == row["p99_s"] == row["max_s"] == row["latency_s"]


def test_the_same_seed_gives_the_same_trials_and_another_seed_others(tmp_path: Path) -> None:
    a = _rows(tmp_path, "{kernel_cv: 0.05, link_cv: 0.05, seed: 4, trials: 20}")
    b = _rows(tmp_path, "{kernel_cv: 0.05, link_cv: 0.05, seed: 4, trials: 20}")
    c = _rows(tmp_path, "{kernel_cv: 0.05, link_cv: 0.05, seed: 5, trials: 20}")
    keys = ("p50_s", "p90_s", "p99_s", "max_s")
    for x, y, z in zip(a, b, c, strict=True):
        assert [x[k] for k in keys] == [y[k] for k in keys]
        assert [x[k] for k in keys] != [z[k] for k in keys]
        assert x["p50_s"] <= x["p90_s"] <= x["p99_s"] <= x["max_s"]  # type: ignore[operator]
        assert x["latency_s"] == y["latency_s"] == z["latency_s"]  # the row's own latency is not varied


def test_variability_in_the_csv_and_its_bounds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(textwrap.dedent(SCENARIO % "{kernel_cv: 0.02, trials: 5}"))
    assert main(["run", str(path), "-o", str(tmp_path / "o"), "--jobs", "1"]) == 0
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert list(df.columns[-7:]) == ["trials", "p50_s", "p90_s", "p99_s", "max_s", "point", "allreduce"]
    assert (tmp_path / "o" / "tail.png").stat().st_size > 1000  # the report's figure of the trials
    assert "![tail.png](tail.png)" in (tmp_path / "o" / "report.md").read_text()
    capsys.readouterr()
    for setting, message in (("variability.trials=20000", "variability.trials: 20,000 trials (limit 10,000)"),
                             ("variability.kernel_cv=-1", "variability.kernel_cv: a coefficient of variation must "
                                                          "be a number in [0, 2], got -1")):
        out = tmp_path / "bad"
        assert main(["run", str(path), "-o", str(out), "--jobs", "1", "--set", setting]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]
        assert not (out / "results.csv").exists()


def test_variability_is_refused_where_a_row_is_not_one_schedule(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(textwrap.dedent("""
        name: g
        topology: dgx-h100
        workload: {kind: decode, model: llama-3.1-8b, context: 8000, scope: model, tp: 8}
        variability: {kernel_cv: 0.1, trials: 3}
        """))
    assert main(["run", str(path), "-o", str(tmp_path / "o"), "--jobs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("variability: applies to decode and prefill workloads of scope: attention and to "
                        "collective workloads (one schedule per row)")
    assert f"{path}:5:" in err


def test_the_issue_case_is_within_the_bounds_and_more_is_refused(tmp_path: Path) -> None:
    """100 trials of ring decode at P = 256 are accepted; 2,000 would simulate too many ops (--force runs them)."""
    from simulator.errors import InputError
    from simulator.run.prepare import prepare_point

    path = tmp_path / "big.yaml"
    path.write_text(textwrap.dedent(SCENARIO % "{kernel_cv: 0.05, trials: 100}").replace("nodes: 2", "nodes: 32"))
    (point,) = load_scenario(path, ["algorithms=[ring]"])
    assert len(prepare_point(point).cluster.ranks) == 256
    (point,) = load_scenario(path, ["algorithms=[ring]", "variability.trials=2000"])
    with pytest.raises(InputError, match=r"variability\.trials: 2,000 trials of schedules of about"):
        prepare_point(point)
    (point,) = load_scenario(path, ["algorithms=[ring]", "variability.trials=2000"], force=True)
    prepare_point(point)
