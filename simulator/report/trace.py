"""Chrome / Perfetto trace export: ranks as tracks of compute and transfer spans, links as utilisation counters.

Open the JSON in https://ui.perfetto.dev or chrome://tracing. Times are in microseconds of simulated time.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from simulator.cluster.topology import Cluster
from simulator.engine.core import SimResult
from simulator.schedule import COMPUTE_KINDS

__all__ = ["chrome_trace"]

def chrome_trace(runs: Sequence[tuple[str, SimResult, Sequence[str]]], cluster: Cluster,
                 note: str | None = None) -> dict[str, Any]:
    """Trace of several simulations (one per algorithm): ``(label, result, placement)`` each; ``note`` (what the
    trace shows, e.g. one layer of a whole decode step) goes into ``otherData``."""
    events: list[dict[str, Any]] = []
    pids = itertools.count()  # one trace process per (run, rank), then one per run for its links
    for label, result, place in runs:
        rank_pid = [next(pids) for _ in range(result.ranks)]
        for rank, pid in enumerate(rank_pid):
            events.append({"name": "process_name", "ph": "M", "pid": pid,
                           "args": {"name": f"{label}: rank {rank} ({place[rank]})"}})
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "compute"}})
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "transfers"}})
        for rec in result.timeline:
            events.append({
                "name": rec.name, "cat": rec.kind, "ph": "X", "pid": rank_pid[rec.rank],
                "tid": 0 if rec.kind in COMPUTE_KINDS else 1, "ts": rec.start * 1e6,
                "dur": (rec.end - rec.start) * 1e6, "args": {"op": rec.op, "bytes": rec.nbytes, "flops": rec.flops},
            })
        pid = next(pids)
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"{label}: links"}})
        for t, u, v, load in result.link_load:
            bw = cluster.graph.edges[u, v]["bandwidth"]
            events.append({"name": f"{u}->{v}", "ph": "C", "pid": pid, "ts": t * 1e6,
                           "args": {"utilisation": load / bw}})
    other = {"topology": cluster.name, "generator": "treering", **({"note": note} if note else {})}
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}
