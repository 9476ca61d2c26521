"""Chrome / Perfetto trace export: ranks as tracks of compute and transfer spans, links as utilisation counters.

Open the JSON in https://ui.perfetto.dev or chrome://tracing. Times are in microseconds of simulated time.

A trace is bounded by what it is asked to show: ``ranks`` (default: every rank up to :data:`DEFAULT_RANKS`, beyond
that the critical rank and an even sample, as the report's timeline does) and a time ``window``: spans that end
before it or start after it and link samples outside it are left out. What was left out is counted in
``otherData.left_out`` and by :func:`describe_cut`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from simulator.cluster.topology import Cluster
from simulator.engine.core import SimResult
from simulator.errors import InputError
from simulator.report.timeline import shown_ranks
from simulator.schedule.core import COMPUTE_KINDS
from simulator.units import parse_time

__all__ = ["DEFAULT_RANKS", "TraceCut", "chrome_trace", "describe_cut", "parse_ranks", "parse_window"]

DEFAULT_RANKS = 64


@dataclass
class TraceCut:
    """What a bounded trace left out (summed over its runs)."""

    ranks: dict[str, tuple[int, int]] = field(default_factory=dict)  # run label -> (ranks not shown, ranks)
    ops: int = 0  # spans of the shown ranks outside the window
    ops_of_hidden_ranks: int = 0
    link_samples: int = 0  # link utilisation samples outside the window


def parse_ranks(text: str, field: str = "--ranks") -> list[int]:
    """``0-7,12,100``: ranks and inclusive ranges, in the order given, without repeats."""
    out: dict[int, None] = {}
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise InputError(f"expected ranks such as 0-7,12, got {text!r}", field=field)
        lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if hi < lo:
            raise InputError(f"range {part.strip()!r} runs backwards", field=field)
        out.update(dict.fromkeys(range(lo, hi + 1)))
    return list(out)


def parse_window(text: str, field: str = "--window") -> tuple[float, float]:
    """``START:END`` in simulated time (``0:2ms``, ``1.5ms:3ms``, ``0.001:0.002``); either side may be empty."""
    if text.count(":") != 1:
        raise InputError(f"expected START:END such as 0:2ms, got {text!r}", field=field)
    ends = []
    for side, default in zip(text.split(":"), (0.0, float("inf")), strict=True):
        side = re.sub(r"(?<=[0-9.])\s*(?=[a-zA-Zµ])", " ", side.strip())
        try:
            ends.append(parse_time(side) if side else default)
        except InputError as err:
            raise err.located(field=field) from None
    if ends[1] <= ends[0]:
        raise InputError(f"the window must end after it starts, got {text!r}", field=field)
    return ends[0], ends[1]


def chrome_trace(runs: Sequence[tuple[str, SimResult, Sequence[str]]], cluster: Cluster,
                 ranks: Sequence[int] | None = None, window: tuple[float, float] | None = None,
                 note: str | None = None) -> dict[str, Any]:
    """Trace of several simulations (one per algorithm): ``(label, result, placement)`` each.

    ``ranks``: the ranks shown (default: see the module); ``window``: (start, end) seconds of simulated time;
    ``note`` (what the trace shows, e.g. one layer of a whole decode step) goes into ``otherData``.
    """
    events: list[dict[str, Any]] = []
    lo, hi = window if window is not None else (0.0, float("inf"))
    cut = TraceCut()
    pids = itertools.count()  # one trace process per shown (run, rank), then one per run for its links
    for label, result, place in runs:
        keep = ([r for r in ranks if 0 <= r < result.ranks] if ranks is not None
                else shown_ranks(result.ranks, result.critical_rank(), DEFAULT_RANKS))
        kept = set(keep)
        cut.ranks[label] = (result.ranks - len(kept), result.ranks)
        rank_pid = {rank: next(pids) for rank in keep}
        for rank, pid in rank_pid.items():
            events.append({"name": "process_name", "ph": "M", "pid": pid,
                           "args": {"name": f"{label}: rank {rank} ({place[rank]})"}})
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "compute"}})
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "transfers"}})
        ids = result.ended(ranks=keep)  # the shown ranks' ops, in timeline order
        cut.ops_of_hidden_ranks += len(result.order) - len(ids)
        inside = ~((result.end[ids] < lo) | (result.start[ids] > hi))
        cut.ops += int(len(ids) - inside.sum())
        ids = ids[inside]
        slowed = result.slowed
        for i, start, end, op in zip(ids.tolist(), result.start[ids].tolist(), result.end[ids].tolist(),
                                     result.ops.take(ids), strict=True):
            args: dict[str, Any] = {"op": i, "bytes": op.nbytes, "flops": op.flops}
            if slowed is not None and slowed[i] > 0:  # what transfers holding the GPU's SMs added (contention)
                args["contention_us"] = float(slowed[i]) * 1e6
            events.append({
                "name": op.name, "cat": op.kind, "ph": "X", "pid": rank_pid[op.rank],
                "tid": 0 if op.kind in COMPUTE_KINDS else 1, "ts": start * 1e6,
                "dur": (end - start) * 1e6, "args": args,
            })
        pid = next(pids)
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"{label}: links"}})
        for t, u, v, load in result.link_load:
            if not lo <= t <= hi:
                cut.link_samples += 1
                continue
            bw = cluster.graph.edges[u, v]["bandwidth"]
            events.append({"name": f"{u}->{v}", "ph": "C", "pid": pid, "ts": t * 1e6,
                           "args": {"utilisation": load / bw}})
    other = {"topology": cluster.name, "generator": "treering", "left_out": asdict(cut),
             **({"note": note} if note else {})}
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def describe_cut(cut: dict[str, Any]) -> str:
    """One line that says what a trace left out (empty when nothing was)."""
    parts = []
    hidden = {label: tuple(n) for label, n in cut["ranks"].items() if n[0]}
    if hidden:
        runs = ", ".join(f"{label} {n[0]} of {n[1]}" for label, n in hidden.items())
        parts.append(f"ranks ({runs}; {cut['ops_of_hidden_ranks']:,} ops; choose them with --ranks)")
    if cut["ops"]:
        parts.append(f"{cut['ops']:,} ops outside --window")
    if cut["link_samples"]:
        parts.append(f"{cut['link_samples']:,} link samples outside --window")
    return "left out: " + ", ".join(parts) if parts else ""
