"""The floor of identical runs beside every error of `treering validate` (simulator.distributed.floor)."""

from __future__ import annotations

import math
import statistics

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.distributed.floor import floor_lines, timing


def test_the_floor_is_the_difference_of_the_two_halves():
    got = timing([1.0, 1.2, 1.1, 2.0, 2.2, 2.1])  # halves' medians 1.1 and 2.1; the median of all 1.6
    assert got["measured_s"] == pytest.approx(1.6)
    assert got["floor_pct"] == pytest.approx(100 * 1.0 / 1.6)
    assert math.isnan(timing([1.0, 2.0, 3.0])["floor_pct"])  # under four iterations: not measured
    assert timing([5.0])["measured_q1_s"] == 5.0


@given(st.lists(st.floats(1e-6, 1e3), min_size=4, max_size=40))
def test_identical_halves_have_no_floor_and_it_never_exceeds_the_spread(times):
    got = timing(times)
    assert got["measured_s"] == statistics.median(times)
    assert 0 <= got["floor_pct"] <= 100 * (max(times) - min(times)) / got["measured_s"] + 1e-9
    assert timing(times[: len(times) // 2] * 2)["floor_pct"] == 0.0


def _frame(errors, floors):
    return pd.DataFrame({"error_pct": errors, "floor_pct": floors})


def test_the_summary_gives_the_error_in_multiples_of_the_floor_and_the_target():
    lines = floor_lines(_frame([-12.0, 6.0, 30.0], [4.0, 8.0, 10.0]))
    assert lines[0] == ("- floor of identical runs (the two halves of each point's timed iterations): median 8.0 %, "
                        "90th percentile 9.6 %; median |error| 12.0 % = 1.5 x the floor; |error| within 1.5 x its "
                        "own row's floor at 1 of 3")
    assert lines[1] == "- target median |error| <= max(10 %, 1.5 x floor) = 12.0 %: met"
    assert floor_lines(_frame([20.0], [2.0]))[1].endswith("= 10.0 %: not met")
    assert floor_lines(_frame([20.0], [math.nan])) == [
        "- floor of identical runs: not measured (it needs --iters >= 4)"]


def test_a_calibration_noisier_than_ten_percent_is_refused_unless_forced():
    from types import SimpleNamespace

    from simulator.distributed.calibrate import PoorFit, check_spread

    quiet = [SimpleNamespace(spread=(0.02, 0.05, 0.3)), SimpleNamespace(spread=(0.08,))]  # median 6.5 %
    noisy = [SimpleNamespace(spread=(0.12, 0.2, 0.05))]  # median 12 %
    check_spread(quiet, force=False)  # type: ignore[arg-type]
    with pytest.raises(PoorFit, match=r"spread 12\.0% .* over the 10% a calibration may carry"):
        check_spread(noisy, force=False)  # type: ignore[arg-type]
    check_spread(noisy, force=True)  # type: ignore[arg-type]
    check_spread([], force=False)  # profiles taken from an earlier calibration: nothing measured here
