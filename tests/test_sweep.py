"""The sweep runner: process pool, Dask, resume after kill -9, failing points as error rows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest
from conftest import rows, scenario

from simulator.cli import main
from simulator.run import sweep
from simulator.run.prepare import check_points
from simulator.run.scenario import load_scenario


def test_process_pool_gives_the_rows_of_a_serial_run(tmp_path):
    path = scenario(tmp_path, 4)
    assert main(["run", str(path), "-o", str(tmp_path / "a"), "--jobs", "1", "--no-report"]) == 0
    assert main(["run", str(path), "-o", str(tmp_path / "b"), "--jobs", "2", "--no-report"]) == 0
    pd.testing.assert_frame_equal(rows(tmp_path / "a" / "results.csv"), rows(tmp_path / "b" / "results.csv"))
    parquet = pd.read_parquet(tmp_path / "b" / "results.parquet")
    assert len(parquet) == 3 * 4 * 2 and sorted(set(parquet["point"])) == list(range(12))


@pytest.mark.slow
def test_dask_local_cluster_gives_the_same_rows(tmp_path):
    pytest.importorskip("dask.distributed")
    path = scenario(tmp_path, 2)
    assert main(["run", str(path), "-o", str(tmp_path / "a"), "--jobs", "1", "--no-report"]) == 0
    assert main(["run", str(path), "-o", str(tmp_path / "d"), "--executor", "dask", "--jobs", "2",
                 "--no-report"]) == 0
    pd.testing.assert_frame_equal(rows(tmp_path / "a" / "results.csv"), rows(tmp_path / "d" / "results.csv"))


def test_a_process_with_other_threads_forks_its_workers_from_a_fork_server(tmp_path):
    """A fork copies the locks other threads hold (a notebook's, this test runner's): such a process's workers come
    from a fork server, and give the same rows."""
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    helper.start()
    try:
        ctx, direct = sweep._pool_context()
        assert ctx is not None and ctx.get_start_method() == "forkserver" and not direct
        path = scenario(tmp_path, 2)
        assert main(["run", str(path), "-o", str(tmp_path / "a"), "--jobs", "1", "--no-report"]) == 0
        assert main(["run", str(path), "-o", str(tmp_path / "b"), "--jobs", "2", "--no-report"]) == 0
    finally:
        stop.set()
    pd.testing.assert_frame_equal(rows(tmp_path / "a" / "results.csv"), rows(tmp_path / "b" / "results.csv"))


@pytest.mark.slow
def test_a_sweep_killed_mid_way_resumes_to_the_rows_of_an_uninterrupted_run(tmp_path):
    path = scenario(tmp_path, 200)  # 600 points: rows reach disk about once a second, some 150 points a time here
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "simulator.cli", "run", str(path), "-o", str(out), "--jobs", "2", "--no-report"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (out / "results.csv").exists() and len(pd.read_csv(out / "results.csv")) >= 20:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = pd.read_csv(out / "results.csv")
    assert 0 < partial["point"].nunique() < 600, "the run was not interrupted mid-way"
    assert main(["run", str(path), "-o", str(out), "--jobs", "2", "--no-report", "--resume"]) == 0
    assert main(["run", str(path), "-o", str(tmp_path / "whole"), "--jobs", "2", "--no-report"]) == 0
    pd.testing.assert_frame_equal(rows(out / "results.csv"), rows(tmp_path / "whole" / "results.csv"))


def test_a_failing_point_becomes_an_error_row(tmp_path, monkeypatch):
    points = check_points(load_scenario(scenario(tmp_path, 2)))
    real = sweep.simulate_point

    def flaky(prep, timeline=False):
        swept = dict(prep.point.swept)
        if swept["topology_params.nodes"] == 2 and swept["workload.context"] == 1100:
            raise RuntimeError("boom")
        return real(prep, timeline)

    monkeypatch.setattr(sweep, "simulate_point", flaky)
    outcome = sweep.run_sweep(points, tmp_path / "o", jobs=1, progress=False)
    assert outcome.failed == 1
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    bad = df[df["error"].notna()]
    assert len(bad) == 1 and "RuntimeError: boom" in bad.iloc[0]["error"]
    assert df["error"].isna().sum() == 5 * 2  # the other points ran
    monkeypatch.setattr(sweep, "simulate_point", real)  # resume reruns only the failed point
    again = sweep.run_sweep(points, tmp_path / "o", jobs=1, progress=False, resume=True)
    assert again.ran == 1 and again.failed == 0 and "error" not in again.frame


def test_resume_refuses_results_of_another_sweep(tmp_path, capsys):
    path = scenario(tmp_path, 1)
    out = tmp_path / "o"
    out.mkdir()
    (out / "results.csv").write_text("flow,src\n0,a\n")
    assert main(["run", str(path), "-o", str(out), "--resume", "--no-report"]) == 2
    assert "cannot resume" in capsys.readouterr().err


_COUNTING = """
import dataclasses, sys
from simulator.cli import main
from simulator.run.kinds import KINDS

log = sys.argv[1]
kind = KINDS["decode"]


def counting(point, cluster, numeric):
    with open(log, "a") as f:
        f.write(repr(point.swept) + "\\n")
    return kind.prepare(point, cluster, numeric)


KINDS["decode"] = dataclasses.replace(kind, prepare=counting)
raise SystemExit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_run_prepares_each_point_once(tmp_path, jobs):
    """The parent checks every point once; its workers (forked: they share the counting table) and the report's
    timeline use what it prepared, and prepare nothing again."""
    path, log = scenario(tmp_path, 2), tmp_path / "prepared.log"
    cmd = [sys.executable, "-c", _COUNTING, str(log), "run", str(path), "-o", str(tmp_path / "o"), "--jobs",
           str(jobs)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    counted = log.read_text().splitlines()
    assert len(counted) == 3 * 2 and len(set(counted)) == 6  # each of the 6 points, once
    assert (tmp_path / "o" / "report.md").is_file()


def test_a_prepared_point_travels_without_being_prepared_again(tmp_path, monkeypatch):
    """What a worker receives (a pickled prepared point) gives the rows of the point it came from, without a check."""
    import pickle

    from simulator.run.kinds import KINDS
    from simulator.run.prepare import simulate_point

    (prep,) = check_points(load_scenario(scenario(tmp_path, 1))[:1])
    monkeypatch.setitem(KINDS, "decode", __import__("dataclasses").replace(
        KINDS["decode"], prepare=lambda *a: pytest.fail("prepared again")))
    again = pickle.loads(pickle.dumps(prep))
    assert again.cluster is prep.cluster  # from this process's cache of clusters
    assert rows_of(simulate_point(again).rows) == rows_of(simulate_point(prep).rows)


def rows_of(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "sim_wall_s"} for row in rows]


def test_a_prepared_point_travels_without_its_clusters_layout(tmp_path):
    """A point's layout (its fabric refers to the cluster, a whole graph) is its cluster's own, shared by every point
    on that cluster: it travels as a mark and comes back as the receiving process's, what its fabric worked out
    included; a pickled point stays small."""
    import pickle

    from simulator.run.prepared import layout_of

    first, second = check_points(load_scenario(scenario(tmp_path, 2))[:2])  # two contexts on one cluster
    assert first.cluster is second.cluster and first.layout is second.layout is layout_of(first.cluster)
    blob = pickle.dumps(first)
    assert len(blob) < 10_000  # (with the fabric and its cluster: about 50 kB)
    again = pickle.loads(blob)
    assert again.layout is first.layout and again.cluster is first.cluster
    assert rows_of(sweep._run_one(0, again)[0]) == rows_of(sweep._run_one(0, first)[0])


def test_a_layout_of_other_ranks_is_its_own(tmp_path):
    from simulator.run.prepared import layout_of

    (prep,) = check_points(load_scenario(scenario(tmp_path, 1))[2:3])  # 4 nodes, 32 GPUs
    assert layout_of(prep.cluster, 8) is layout_of(prep.cluster, 8) is not layout_of(prep.cluster)
    assert layout_of(prep.cluster, 8).ranks == 8 and layout_of(prep.cluster).ranks == 32


def test_the_results_are_rewritten_less_often_where_a_rewrite_takes_long(tmp_path, monkeypatch):
    """At most every flush_s seconds, and at most once per twenty times the last rewrite's duration."""
    points = check_points(load_scenario(scenario(tmp_path, 4)))  # 12 points
    writes: list[float] = []
    clock = [0.0]
    real = sweep._write

    def slow_write(rows, out):  # every rewrite takes 1 s of the (simulated) clock
        writes.append(clock[0])
        clock[0] += 1.0
        return real(rows, out)

    def run_one(index, point, timeline=False):  # each point takes 2 s
        clock[0] += 2.0
        return [{"point": index, "x": 1.0}], None

    monkeypatch.setattr(sweep, "_write", slow_write)
    monkeypatch.setattr(sweep, "_run_one", run_one)
    monkeypatch.setattr(sweep.time, "monotonic", lambda: clock[0])
    sweep.run_sweep(points, tmp_path / "o", progress=False, flush_s=1.0)
    # the first rewrite after the first point; the next once 20 s have passed since it ended; the last at the end
    assert writes == [2.0, 23.0, 26.0]


def test_dask_tasks_hold_a_few_points_each_in_order(tmp_path):
    todo = list(enumerate(range(1000)))
    chunks = sweep._chunks(todo, 2)
    assert [p for chunk in chunks for p in chunk] == todo and max(map(len, chunks)) == sweep._CHUNK
    assert len(sweep._chunks(todo[:40], 2)) == 20  # at least eight tasks per worker
    assert sweep._chunks(todo[:3], 4) == [[t] for t in todo[:3]]


def test_the_10000_point_benchmark_is_the_1000_point_one_with_ten_contexts_for_each():
    from pathlib import Path

    from simulator.support.yaml_lines import load_yaml

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    small, large = load_yaml(bench / "sweep-1000.yaml"), load_yaml(bench / "sweep-10000.yaml")
    assert {k: v for k, v in small.items() if k not in ("name", "sweep")} == \
        {k: v for k, v in large.items() if k not in ("name", "sweep")}
    assert list(small["sweep"]) == list(large["sweep"])
    for key, values in small["sweep"].items():
        assert set(values) <= set(large["sweep"][key])
        assert len(large["sweep"][key]) == len(values) * (10 if key == "workload.context" else 1)
    assert sorted(large["sweep"]["workload.context"]) == large["sweep"]["workload.context"]
