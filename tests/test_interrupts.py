"""Interrupting a run: SIGINT stops a simulation within a second and a sweep mid-way, exits 130 with a folder that
``--resume`` completes and no stray workers; pool workers (and a threaded process's fork server) die with a parent
killed by SIGKILL; a second writer to one folder is refused."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest
from conftest import rows, scenario

from simulator.algorithms import build_schedule, resolve
from simulator.cli import main
from simulator.cluster.topology import load_topology
from simulator.engine import eventcore
from simulator.engine.core import simulate
from simulator.run.prepared import layout_of
from simulator.workloads.shape import DecodeShape

pytestmark = pytest.mark.slow
needs_proc = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")


def test_sigint_interrupts_a_simulation_within_a_second():
    cluster = load_topology("dgx-h100", {"nodes": 64})
    shape = DecodeShape(batch=1, heads=16, head_dim=128, kv_heads=16, context=1_000_000, dtype="bf16")
    name, params = resolve("ring")
    sched = build_schedule(name, params, shape, layout_of(cluster))  # 786k ops: a second or more to simulate
    sent: list[float] = []

    def interrupt() -> None:
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh `treering` process
    # ... which has no garbage-collector callbacks: hypothesis, once a test of this process used it, keeps one, and
    # Python drops an exception raised inside a gc callback (the signal would be lost there, not in the engine)
    callbacks = gc.callbacks[:]
    gc.callbacks.clear()
    timer = threading.Timer(0.1, interrupt)  # started once the compiled loop runs (the columns are ready)
    original, calls = eventcore.run, []

    def run(state: object, budget: int) -> bool:
        if not calls:
            timer.start()
        calls.append(budget)
        return original(state, budget)

    finished = []
    try:
        with pytest.raises(KeyboardInterrupt), mock.patch.object(eventcore, "run", run):
            simulate(sched, cluster)
            finished.append(True)
            timer.join()  # the simulation ended first: let the signal land here, not in another test
            time.sleep(5)
    finally:
        signal.signal(signal.SIGINT, previous)
        gc.callbacks.extend(callbacks)
    assert not finished, "the simulation ended before the signal"
    assert calls, "the signal landed before the compiled loop ran"
    assert time.monotonic() - sent[0] < 1.0


def test_sigint_leaves_a_folder_that_resume_completes(tmp_path):
    # 1,200 points: seconds of work left when the first rows are on disk (with 300, a point of 10-20 ms, a busy CI
    # machine could finish the sweep before the signal landed, then take seconds to end normally)
    path = scenario(tmp_path, 400)
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "simulator.cli", "run", str(path), "-o", str(out), "--jobs", "1", "--no-report"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,  # SIGINT as from a terminal,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # even if ignored here
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "results.csv").exists() and len(pd.read_csv(out / "results.csv")) >= 6:
            break
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 2.0  # well under a second on an idle machine; CI's 2 cores may be shared
    assert proc.returncode == 130 and "treering: interrupted" in err.decode()
    partial = pd.read_csv(out / "results.csv")
    assert 0 < partial["point"].nunique() < 1200, "the run was not interrupted mid-way"
    assert main(["run", str(path), "-o", str(out), "--jobs", "1", "--no-report", "--resume"]) == 0
    done = rows(out / "results.csv")
    assert sorted(set(done["point"])) == list(range(1200))  # rows equal to a whole run's: test_sweep's kill -9 test
    kept = done[done["point"].isin(partial["point"])].reset_index(drop=True)
    before = partial.drop(columns=["sim_wall_s"]).sort_values(["point", "algorithm"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, before, check_dtype=False)  # the finished points were kept as they were


# 8 points of ring on 512 ranks (786k ops each): a second or two per point, so that signals land mid-sweep (ring on
# 128 ranks, 49k ops, took seconds before the engine's loop was compiled; now all 8 ended before the first signal)
SLOW = """\
name: slow
topology: dgx-h100
topology_params: {nodes: 64}
workload: {kind: decode, model: {heads: 16, head_dim: 128}, batch: 1, context: 1000000, dtype: bf16}
algorithms: [ring]
sweep:
  workload.context: [1000000, 1000001, 1000002, 1000003, 1000004, 1000005, 1000006, 1000007]
"""


def _start(tmp: Path, *extra: str) -> subprocess.Popen[str]:
    (tmp / "slow.yaml").write_text(SLOW)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.Popen([sys.executable, "-m", "simulator.cli", "run", str(tmp / "slow.yaml"), "-o",
                             str(tmp / "out"), "--no-report", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _wait_for_children(proc: subprocess.Popen[str], n: int, timeout_s: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        kids = _children(proc.pid)
        if len(kids) >= n:
            return kids
        time.sleep(0.1)
    raise AssertionError(f"no {n} workers after {timeout_s} s")


def _gone(pids: list[int], timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if Path(f"/proc/{p}").exists()
                 and "Z" not in Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0]]
        if not alive:
            return True
        time.sleep(0.1)
    return False


@needs_proc
def test_ctrl_c_exits_130_keeps_finished_points_and_leaves_no_workers(tmp_path):
    proc = _start(tmp_path, "--jobs", "2")
    workers = _wait_for_children(proc, 2)
    results = tmp_path / "out" / "results.csv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (results.exists() and results.read_text().count("\n") >= 2):
        time.sleep(0.05)  # until the first finished point is on disk
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    err = "".join(line for line in err.splitlines(True) if not line.startswith("treering: slow: "))  # the header
    assert err.count("\n") == 1 and "Traceback" not in err and "--resume" in err, err
    assert _gone(workers)
    done = pd.read_csv(results)
    assert 1 <= len(done) < 8
    resumed = _start(tmp_path, "--jobs", "2", "--resume")
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    assert f"{len(done)} resumed" in out
    assert sorted(pd.read_csv(tmp_path / "out" / "results.csv")["point"]) == list(range(8))


@needs_proc
def test_workers_die_with_a_killed_parent(tmp_path):
    proc = _start(tmp_path, "--jobs", "2")
    workers = _wait_for_children(proc, 2)
    proc.kill()
    proc.communicate(timeout=60)
    assert _gone(workers), "pool workers outlived their parent"


def _descendants(pid: int) -> list[int]:
    kids = _children(pid)
    return kids + [d for k in kids for d in _descendants(k)]


@needs_proc
def test_workers_of_a_threaded_process_die_with_it_killed(tmp_path):
    """A process that runs other threads forks its workers from a fork server (simulator.run.sweep._pool_context):
    killed by SIGKILL, it takes the server and the workers with it."""
    (tmp_path / "slow.yaml").write_text(SLOW)
    code = ("import sys, threading; from simulator.cli import main; threading.Thread(target=threading.Event().wait,"
            " daemon=True).start(); sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", code, "run", str(tmp_path / "slow.yaml"), "-o",
                             str(tmp_path / "out"), "--no-report", "--jobs", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the fork server (and resource tracker) and, under the server, 2 workers
        kids = _children(proc.pid)
        if any(len(_children(k)) >= 2 for k in kids):
            break
        time.sleep(0.1)
    else:
        raise AssertionError("no fork server with 2 workers after 60 s")
    everyone = _descendants(proc.pid)
    proc.kill()
    proc.communicate(timeout=60)
    assert _gone(everyone), "the fork server or its workers outlived their parent"


@needs_proc
def test_a_second_run_into_a_folder_in_use_is_refused(tmp_path):
    first = _start(tmp_path, "--jobs", "1")
    deadline = time.monotonic() + 60
    while not (tmp_path / "out" / ".treering.lock").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    second = _start(tmp_path, "--jobs", "1")
    _, err = second.communicate(timeout=120)
    first.kill()
    first.communicate()
    assert second.returncode == 2
    assert "another treering command is writing to this folder" in err and err.count("\n") == 1
