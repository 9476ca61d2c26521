"""Kernel profiles over shapes: interpolation, extrapolation, the YAML contract, and the engine using them."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from simulator.algorithms import build_schedule
from simulator.cluster.devices import compute_time
from simulator.cluster.topology import load_topology
from simulator.distributed.measure import median_ci, robust_time
from simulator.engine.core import simulate
from simulator.errors import InputError
from simulator.kernels.profiles import KernelProfile, profile_to_yaml
from simulator.run.prepared import layout_of
from simulator.workloads.shape import DecodeShape

GRID = ((1e4, 1e6, 1e8), (32.0, 128.0), (1.0, 4.0))


def power_law(kv_bytes: float, head_dim: float, group: float) -> float:
    """A kernel whose time is a product of powers: exactly what log-space interpolation reproduces."""
    return 2e-5 * (kv_bytes / 1e4) ** 0.8 * (head_dim / 32) ** -0.3 * group ** 0.5


def profile(fn=power_law) -> KernelProfile:
    seconds = tuple(fn(*p) for p in itertools.product(*GRID))
    return KernelProfile("attend", "fp32", ("kv_bytes", "head_dim", "group"), GRID, seconds)


def test_grid_points_are_reproduced_exactly() -> None:
    p = profile(lambda a, b, c: 1e-4 * (1 + a % 7 + b % 5 + c))  # no structure at all
    for point in itertools.product(*GRID):
        t, outside = p.predict(point)
        assert t == pytest.approx(1e-4 * (1 + point[0] % 7 + point[1] % 5 + point[2]), rel=1e-12)
        assert outside == ()


@settings(max_examples=60, deadline=None)
@given(st.floats(1e4, 1e8), st.floats(32, 128), st.floats(1, 4))
def test_power_laws_are_interpolated_exactly(kv_bytes: float, head_dim: float, group: float) -> None:
    t, outside = profile().predict((kv_bytes, head_dim, group))
    assert t == pytest.approx(power_law(kv_bytes, head_dim, group), rel=1e-9)
    assert outside == ()


def test_extrapolation_continues_the_end_segment_and_is_reported() -> None:
    p = profile()
    t, outside = p.predict((1e9, 256.0, 4.0))  # 10x the largest kv_bytes, 2x the largest head_dim
    assert t == pytest.approx(power_law(1e9, 256.0, 4.0), rel=1e-9)  # a power law extrapolates exactly too
    assert outside == ("kv_bytes", "head_dim")
    assert p.predict((5e3, 64.0, 2.0))[1] == ("kv_bytes",)


def test_between_points_the_time_is_monotone_where_the_grid_is() -> None:
    p = profile()
    xs = [10 ** (4 + 4 * i / 50) for i in range(51)]
    ts = [p.predict((x, 64.0, 2.0))[0] for x in xs]
    assert all(a < b for a, b in itertools.pairwise(ts))


TILED_GROUPS = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 16.0, 32.0)  # calibrate's group axis


def tiled(a: float, per_row: float, per_tile: float, m: int):
    """A kernel whose matrix products run their rows in tiles of ``m``: every row left over costs ``per_row`` (it
    streams the KV again), every full tile ``per_tile``; times scale with the KV bytes."""
    return lambda kv, d, g: kv * 1e-9 * (a + per_row * (int(g) % m) + per_tile * (int(g) // m))


def tiled_profile(law) -> KernelProfile:
    grid = ((1e6, 1e8), (64.0, 128.0), TILED_GROUPS)
    return KernelProfile("attend", "fp64", ("kv_bytes", "head_dim", "group"), grid,
                         tuple(law(*p) for p in itertools.product(*grid)))


def test_a_group_beyond_the_dense_counts_costs_its_full_tiles_and_its_left_over_rows() -> None:
    # the shape of what an AVX2 CPU measured (fp64, 64 MiB): 4 rows a tile, each left-over row a whole KV pass
    law = tiled(1.0, 1.0, 0.7, 4)
    p = tiled_profile(law)
    assert p.tile() == (4, 8)
    for g in (9, 10, 11, 17, 18, 19, 33, 34):  # q * 4 on the grid (8, 16, 32): exact
        t, outside = p.predict((3e7, 96.0, float(g)))
        assert t == pytest.approx(law(3e7, 96.0, g), rel=1e-9), g
        assert outside == (("group",) if g > 32 else ())
    # a plain power law between the grid's 8 and 16 would put 11 (two tiles and three rows) below 16 (four tiles)
    assert p.predict((1e6, 64.0, 11.0))[0] > p.predict((1e6, 64.0, 16.0))[0]
    # within the dense counts and on the grid nothing changes: the measured times themselves
    for g in TILED_GROUPS:
        assert p.predict((1e8, 128.0, g))[0] == pytest.approx(law(1e8, 128.0, g), rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.1, 10), st.floats(0.05, 5), st.sampled_from([2, 4]), st.integers(9, 32))
def test_tiled_laws_are_predicted_exactly_where_the_full_tiles_are_profiled(a: float, per_row: float, m: int,
                                                                            g: int) -> None:
    per_tile = 0.8 * (a + per_row * (m - 1)) - a  # a drop at g = m: the tile's rows cost less than left over
    law = tiled(a, per_row, max(per_tile, 0.0), m)
    ratio = law(1e8, 128.0, m) / law(1e8, 128.0, m - 1)
    assume(abs(ratio - 0.9) > 1e-9)  # the detection's threshold, computed the code's way (mean log) off its edge
    p = tiled_profile(law)
    assert p.tile() == ((m, 8) if ratio <= 0.9 else None)
    if p.tile() and (g // m) * m in TILED_GROUPS:
        assert p.predict((1e7, 96.0, float(g)))[0] == pytest.approx(law(1e7, 96.0, g), rel=1e-9)


def test_no_tile_without_every_small_group_or_without_a_drop() -> None:
    assert profile().tile() is None  # groups 1 and 4 only
    # tiles of 3: the profiled 16 and 32 are not whole tiles, so no full tiles' time to read off: plain interpolation
    # (exact on the profiled groups)
    law3 = tiled(1.0, 1.0, 0.7, 3)
    p3 = tiled_profile(law3)
    assert p3.tile() is None
    for g in TILED_GROUPS:
        assert p3.predict((1e6, 64.0, g))[0] == pytest.approx(law3(1e6, 64.0, g), rel=1e-12)
    # a group grid that stops at its dense counts: no profiled full tiles beyond them
    dense_only = KernelProfile("attend", "fp64", ("kv_bytes", "head_dim", "group"), ((1e6,), (64.0,), TILED_GROUPS[:8]),
                               tuple(tiled(1.0, 1.0, 0.7, 4)(1e6, 64.0, g) for g in TILED_GROUPS[:8]))
    assert dense_only.tile() is None
    smooth = tiled_profile(lambda kv, d, g: kv * 1e-9 * g ** 0.8)  # bf16 emulated: rises with every row
    assert smooth.tile() is None
    assert smooth.predict((1e6, 64.0, 12.0))[0] == pytest.approx(1e6 * 1e-9 * 12 ** 0.8, rel=1e-9)


def test_invalid_profiles_are_refused() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        KernelProfile("merge", "fp32", ("elems",), ((4.0, 2.0),), (1e-5, 2e-5))
    with pytest.raises(ValueError, match="2 times for a grid of 3 points"):
        KernelProfile("merge", "fp32", ("elems",), ((1.0, 2.0, 3.0),), (1e-5, 2e-5))
    with pytest.raises(ValueError, match="positive"):
        KernelProfile("merge", "fp32", ("elems",), ((1.0, 2.0),), (1e-5, 0.0))


def _topology_with(tmp_path, kernels: dict) -> str:
    import yaml
    dev = {"peak_flops": {"fp32": "1 TFLOP/s", "fp64": "0.5 TFLOP/s"}, "mem_bw": "1 TB/s", "launch_overhead": "5 us",
           "kernels": kernels}
    body = {"name": "t", "devices": {"dev": dev},
            "nodes": [{"name": f"g{r}", "kind": "gpu", "device": "dev"} for r in range(2)] + [
                {"name": "sw", "kind": "switch"}],
            "links": [{"a": f"g{r}", "b": "sw", "bandwidth": "100 GB/s", "latency": "1 us"}
                      for r in range(2)]}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


def test_the_engine_times_profiled_kernels_from_the_profile(tmp_path) -> None:
    p = profile()
    merge = KernelProfile("finalize", "fp32", ("elems",), ((1.0, 1e6),), (3e-5, 3e-5))
    path = _topology_with(tmp_path, {"attend": {"fp32": profile_to_yaml(p)},
                                     "finalize": {"fp32": profile_to_yaml(merge)}})
    cluster = load_topology(path)
    loaded = cluster.specs["g0"].kernels[("attend", "fp32")]  # the YAML keeps 6 significant digits
    assert loaded.seconds == pytest.approx(p.seconds, rel=1e-5)
    p = loaded
    shape = DecodeShape(batch=2, heads=8, head_dim=64, kv_heads=4, context=40000, dtype="fp32")
    sched = build_schedule("ring", {}, shape, layout_of(cluster))
    res = simulate(sched, cluster)
    attends = [rec for rec in res.timeline if rec.name.startswith("attend")]
    assert attends
    for rec in attends:
        op = sched.ops[rec.op]
        assert rec.end - rec.start == pytest.approx(p.predict(op.dims)[0], rel=1e-12)
        assert op.dims == (shape.kv_bytes(20000), 64.0, 2.0, 8.0)  # rows: batch x KV heads (a 3-axis profile
        # leaves them out: its time does not depend on them)
    finals = [rec for rec in res.timeline if rec.name == "finalize"]
    assert finals and all(rec.end - rec.start == pytest.approx(3e-5, rel=1e-12) for rec in finals)
    assert res.extrapolated == {}
    # a shape beyond the grid is reported; fp64 has no profile and stays on the roofline
    big = DecodeShape(batch=2, heads=8, head_dim=256, kv_heads=4, context=4_000_000, dtype="fp32")
    assert simulate(build_schedule("ring", {}, big, layout_of(cluster)), cluster).extrapolated == {
        ("dev", "attend", "fp32"): ("head_dim", "kv_bytes")}
    f64 = DecodeShape(batch=2, heads=8, head_dim=64, kv_heads=4, context=40000, dtype="fp64")
    s64 = build_schedule("ring", {}, f64, layout_of(cluster))
    rec = next(r for r in simulate(s64, cluster).timeline if r.name.startswith("attend"))
    op = s64.ops[rec.op]
    assert rec.end - rec.start == pytest.approx(compute_time(cluster.specs["g0"], op.flops, op.nbytes, "fp64"))


@pytest.mark.parametrize(("kernels", "message"), [
    ({"attend": {"fp32": {"axes": ["kv_bytes"], "grid": [[1]], "seconds": [1e-5]}}},
     "kernels.attend.fp32.axes: must be ['kv_bytes', 'head_dim', 'group', 'rows'] or ['kv_bytes', 'head_dim', "
     "'group'] for kernel attend"),
    ({"attend": {"fp32": {"axes": ["kv_bytes", "head_dim", "rows"], "grid": [[1], [1], [1]], "seconds": [1e-5]}}},
     "kernels.attend.fp32.axes: must be"),
    ({"softmax": {}}, "kernels.softmax: no profile for this kernel"),
    ({"merge": {"fp33": {}}}, "kernels.merge.fp33: unknown dtype"),
    ({"merge": {"fp32": {"axes": ["elems"], "grid": [[1, 2]], "seconds": [1e-5]}}},
     "kernels.merge.fp32: 1 times for a grid of 2 points"),
    ({"merge": {"fp32": {"axes": ["elems"], "grid": [[1, 2]], "seconds": [1e-5, 2e-5], "noise": 1}}},
     "kernels.merge.fp32.noise: unknown key"),
])
def test_bad_profiles_are_located_errors(tmp_path, kernels: dict, message: str) -> None:
    path = _topology_with(tmp_path, kernels)
    with pytest.raises(InputError) as err:
        load_topology(path)
    assert message in str(err.value)
    assert err.value.line is not None


ROWS_GRID = ((1e4, 1e6, 1e8), (32.0, 128.0), (1.0, 4.0), (1.0, 4.0, 64.0))


def rows_law(kv_bytes: float, head_dim: float, group: float, rows: float) -> float:
    """A power law that also falls with the rows the same bytes split into (emulated bf16's shape)."""
    return power_law(kv_bytes, head_dim, group) * rows ** -0.4


@settings(max_examples=40, deadline=None)
@given(st.floats(1e4, 1e8), st.floats(32, 128), st.floats(1, 4), st.floats(1, 64))
def test_a_profile_over_rows_interpolates_them_and_one_without_ignores_them(kv_bytes: float, head_dim: float,
                                                                            group: float, rows: float) -> None:
    over = KernelProfile("attend", "bf16", ("kv_bytes", "head_dim", "group", "rows"), ROWS_GRID,
                         tuple(rows_law(*p) for p in itertools.product(*ROWS_GRID)))
    t, outside = over.predict((kv_bytes, head_dim, group, rows))
    assert t == pytest.approx(rows_law(kv_bytes, head_dim, group, rows), rel=1e-9) and outside == ()
    # a profile timed at one row count (no rows axis) reads the first three values of the same shape
    assert profile().predict((kv_bytes, head_dim, group, rows)) == profile().predict((kv_bytes, head_dim, group))
    with pytest.raises(ValueError, match="3 shape values for axes"):
        over.predict((kv_bytes, head_dim, group))


def test_the_engine_prices_the_same_bytes_by_their_rows(tmp_path) -> None:
    """Two decode workloads with the same KV bytes per rank, one in 8 rows (batch 2 x 4 KV heads), one in 64 (batch
    8 x 8 KV heads): on a profile over rows their attends cost what the profile says at their rows."""
    over = KernelProfile("attend", "fp32", ("kv_bytes", "head_dim", "group", "rows"), ROWS_GRID,
                         tuple(rows_law(*p) for p in itertools.product(*ROWS_GRID)))
    cluster = load_topology(_topology_with(tmp_path, {"attend": {"fp32": profile_to_yaml(over)}}))
    loaded = cluster.specs["g0"].kernels[("attend", "fp32")]
    assert loaded.axes[-1] == "rows" and loaded.grid == ROWS_GRID
    times = {}
    for batch, kv_heads, context in ((2, 4, 64000), (8, 8, 8000)):
        shape = DecodeShape(batch=batch, heads=2 * kv_heads, head_dim=64, kv_heads=kv_heads, context=context,
                            dtype="fp32")
        sched = build_schedule("ring", {}, shape, layout_of(cluster))
        rec = next(r for r in simulate(sched, cluster).timeline if r.name.startswith("attend"))
        op = sched.ops[rec.op]
        assert op.dims == (shape.kv_bytes(context // 2), 64.0, 2.0, float(batch * kv_heads))
        assert rec.end - rec.start == pytest.approx(loaded.predict(op.dims)[0], rel=1e-12)
        times[batch * kv_heads] = rec.end - rec.start
    assert times[64] / times[8] == pytest.approx(8 ** -0.4, rel=1e-4)  # same bytes: the rows' power alone


def test_the_rows_grid_times_the_bytes_it_names() -> None:
    """Every point of calibrate's grid over rows builds a shard of exactly its kv_bytes (at least a token a row)."""
    from simulator.distributed.profile_kernels import QUICK_ATTEND_GRID, tileless_attend_grid
    from simulator.kernels.decode import attend_shape
    from simulator.units import DTYPE_BYTES

    for dtype, quick in itertools.product(("bf16", "fp16", "fp32", "fp64"), (False, True)):
        grid = tileless_attend_grid(dtype, quick)
        assert grid[3] == ((1.0, 4.0) if quick else (1.0, 4.0, 16.0, 64.0))
        assert tileless_attend_grid(dtype, quick, over_rows=False) == (
            (QUICK_ATTEND_GRID[0] if quick else (2.0**15, 2.0**18, 2.0**21, 2.0**24, 2.0**26)), *grid[1:3])
        for kv, d, g, r in itertools.product(*grid):
            batch, heads, kv_heads, head_dim, tokens = attend_shape(kv, int(d), int(g), dtype, int(r))
            assert (batch, heads, kv_heads, head_dim) == (1, int(g * r), int(r), int(d))
            assert 2 * kv_heads * tokens * head_dim * DTYPE_BYTES[dtype] == kv


def test_calibrate_profiles_attend_over_rows_only_where_asked_and_emulated_bf16_without_tiles() -> None:
    from simulator.distributed.calibrate import attend_grid_for
    from simulator.distributed.profile_kernels import ATTEND_GRID, tileless_attend_grid

    assert attend_grid_for("fp32", "cpu", False, False) == ATTEND_GRID  # every group to 8: its tiles
    assert attend_grid_for("bf16", "cuda", False, False) == ATTEND_GRID  # native on a GPU
    cpu_bf16 = attend_grid_for("bf16", "cpu", False, False)
    assert cpu_bf16 == tileless_attend_grid("bf16", over_rows=False) and len(cpu_bf16) == 3
    assert cpu_bf16[2] == (1.0, 2.0, 4.0, 8.0, 16.0, 32.0) and cpu_bf16[0][-1] == 2.0**26
    assert attend_grid_for("fp64", "cpu", False, True) == tileless_attend_grid("fp64")  # --attend-rows fp64
    assert len(attend_grid_for("bf16", "cuda", True, True)) == 4


def test_median_ci_narrows_with_n_and_ignores_one_outlier() -> None:
    rng = random.Random(0)
    widths = []
    for n in (11, 101, 1001):
        xs = [rng.lognormvariate(0, 0.2) for _ in range(n)]
        widths.append(median_ci(xs))
    assert widths[0] > widths[1] > widths[2]
    # lognormal(0, 0.2): IQR / median = 2 sinh(0.6745 x 0.2) = 0.271 -> 1.82 x 0.271 / sqrt(1001) = 1.56 %
    assert widths[2] == pytest.approx(0.0156, rel=0.15)
    xs = [1.0 + 0.01 * i for i in range(10)]
    assert median_ci([*xs, 50.0]) < 0.1  # one slow run among eleven: the interval stays narrow
    assert median_ci([1.0]) == math.inf


def test_profile_points_are_visited_in_new_orders_and_their_runs_pooled(monkeypatch) -> None:
    """Every point of every job is timed ``visits`` times, each visit over all the points in a new order, and a
    point's time is the median of all its runs: where the machine is slow for a stretch of the calibration, one
    visit puts a run of neighbouring grid points in it, visits mix each point's runs; a pooled median not known well
    enough refuses the profile."""
    import simulator.distributed.profile_kernels as pk
    from simulator.distributed.measure import Timing

    calls: list[tuple[str, str, tuple[float, ...]]] = []
    runs: dict[tuple[str, str, tuple[float, ...]], list[float]] = {}

    def timed(kernel, dtype, point, device, opts, load, check=False):
        slow = len(calls) % 20 < 5  # 5 calls of every 20 run 3x slow
        calls.append((kernel, dtype, point))
        base = point[0] * (2.0 if dtype == "fp64" else 1.0)
        got = [base * (3.0 if slow else 1.0)] * opts.min_reps
        runs.setdefault((kernel, dtype, point), []).extend(got)
        return Timing.of(got)

    monkeypatch.setattr(pk, "_timed", timed)
    jobs = [pk.ProfileJob("attend", "fp32", ((1.0, 2.0, 3.0), (32.0, 64.0), (1.0, 2.0, 4.0))),
            pk.ProfileJob("merge", "fp64", ((256.0, 4096.0),))]
    points = [("attend", "fp32", p) for p in itertools.product(*jobs[0].grid)] + [
        ("merge", "fp64", (256.0,)), ("merge", "fp64", (4096.0,))]
    told: list[int] = []
    for visits in (1, 4):
        calls.clear()
        runs.clear()
        told.clear()
        out = pk.profile_many(jobs, "cpu", pk.ProfileOptions(visits=visits, max_ci=9.0), None,
                              lambda v, s: told.append(v))
        assert told == list(range(1, visits + 1))
        assert sorted(calls) == sorted(points * visits)
        orders = [calls[i * len(points):(i + 1) * len(points)] for i in range(visits)]
        assert all(sorted(o) == sorted(points) for o in orders) and len({tuple(o) for o in orders}) == visits
        assert all(len(r) == visits * pk.ProfileOptions(visits=visits).per_visit().min_reps for r in runs.values())
        attend, merge = out
        assert attend.grid == jobs[0].grid and merge.axes == ("elems",) and attend.loaded == 1
        expected = [statistics.median(runs[("attend", "fp32", p)]) for p in itertools.product(*jobs[0].grid)]
        assert list(attend.seconds) == expected
        assert merge.seconds == tuple(statistics.median(runs[("merge", "fp64", (x,))]) for x in (256.0, 4096.0))
    assert pk.ProfileOptions(visits=4).per_visit() == pk.ProfileOptions(budget_s=0.2, cap_s=0.5, min_reps=3,
                                                                        max_reps=11, visits=1)

    def unsteady(kernel, dtype, point, device, opts, load, check=False):
        return Timing.of([1.0, 1.0, 9.0, 9.0])

    monkeypatch.setattr(pk, "_timed", unsteady)
    with pytest.raises(pk.UnstableMeasurement, match="merge fp64 at elems 256: the median of 8 runs is known only"):
        pk.profile_many(jobs[1:], "cpu", pk.ProfileOptions(visits=2), None)


def test_a_timing_of_pooled_runs_is_their_median_quartiles_and_interval() -> None:
    from simulator.distributed.measure import Timing

    runs = [3.0, 1.0, 2.0, 5.0, 4.0]
    t = Timing.of(runs)
    assert (t.median, t.q1, t.q3, t.n, t.samples) == (3.0, 2.0, 4.0, 5, tuple(runs))
    assert t.ci == median_ci(runs) and Timing.of([2.5]).ci == math.inf
    got = robust_time(lambda: None, min_reps=7, max_reps=7, rel_ci=0.0)
    assert got == Timing.of(got.samples) and len(got.samples) == 7


def test_robust_time_stops_early_when_stable_and_batches_short_calls() -> None:
    calls = []
    t = robust_time(lambda: calls.append(1), rel_ci=0.5, min_reps=5, sample_s=1e-4)
    assert t.n >= 5 and t.median > 0 and t.q1 <= t.median <= t.q3
    assert len(calls) > t.n  # short calls are timed in batches
    assert math.isfinite(t.spread)


def test_calibrate_refuses_kernels_from_a_topology_without_profiles(tmp_path, capsys) -> None:
    from simulator.cli import main

    path = _topology_with(tmp_path, {})
    out = tmp_path / "new.yaml"
    assert main(["calibrate", "--procs", "2", "-o", str(out), "--kernels-from", path]) == 2
    assert "--kernels-from: has no kernel profiles" in capsys.readouterr().err
    assert not out.exists()
    assert main(["calibrate", "--procs", "2", "-o", str(out), "--kernel-dtypes", "fp33"]) == 2
    assert "--kernel-dtypes: unknown dtype 'fp33'" in capsys.readouterr().err
    assert main(["calibrate", "--procs", "2", "-o", str(out), "--attend-rows", "bf16,int8"]) == 2
    assert "--attend-rows: unknown dtype 'int8'" in capsys.readouterr().err
    assert main(["calibrate", "--procs", "2", "-o", str(out), "--kernel-dtypes", "fp32", "--attend-rows", "bf16"]) == 2
    assert "--attend-rows: bf16 is not a profiled dtype (--kernel-dtypes fp32)" in capsys.readouterr().err
    source = tmp_path / "source.yaml"
    source.write_text(Path(_topology_with(tmp_path, {"merge": {"fp32": profile_to_yaml(
        KernelProfile("merge", "fp32", ("elems",), ((1.0, 2.0),), (1e-5, 2e-5)))}})).read_text())
    assert main(["calibrate", "--procs", "2", "-o", str(out), "--kernels-from", str(source), "--attend-rows",
                 "bf16"]) == 2
    assert "--attend-rows: profiles nothing with --kernels-from" in capsys.readouterr().err
    assert not out.exists()


def test_the_gpu_profiles_committed_still_price_the_shapes_measured() -> None:
    """benchmarks/gpu_kernels.py report reads the H200 profiles (attend without rows) and prices its shapes."""
    import contextlib
    import io

    import benchmarks.gpu_kernels as gpu

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        gpu._report(Path("benchmarks/results/h200-2026-11-30"))
    committed = Path("benchmarks/results/h200-2026-11-30/gpu-h200-kernels.md").read_text()
    assert "## Decode attend kernel" in text.getvalue()
    table = [line for line in text.getvalue().splitlines() if line.startswith("| ") and " bf16 " in line]
    assert table and all(line in committed for line in table)


def test_profiling_under_the_hosts_load_runs_the_same_call_elsewhere_and_says_so(tmp_path) -> None:
    import torch

    from simulator.distributed.host_load import HostLoad
    from simulator.distributed.profile_kernels import ProfileOptions, profile_kernel

    opts = ProfileOptions(budget_s=0.05, min_reps=3)
    with HostLoad(2) as load:
        procs = list(load._procs)
        p = profile_kernel("merge", "fp32", torch.device("cpu"), ((256.0, 4096.0),), opts, load)
        # a call the loading process cannot build is an error on the profiling side, and the process lives on
        with pytest.raises(RuntimeError, match="a process loading the host failed: KeyError"):
            load.start("attend", "fp99", (1e4, 32.0, 1.0))
        again = profile_kernel("rescale", "fp32", torch.device("cpu"), ((256.0,),), opts, load)
    assert all(proc.poll() is not None for proc in procs)  # gone once the profiling is done
    assert p.loaded == 2 and again.loaded == 2 and len(p.seconds) == 2 and all(s > 0 for s in p.seconds)
    body = profile_to_yaml(p)
    assert body["loaded"] == 2 and "loaded" not in profile_to_yaml(KernelProfile(
        "merge", "fp32", ("elems",), ((1.0, 2.0),), (1e-5, 2e-5)))
    cluster = load_topology(_topology_with(tmp_path, {"merge": {"fp32": body}}))
    assert cluster.specs["g0"].kernels[("merge", "fp32")].loaded == 2
    with pytest.raises(InputError, match="loaded must be a positive integer"):
        load_topology(_topology_with(tmp_path, {"merge": {"fp32": {**body, "loaded": 0}}}))


def _loaded(alone_at=(1e4, 1e8), alone=(0.9, 0.5), loaded=2) -> KernelProfile:
    return KernelProfile("attend", "fp32", ("kv_bytes", "head_dim", "group"), GRID,
                         tuple(power_law(*p) for p in itertools.product(*GRID)), loaded=loaded, alone_at=alone_at,
                         alone=alone)


@settings(max_examples=40, deadline=None)
@given(st.floats(1e2, 1e10), st.floats(16, 512), st.floats(1, 64))
def test_a_ratio_alone_is_a_power_law_along_the_first_axis_flat_beyond(kv_bytes, head_dim, group) -> None:
    p = _loaded()
    r = p.alone_ratio((kv_bytes, head_dim, group))
    x = min(max(kv_bytes, 1e4), 1e8)
    expected = 0.9 * (0.5 / 0.9) ** (math.log(x / 1e4) / math.log(1e8 / 1e4))
    assert r == pytest.approx(max(0.5, expected), rel=1e-12)
    assert _loaded((1e4, 1e8), (0.2, 1.3)).alone_ratio((1e4, 1.0, 1.0)) == 0.5  # never faster than 1 / loaded
    assert _loaded((1e4, 1e8), (0.2, 1.3)).alone_ratio((1e8, 1.0, 1.0)) == 1.0  # never slower alone
    assert profile().alone_ratio((kv_bytes, head_dim, group)) == 1.0  # no ratios: as profiled


def test_ratios_alone_round_trip_through_the_yaml_and_bad_ones_are_named(tmp_path) -> None:
    p = _loaded((1e4, 1e6, 1e8), (0.97, 0.86, 0.95))
    body = profile_to_yaml(p)
    assert body["alone"] == {"kv_bytes": [10000, 1000000, 100000000], "ratio": [0.97, 0.86, 0.95]}
    again = load_topology(_topology_with(tmp_path, {"attend": {"fp32": body}})).specs["g0"].kernels[
        ("attend", "fp32")]
    assert again.alone_at == p.alone_at and again.alone == p.alone and "alone" not in profile_to_yaml(profile())
    bad = [({"kv_bytes": [1e4], "ratio": [0.9], "seconds": 1}, r"kernels\.attend\.fp32\.alone\.seconds: unknown key"),
           ({"kv_bytes": [1e4]}, "missing 'ratio'"),
           ({"kv_bytes": [1e4, 1e6], "ratio": [0.9]}, "alone: 2 kv_bytes values but 1 ratios"),
           ({"kv_bytes": [1e6, 1e4], "ratio": [0.9, 0.9]}, "must be positive, finite and strictly increasing"),
           ({"kv_bytes": [float("nan")], "ratio": [0.9]}, "must be positive, finite and strictly increasing"),
           ({"kv_bytes": [float("inf")], "ratio": [0.9]}, "must be positive, finite and strictly increasing"),
           ({"kv_bytes": [1e4], "ratio": [0]}, "every ratio must be positive"),
           ({"kv_bytes": [1e4], "ratio": ["fast"]}, r"alone\.ratio\.0: must be a number"),
           ({"kv_bytes": [], "ratio": []}, r"alone\.kv_bytes: must be a non-empty list"),
           ([0.9], "must map kv_bytes and ratio to lists")]
    for alone, message in bad:
        with pytest.raises(InputError, match=message):
            load_topology(_topology_with(tmp_path, {"attend": {"fp32": {**body, "alone": alone}}}))
    with pytest.raises(InputError, match="ratios to a loaded time need loaded >= 2"):
        load_topology(_topology_with(tmp_path, {"attend": {"fp32": {**body, "loaded": 1}}}))


def test_calibrate_times_a_loaded_profile_alone_along_its_first_axis() -> None:
    import torch

    from simulator.distributed.host_load import HostLoad
    from simulator.distributed.profile_kernels import ProfileOptions, profile_attend, with_alone_ratios

    # a busy test machine cannot promise a calibration-grade median (the other test worker runs): accept its spread
    opts = ProfileOptions(budget_s=0.05, min_reps=3, max_ci=100.0)
    grid = ((2.0**15, 2.0**18), (32.0,), (1.0,))
    with HostLoad(2) as load:
        p = with_alone_ratios(profile_attend("fp32", torch.device("cpu"), opts, grid, load), torch.device("cpu"),
                              load, opts)
        with pytest.raises(ValueError, match="no ratio alone for a profile loaded 1 with 2 copies"):
            with_alone_ratios(profile_attend("fp32", torch.device("cpu"), opts, grid, None), torch.device("cpu"), load,
                              opts)
    # the ratios join the profile; its measured times stay (what the ratios divide). Their values are the machine's:
    # with the other test worker busy they came out 0.195 and 0.074 once (the loaded timings inflated by it)
    assert p.alone_at == grid[0] and len(p.alone) == 2 and all(0 < r < math.inf for r in p.alone)
    assert p.loaded == 2 and p.grid == grid and len(p.seconds) == 2


def test_calibrate_refuses_visits_below_one(capsys) -> None:
    from simulator.distributed.cli_args import parser

    assert parser().parse_args(["calibrate", "-o", "x.yaml"]).visits == 4
    assert parser().parse_args(["calibrate", "-o", "x.yaml", "--visits", "1"]).visits == 1
    for bad in ("0", "-2", "two"):
        with pytest.raises(SystemExit) as err:
            parser().parse_args(["calibrate", "-o", "x.yaml", "--visits", bad])
        assert err.value.code == 2 and "--visits: must be a whole number >= 1" in capsys.readouterr().err
