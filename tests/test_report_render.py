"""A report's figures drawn off the run's critical path (simulator.report.render): by a drawer process forked at the
run's start, two at a time, with the same bytes as drawn in the run's own process, and a failing drawer or child
leaving its figures to the run. Each case runs in a fresh interpreter: a fork is only made from a process that runs
one thread, and a test runner's may run several."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, timeout: float = 120) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_split_draws_a_share_in_a_child_and_keeps_the_order():
    out = _python("""
        import os
        from simulator.report.render import Job, _split
        jobs = {f"j{i}": Job(os.getpid, cost=1.0 + i) for i in range(5)} | {"b": Job(bytes, ((1, 2),))}
        got = _split(jobs)
        print(list(got) == list(jobs), got["b"] == bytes((1, 2)), len({v for k, v in got.items() if k != "b"}),
              os.getpid() in got.values())
    """)
    assert out.split() == ["True", "True", "2", "True"]  # two processes drew, this one among them


def test_a_failing_child_leaves_its_share_to_this_process():
    out = _python("""
        import os
        from simulator.report.render import Job, _split
        parent = os.getpid()
        def here_only():
            if os.getpid() != parent:
                raise RuntimeError("the child fails")
            return b"drawn here"
        got = _split({"a": Job(here_only), "b": Job(here_only)})
        print(got == {"a": b"drawn here", "b": b"drawn here"})
    """)
    assert out.strip() == "True"


def test_the_drawer_draws_in_other_processes_and_can_be_closed_unused():
    out = _python("""
        import os, time
        from simulator.report.render import Drawer, Job, render_all
        drawer = Drawer.start()
        got = render_all({"x": Job(os.getpid), "y": Job(os.getpid, cost=2.0), "z": Job(bytes, (3,))}, drawer)
        print(list(got) == ["x", "y", "z"], got["z"] == bytes(3), os.getpid() not in (got["x"], got["y"]),
              got["x"] != got["y"], drawer.pid == 0)
        unused = Drawer.start()
        t = time.perf_counter()
        unused.close()  # killed at once (it was loading matplotlib), reaped
        unused.close()
        print(time.perf_counter() - t < 5, unused.pid == 0)
    """)
    assert out.split() == ["True"] * 7


def test_a_dead_drawer_leaves_the_figures_to_the_run():
    out = _python("""
        import os, signal
        from simulator.report.render import Drawer, Job, render_all
        drawer = Drawer.start()
        os.kill(drawer.pid, signal.SIGKILL)
        got = render_all({"x": Job(bytes, (2,)), "y": Job(bytes, (1,))}, drawer)
        print(got == {"x": bytes(2), "y": bytes(1)}, drawer.pid == 0)
    """)
    assert out.split() == ["True", "True"]


@pytest.mark.parametrize("drawn_by", ["drawer", "this process"])
def test_a_run_draws_the_same_figures_through_its_drawer_as_alone(tmp_path, drawn_by):
    """``treering run`` (its figures drawn by its drawer, two at a time) writes the report that ``treering report``
    of its results writes with every figure drawn in its own process, one after another, byte for byte."""
    run, alone = tmp_path / "run", tmp_path / "alone"
    forkable = "" if drawn_by == "drawer" else "render._forkable = lambda: False"
    _python(f"""
        import sys
        from simulator.cli import main
        from simulator.report import render
        {forkable}
        assert main(["run", "-o", {str(run)!r}, "--jobs", "1"]) == 0
        render._forkable = lambda: False
        assert main(["report", {str(run)!r}, "-o", {str(alone)!r}]) == 0
        assert "matplotlib" in sys.modules
    """, timeout=600)
    pngs = sorted(p.name for p in run.glob("*.png"))
    assert pngs == ["bytes.png", "latency.png", "memory.png", "speedup.png", "timeline.png"]
    for name in [*pngs, "report.md", "report.html"]:
        assert (run / name).read_bytes() == (alone / name).read_bytes(), name


def test_a_run_whose_figures_its_drawer_draws_never_loads_matplotlib(tmp_path):
    out = _python(f"""
        import sys
        from simulator.cli import main
        assert main(["run", "-o", {str(tmp_path)!r}, "--set", "sweep={{}}", "--jobs", "1"]) == 0
        print("matplotlib" in sys.modules)
    """, timeout=600)
    assert out.strip().splitlines()[-1] == "False"
    assert (tmp_path / "timeline.png").stat().st_size > 1000


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_the_drawer_dies_with_its_run_killed():
    code = ("import time; from simulator.report.render import Drawer; d = Drawer.start(); print(d.pid, flush=True); "
            "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z":
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the drawer outlived its run")
