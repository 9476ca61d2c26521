"""What a fresh install compiles (issue 41): each compiled function once (one signature: not once per constant or
integer width it is called with), the engine's state of its declared type (so the event loop compiles without a
state made first), the warm-up's groups (:mod:`simulator.engine.warmup`) covering what runs use, and a first
compile said on stderr. Each check runs in a fresh interpreter: other tests call compiled functions with types of
their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_RUNS = """
from simulator.algorithms import build_schedule, resolve
from simulator.cluster.topology import load_topology
from simulator.collectives import fabric_of
from simulator.collectives.standalone import collective_schedule
from simulator.engine.core import simulate
from simulator.run.prepared import layout_of
from simulator.workloads.shape import DecodeShape

def runs():
    for preset, nodes, algo in (("dgx-h100", 2, "ring"), ("dgx-h100", 2, "tree"), ("dgx-a100", 1, "tree-p2p")):
        cluster = load_topology(preset, {"nodes": nodes})
        shape = DecodeShape(batch=1, heads=8, head_dim=64, kv_heads=8, context=4096, dtype="bf16")
        res = simulate(build_schedule(*resolve(algo), shape, layout_of(cluster)), cluster, record_links=True)
        res.bytes_sent()
    cluster = load_topology("dgx-h100", {"nodes": 2})
    sched, _ = collective_schedule(cluster, fabric_of(cluster), "allreduce", 1 << 20, 2, "bf16", "auto")
    simulate(sched, cluster)
"""

_SIGNATURES = """
import json
from numba.core.registry import CPUDispatcher
from simulator.cluster import routecore
from simulator.engine import eventcore, flowcore, netstate
from simulator.schedule import colpass

def signatures():
    return {f"{m.__name__}.{name}": [str(sig) for sig in f.overloads]
            for m in (eventcore, netstate, flowcore, routecore, colpass)
            for name, f in vars(m).items() if isinstance(f, CPUDispatcher)}
"""


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=900)
    assert done.returncode == 0, done.stderr
    return done


def test_every_compiled_function_has_one_signature_and_the_warm_up_covers_the_runs():
    """After the warm-up (in this process, no helpers) and simulations of decode schedules and a collective (the
    flows' loads recorded), every compiled function of the engine, the router and the schedule passes has at most
    one signature, and the simulations compiled nothing the warm-up had not: a pool's workers compile nothing."""
    out = _python(_RUNS + _SIGNATURES + """
from simulator.engine.warmup import load_compiled
load_compiled(parallel=False)
before = signatures()
runs()
print(json.dumps([before, signatures()]))
""").stdout
    before, after = json.loads(out.splitlines()[-1])
    many = {name: sigs for name, sigs in after.items() if len(sigs) > 1}
    assert not many, f"compiled more than once: {many}"
    new = {name: sigs for name, sigs in after.items() if sigs != before[name] and sigs}
    assert not new, f"compiled by a run, not by the warm-up: {sorted(new)}"
    assert after["simulator.engine.eventcore.run"], "the event loop was not compiled"


def test_the_engine_state_is_of_its_declared_type():
    """new_state takes the columns as the engine makes them and returns the declared state type (the warm-up
    compiles the event loop for that type)."""
    out = _python(_RUNS + """
from simulator.engine import eventcore, netstate
runs()
import numba
import numpy as np
(args, cres), = eventcore.new_state.overloads.items()
print(args == eventcore.NEW_STATE_ARGS, cres.signature.return_type == eventcore.STATE,
      numba.typeof(netstate.net_new(np.ones(2))) == netstate.NET_STATE)
""").stdout
    assert out.split()[-3:] == ["True", "True", "True"]


def test_a_first_compile_is_said_and_a_cached_run_is_silent(tmp_path):
    """With an empty cache, compiling a function of the package says so on stderr and the cache then holds it;
    the same run again (cached) says nothing."""
    code = """
import numpy as np
from simulator.schedule import colpass
from simulator.support.jitcache import is_cached
print(is_cached(colpass._ordered_sum))
colpass.ordered_sum(np.arange(3.0))
print(is_cached(colpass._ordered_sum))
"""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    first, second = _python(code, env), _python(code, env)
    from simulator.support.compiling import NOTICE

    assert first.stdout.split() == ["False", "True"] and NOTICE in first.stderr
    assert second.stdout.split() == ["True", "True"] and "compiling" not in second.stderr


@pytest.mark.slow
def test_a_fresh_cache_is_filled_by_helper_processes(tmp_path):
    """With an empty cache, load_compiled has helper processes compile every group (this process waits) and says
    so; afterwards no group is cold, and loading them again compiles nothing."""
    code = """
from numba.core import event
from simulator.engine.warmup import cold_groups, load_compiled
compiled = []
class Count(event.Listener):
    def on_start(self, ev): compiled.append(ev.data["dispatcher"])
    def on_end(self, ev): pass
event.register("numba:compile", Count())
print(len(cold_groups()))
load_compiled()
print(len(cold_groups()), len(compiled))
"""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    first, second = _python(code, env), _python(code, env)
    assert first.stdout.split() == ["3", "0", "0"], first.stderr  # compiled by the helpers, none here
    assert "in " in first.stderr and "process" in first.stderr and "done at" in first.stderr
    assert second.stdout.split() == ["0", "0", "0"] and "compiling" not in second.stderr
