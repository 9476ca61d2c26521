"""The machine's drift against its calibration (simulator.distributed.drift): which point is re-timed, how its
calibrated time is read, and how the summary splits the errors by it."""

from __future__ import annotations

import itertools
import math

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("torch")

import torch

from simulator.algorithms import build_schedule
from simulator.cluster.topology import load_topology
from simulator.distributed.drift import (
    dominant_kernel,
    drift_before,
    measure_drift,
    nearest_grid_point,
    profiled_seconds,
)
from simulator.distributed.validate import drift_lines
from simulator.kernels.profiles import KernelProfile, profile_to_yaml
from simulator.run.prepared import layout_of
from simulator.workloads.shape import DecodeShape
from tests.test_kernel_model import _topology_with

GRID = ((2.0**15, 2.0**18, 2.0**21), (32.0, 128.0), (1.0, 2.0, 4.0))


def numbered() -> KernelProfile:
    """A profile whose time at each grid point is its row-major index + 1 (milliseconds)."""
    seconds = tuple(1e-3 * (i + 1) for i in range(math.prod(len(g) for g in GRID)))
    return KernelProfile("attend", "fp32", ("kv_bytes", "head_dim", "group"), GRID, seconds)


def test_the_calibrated_time_of_every_grid_point_is_read_back() -> None:
    p = numbered()
    for i, point in enumerate(itertools.product(*GRID)):
        assert profiled_seconds(p, point) == 1e-3 * (i + 1)
        assert p.predict(point)[0] == pytest.approx(profiled_seconds(p, point), rel=1e-12)


@given(st.floats(1e3, 1e8), st.floats(8, 512), st.floats(0.5, 8))
def test_the_nearest_grid_point_is_nearest_in_log_space_on_every_axis(kv: float, hd: float, g: float) -> None:
    point = nearest_grid_point(numbered(), (kv, hd, g))
    for values, x, chosen in zip(GRID, (kv, hd, g), point, strict=True):
        assert chosen in values
        assert all(abs(math.log(chosen / x)) <= abs(math.log(v / x)) + 1e-12 for v in values)


def test_halfway_between_two_grid_values_the_smaller_is_taken() -> None:
    # head_dim 64 lies halfway between 32 and 128 (exactly, in base 2); kv 2^27 between 2^26 and 2^28
    assert nearest_grid_point(numbered(), (2.0**18, 64.0, 2.0)) == (2.0**18, 32.0, 2.0)
    wide = KernelProfile("attend", "fp32", ("kv_bytes",), ((2.0**26, 2.0**28),), (1.0, 2.0))
    assert nearest_grid_point(wide, (2.0**27,)) == (2.0**26,)


def test_the_dominant_kernel_is_the_largest_share_of_rank_zero_compute(tmp_path) -> None:
    p = numbered()
    small = KernelProfile("finalize", "fp32", ("elems",), ((1.0, 1e6),), (1e-6, 1e-6))
    cluster = load_topology(_topology_with(tmp_path, {"attend": {"fp32": profile_to_yaml(p)},
                                                      "finalize": {"fp32": profile_to_yaml(small)}}))
    shape = DecodeShape(batch=1, heads=8, head_dim=100, kv_heads=4, context=3000, dtype="fp32")
    sched = build_schedule("ring", {}, shape, layout_of(cluster))
    found = dominant_kernel(sched, cluster.specs["g0"])
    assert found is not None
    profile, point = found
    assert profile.kernel == "attend" and profile.dtype == "fp32"
    attend = next(op for op in sched.ops if op.rank == 0 and op.fn == "attend")
    assert point == nearest_grid_point(profile, attend.dims) and point[1:] == (128.0, 2.0)
    # fp64 has no profile on this device: nothing to re-time
    fp64 = build_schedule("ring", {}, DecodeShape(1, 8, 100, 4, 3000, "fp64"), layout_of(cluster))
    assert dominant_kernel(fp64, cluster.specs["g0"]) is None
    # nothing timed (and no rank waits on another) with --no-drift, or where nothing is profiled
    cpu = torch.device("cpu")
    assert math.isnan(drift_before(sched, cluster, layout_of(cluster), cpu, enabled=False))
    assert math.isnan(drift_before(fp64, cluster, layout_of(cluster), cpu))
    # a profile timed with a second copy running cannot be reproduced by a run of one rank per host: not timed
    loaded = KernelProfile("attend", "fp32", profile.axes, profile.grid, profile.seconds, loaded=2)
    assert math.isnan(measure_drift(loaded, point, cpu, local_ranks=1))


def test_over_rows_the_point_re_timed_has_the_schedule_s_rows(tmp_path) -> None:
    """A profile over rows: the dominant kernel's nearest point carries the rows nearest the workload's, and the
    call built to re-time it splits its KV bytes into those rows."""
    from simulator.distributed.profile_kernels import build_point

    grid = (*GRID, (1.0, 4.0, 16.0))
    seconds = tuple(1e-3 * (i + 1) for i in range(math.prod(len(g) for g in grid)))
    p = KernelProfile("attend", "fp32", ("kv_bytes", "head_dim", "group", "rows"), grid, seconds)
    cluster = load_topology(_topology_with(tmp_path, {"attend": {"fp32": profile_to_yaml(p)}}))
    shape = DecodeShape(batch=3, heads=24, head_dim=100, kv_heads=4, context=3000, dtype="fp32")  # 12 rows
    sched = build_schedule("ring", {}, shape, layout_of(cluster))
    found = dominant_kernel(sched, cluster.specs["g0"])
    assert found is not None
    profile, point = found
    assert point[1:] == (128.0, 4.0, 16.0) and profiled_seconds(profile, point) in seconds
    state = build_point("attend", "fp32", point, torch.device("cpu"))()
    assert tuple(state.o.shape) == (1, 16 * 4, 1, 128)  # 16 rows (KV heads of batch 1) x group 4 query heads


def test_the_summary_splits_errors_by_the_machine_s_drift() -> None:
    frame = pd.DataFrame({"error_pct": [5.0, -7.0, 40.0, -60.0, 3.0], "drift": [1.02, 0.95, 1.4, 1.5, math.nan]})
    (line,) = drift_lines(frame)
    assert "median 1.21x, range 0.95-1.50x" in line
    assert "within 10% at 2 of 4 (median |error| 6.0 %)" in line and "beyond at 2 of 4 (median |error| 50.0 %)" in line
    assert drift_lines(frame.assign(drift=math.nan)) == [] and drift_lines(frame.drop(columns="drift")) == []
