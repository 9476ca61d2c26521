"""The compiled code a sweep needs, loaded before it starts; on a fresh install, compiled in parallel processes.

numba compiles the package's functions on their first call and caches the machine code (:mod:`simulator.support.
jitcache`): a fresh install's first run compiles them, which took minutes of one CPU. The compiled code comes in
independent parts (*groups*, :data:`GROUPS`), each loaded by a call of its own: the event loop with the flow network
(the largest, compiled for the engine's declared state type, :data:`simulator.engine.eventcore.STATE`: it needs no
state made first), the router with the pass that writes blocks of transfers, and the rest of a simulation (its
state made, seeded and read, and the passes over a schedule's columns). :func:`load_compiled` loads them all before
a sweep runs (a process pool's workers inherit the code, or read the cache, rather than each compile it). Where the
cache lacks some, helper processes (``python -m simulator.engine.warmup GROUP...``, one per CPU, the groups dealt by
cost) compile them into numba's cache while this process waits, then reads them: a fresh install's first run takes
about the time of the largest group rather than of all, and an interrupt lands at once (numba's compiler, in this
process, could swallow it). A helper that fails leaves its groups to this process, which compiles them as it would
have.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from simulator.support.compiling import announce, say_progress
from simulator.support.jitcache import is_cached

__all__ = ["GROUPS", "cold_groups", "load_compiled"]


def _loop() -> None:
    """The event loop with the flow network (the largest part), compiled for the state's declared type."""
    from numba import types

    from simulator.engine import eventcore

    eventcore.run.compile((eventcore.STATE, types.int64))


def _state() -> None:
    """The rest of a simulation's compiled code: its state made, seeded and read; the passes over a schedule's
    columns (dependents, stream order, distinct codes, per-rank ends, the timeline's order, bytes added up), for the
    types :mod:`simulator.engine.core` gives them."""
    from numba import types

    from simulator.engine import eventcore
    from simulator.schedule import colpass

    i64, f64, i32 = types.int64, types.float64, types.int32
    eventcore.new_state.compile(eventcore.NEW_STATE_ARGS)
    eventcore.seed.compile((eventcore.STATE, i64[::1]))
    eventcore.results.compile((eventcore.STATE,))
    eventcore.records.compile((eventcore.STATE,))
    colpass._dependents.compile((i32[::1], i32[::1]))
    colpass._firsts.compile((i64[::1], i64))
    colpass._group_max.compile((i32[::1], f64[::1], i64))
    colpass._ties_by_rank.compile((i64[::1], f64[::1], i32[::1], i64))
    colpass._ordered_sum.compile((f64[::1],))
    u8, b1 = types.uint8, types.boolean
    colpass._stream_deps.compile((i32[::1], i32[::1], u8[::1], i32[::1], i32[::1], b1[::1], b1[::1], b1, i64, i64,
                                  i64, i64, i64))


def _router() -> None:
    """The router's searches and walks, each kind (near, composed, whole-graph), and the pass that writes a
    schedule's blocks of transfers."""
    import networkx as nx

    from simulator.cluster.routing import Router
    from simulator.schedule.core import Schedule

    graph = nx.DiGraph()
    for u, v in [("a.x", "a.y"), ("a.x", "s"), ("s", "b.x"), ("s", "t0"), ("t0", "t")]:
        graph.add_edge(u, v, latency=1e-6)
        graph.add_edge(v, u, latency=1e-6)
    Router(graph).prepare([("a.x", "a.y"), ("a.y", "b.x"), ("a.y", "t")])
    sched = Schedule(2)
    k = sched.add_compute(0, "k", nbytes=1e3)
    sched.add_transfers([0], [1], [1e3], ["x"], [(k,)], [()])
    sched.ops.columns()  # a block of transfers written as columns (colpass.fill_transfers)


def _loop_entries() -> list[Any]:
    from simulator.engine import eventcore

    return [eventcore.run]


def _state_entries() -> list[Any]:
    from simulator.engine import eventcore
    from simulator.schedule import colpass

    return [eventcore.new_state, eventcore.seed, eventcore.results, eventcore.records, colpass._dependents,
            colpass._firsts, colpass._group_max, colpass._ties_by_rank, colpass._ordered_sum, colpass._stream_deps]


def _router_entries() -> list[Any]:
    from simulator.cluster import routecore
    from simulator.schedule import colpass

    return [routecore.two_hop_bounds, routecore.entry_constants, routecore._walks, colpass.fill_transfers]


class Group(NamedTuple):
    """A part of the compiled code, loaded (or compiled, where the cache lacks it) by one call."""

    what: str
    load: Callable[[], None]
    entries: Callable[[], list[Any]]  # the compiled functions it loads (cached or not)
    cost: float  # CPU seconds to compile it (measured on a fresh install; only their ratios are used)


GROUPS: dict[str, Group] = {
    "loop": Group("the event loop and the flow network", _loop, _loop_entries, 20.0),
    "router": Group("the router", _router, _router_entries, 13.0),
    "state": Group("the engine's state and the schedule passes", _state, _state_entries, 8.0),
}


def cold_groups() -> list[str]:
    """The groups whose compiled code numba's cache lacks (a fresh install: all of them)."""
    return [name for name, group in GROUPS.items() if not all(is_cached(f) for f in group.entries())]


def _helper(groups: list[str]) -> subprocess.Popen[bytes] | None:
    """A process compiling ``groups`` into numba's cache (the same package and cache folder as this one); it says
    nothing on stderr unless it fails (a traceback)."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding this package
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    try:
        return subprocess.Popen([sys.executable, "-m", "simulator.engine.warmup", *groups], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except OSError:
        return None


def _shares(names: list[str], helpers: int) -> list[list[str]]:
    """``names`` dealt to ``helpers`` processes, the costliest first, each to the least loaded so far."""
    shares: list[list[str]] = [[] for _ in range(min(helpers, len(names)))]
    for name in sorted(names, key=lambda n: -GROUPS[n].cost):
        min(shares, key=lambda share: sum(GROUPS[n].cost for n in share)).append(name)
    return shares


def load_compiled(parallel: bool = True) -> float:
    """Load every group's compiled code into this process (:data:`GROUPS`), compiling what numba's cache lacks.
    Where the cache lacks some (a fresh install) and ``parallel``, helper processes compile them into the cache
    (as many as there are CPUs, the groups dealt by cost) while this process waits: then it reads them. (Waiting,
    not compiling, this process takes an interrupt at once: numba's compiler may swallow one, in a callback of
    LLVM's.) Run it before forking a pool, so that its workers inherit the code or read the cache rather than each
    compile it. Returns the seconds it took."""
    t0 = time.perf_counter()
    cold = cold_groups() if parallel else []
    helpers: list[tuple[list[str], subprocess.Popen[bytes]]] = []
    try:
        for share in _shares(cold, os.cpu_count() or 1):
            proc = _helper(share)
            if proc is not None:
                helpers.append((share, proc))
        if helpers:
            say_progress(f"in {len(helpers)} process{'es' if len(helpers) > 1 else ''} at once: "
                         + "; ".join(" then ".join(GROUPS[n].what for n in share) for share, _ in helpers))
        for share, proc in helpers:
            _, err = proc.communicate()
            what = " and ".join(GROUPS[n].what for n in share)
            if proc.returncode == 0:
                say_progress(f"{what}: done at {time.perf_counter() - t0:.0f} s")
            else:  # compiled here instead (below), as without a helper
                tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
                say_progress(f"{what}: its process failed ({tail[0]}); compiling here")
    finally:  # (an interrupt: the helpers go too)
        for _, proc in helpers:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for group in GROUPS.values():
        group.load()  # read from the cache (what a helper failed to compile: compiled here)
    return time.perf_counter() - t0


def _main(argv: list[str]) -> int:
    """``python -m simulator.engine.warmup GROUP...``: compile the groups into numba's cache, quietly."""
    announce(False)
    for name in argv:
        GROUPS[name].load()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
