"""SIGINT stops a long run at once and leaves a folder that ``--resume`` completes."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from unittest import mock

import pandas as pd
import pytest
from test_sweep import rows, scenario  # tests/ is on sys.path (no __init__.py)

from simulator.algorithms import build_schedule, resolve
from simulator.cli import main
from simulator.cluster.topology import load_topology
from simulator.engine import eventcore
from simulator.engine.core import simulate
from simulator.run.prepared import layout_of
from simulator.workloads.shape import DecodeShape


@pytest.mark.slow
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


@pytest.mark.slow
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
