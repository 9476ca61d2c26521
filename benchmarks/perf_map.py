"""The compiled event loop under Linux ``perf``, its numba functions named.

    NUMBA_CACHE_DIR=$(mktemp -d) perf record -F 2000 -o perf.data \\
        python benchmarks/perf_map.py prefill:1024 [decode:tree:16384 ...] [--runs 3]
    perf report -i perf.data --no-children --sort dso,sym

numba's machine code lives in memory that ``perf`` cannot name (``[JIT]``, bare addresses). This script prepares each
case's schedule (``engine.core._Run``, as ``simulate`` does), runs the compiled loop once, writes
``/tmp/perf-<pid>.map`` (the start, size and name of every function numba compiled in this process: the file
``perf report`` reads for JIT code), then runs the loop ``--runs`` more times. The functions must be compiled in this
process, not read from numba's cache (a cached library keeps no list of its functions): hence the empty
``NUMBA_CACHE_DIR`` (a few minutes of compiling, which ``perf`` records too: the loop's functions are the ``[JIT]``
rows). Each function's size is taken as the distance to the next one's start.

Cases: ``prefill:P`` (ring, causal zigzag, forward + backward, 1M tokens, as ``engine_speed.py prefill``;
``prefill:ALGO:P`` another prefill schedule: ``ring-q``, ``usp``, or ``ulysses`` with P query heads, contiguous),
``decode:ring:P`` and ``decode:tree:P`` (one decode step, 1M tokens, as ``engine_speed.py decode``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from typing import Any

from simulator.algorithms import build_schedule, resolve
from simulator.algorithms.prefill import build_prefill
from simulator.cluster.topology import load_topology
from simulator.engine import eventcore, flowcore, netstate
from simulator.engine.core import _Run
from simulator.engine.warmup import load_compiled
from simulator.run.prepared import layout_of
from simulator.schedule.core import Schedule
from simulator.support.gcpause import gc_paused
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.shape import DecodeShape


def write_map(path: str) -> int:
    """Write the perf map of every function numba compiled in this process for the engine's modules; returns how
    many it named."""
    named: dict[int, str] = {}
    for module in (eventcore, netstate, flowcore):
        for value in vars(module).values():
            for compiled in getattr(value, "overloads", {}).values():
                library = compiled.library
                for fn in library._final_module.functions:  # empty for a library read from the cache
                    if not fn.is_declaration and (address := library.get_pointer_to_function(fn.name)):
                        named[address] = fn.name
    starts = sorted(named)
    with open(path, "w") as out:
        for start, end in zip(starts, [*starts[1:], starts[-1] + 4096] if starts else [], strict=True):
            out.write(f"{start:x} {min(end - start, 1 << 20):x} {named[start]}\n")
    return len(starts)


def _case(case: str) -> tuple[Schedule, Any]:
    kind, _, rest = case.partition(":")
    if kind == "prefill":
        algo, _, ranks = rest.rpartition(":")
        algo = algo or "ring"
        p = int(ranks)
        prefill = PrefillShape(batch=1, heads=max(32, p) if algo == "ulysses" else 32, head_dim=128, kv_heads=8,
                               sequence=1 << 20, dtype="bf16", causal=True,
                               layout="contiguous" if algo == "ulysses" else "zigzag", backward=True)
        cluster = load_topology("dgx-h100", {"nodes": max(1, p // 8)})
        options = {"overlap": True} if algo in ("ring", "ring-q") else {}
        return build_prefill(algo, options, prefill, layout_of(cluster, p)), cluster
    if kind == "decode":
        algo, _, ranks = rest.partition(":")
        p = int(ranks)
        shape = DecodeShape(batch=1, heads=16, head_dim=128, kv_heads=16, context=1_000_000, dtype="bf16")
        cluster = load_topology("dgx-h100", {"nodes": max(1, p // 8)})
        name, params = resolve(algo)
        return build_schedule(name, params, shape, layout_of(cluster)), cluster
    raise ValueError(case)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cases", nargs="+")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for case in args.cases:
        if not re.fullmatch(r"prefill:((ring|ring-q|ulysses|usp):)?[1-9][0-9]*|decode:(ring|tree):[1-9][0-9]*", case):
            parser.error(f"case {case!r}: expected prefill:P, prefill:ALGO:P, decode:ring:P or decode:tree:P "
                         "(P a rank count)")
    print(f"compiled engine loaded in {load_compiled(parallel=False):.1f} s", flush=True)  # compiled here: named
    mapped = False
    for case in args.cases:
        sched, cluster = _case(case)
        for i in range(1 + args.runs):
            with gc_paused():
                run = _Run(sched, cluster)
                t = time.perf_counter()
                result = run.run()
                took = time.perf_counter() - t
            if not mapped:
                path = f"/tmp/perf-{os.getpid()}.map"
                named = write_map(path)
                print(f"{named} functions named in {path}" if named else
                      "no function named: numba read them from its cache (run with an empty NUMBA_CACHE_DIR)",
                      flush=True)
                mapped = True
            if i:
                print(f"{case}: {len(sched.ops)} ops, {result.events} events, loop {took:.3f} s", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
