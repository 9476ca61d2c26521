"""The per-rank timeline (Gantt) of one point, bounded: what it draws and writes grows with what is shown, not
with the number of ops simulated.

* Ranks: all of them up to :data:`MAX_RANKS`; beyond, the critical rank (the one that finishes last) and an even
  sample of the others (rank 0 and the last rank included). The figure says which.
* Bars: ops of one kind on one rank that follow each other with a gap under 1/:data:`RESOLUTION` of the run (under
  a pixel of the figure) are merged into one bar, which says how many ops it covers (``ops``). A rank thus draws
  at most a few thousand bars per kind, however many ops it ran.

* The NVSwitch: where a schedule reduces in the switch (NVLS), the switch joins it as one more rank after the GPUs
  (``sched.meta["compute_ranks"]`` counts the GPUs). It is always shown, labelled ``NVSwitch`` (column ``switch``),
  and is not counted among the ranks (``ranks_total``: the GPUs).

The same bounded table is what ``treering run`` writes as ``timeline.csv`` and what the figure draws; a table
without the ``ops`` / ``critical`` / ``ranks_total`` columns (written by an older version) is bounded on reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from simulator.engine.core import SimResult
from simulator.report.figures import agg, png
from simulator.schedule.core import Schedule
from simulator.schedule.op import OP_KINDS
from simulator.support.gcpause import gc_paused

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["MAX_RANKS", "RESOLUTION", "SWITCH_LABEL", "TIMELINE_COLUMNS", "bound_timeline", "gantt", "gantt_png",
           "shown_ranks", "timeline_frame"]

MAX_RANKS = 16
RESOLUTION = 2000  # gaps under makespan / RESOLUTION are merged (the figure is about 1,000 pixels wide)
TIMELINE_COLUMNS = ["algorithm", "rank", "kind", "name", "start_s", "end_s", "bytes", "ops", "critical",
                    "ranks_total", "switch"]
SWITCH_LABEL = "NVSwitch"
_COLORS = {"compute": "tab:blue", "merge": "tab:green", "send": "tab:orange", "recv": "tab:red", "launch": "tab:gray"}
_LANES = {"send": 0.3, "recv": 0.6}  # compute, merge and launch on the rank's first lane


def shown_ranks(ranks: int, critical: int, limit: int = MAX_RANKS) -> list[int]:
    """Every rank when there are at most ``limit``; else ``limit`` of them in rank order: an even sample (0 and the
    last rank included) in which ``critical`` takes the place of the sampled rank nearest to it."""
    if ranks <= limit:
        return list(range(ranks))
    sample = [round(float(x)) for x in np.linspace(0, ranks - 1, limit)]
    if critical not in sample:
        inner = range(1, limit - 1) if limit > 2 else range(limit)
        sample[min(inner, key=lambda i: abs(sample[i] - critical))] = critical
    return sorted(sample)


def bound_timeline(frame: pd.DataFrame, resolution: int = RESOLUTION) -> pd.DataFrame:
    """Merge each rank's back-to-back ops of one kind (gap under makespan / ``resolution``) into one row.

    ``frame`` has the columns of :data:`TIMELINE_COLUMNS` (``ops`` counts the ops a row already covers).
    """
    if "switch" not in frame:
        frame = frame.assign(switch=False)
    if not len(frame):
        return frame.reindex(columns=TIMELINE_COLUMNS)
    df = frame.sort_values(["algorithm", "rank", "kind", "start_s"], kind="stable").reset_index(drop=True)
    span = df.groupby("algorithm", sort=False)["end_s"].transform("max").to_numpy()
    keys = df[["algorithm", "rank", "kind"]]
    same = (keys == keys.shift()).all(axis=1).to_numpy()
    ends = df["end_s"].to_numpy()
    group = np.cumsum(~same)
    reach = pd.Series(ends).groupby(group).cummax().shift().to_numpy()  # the furthest end before this op, per run
    joined = same & (df["start_s"].to_numpy() <= reach + span / resolution)
    bar = np.cumsum(~joined)
    out = df.groupby(bar, sort=False).agg(
        algorithm=("algorithm", "first"), rank=("rank", "first"), kind=("kind", "first"), name=("name", "first"),
        start_s=("start_s", "min"), end_s=("end_s", "max"), bytes=("bytes", "sum"), ops=("ops", "sum"),
        critical=("critical", "first"), ranks_total=("ranks_total", "first"), switch=("switch", "first"))
    return out.sort_values(["algorithm", "start_s", "rank"], kind="stable").reset_index(drop=True)


def _run_frame(label: str, sched: Schedule, result: SimResult, limit: int) -> pd.DataFrame:
    critical = result.critical_rank()
    gpus = min(int(sched.meta.get("compute_ranks", result.ranks)), result.ranks)  # then the switch, if any
    keep = sorted({*shown_ranks(gpus, min(critical, gpus - 1), limit), *range(gpus, result.ranks)})
    ids = result.ended(ranks=keep)  # the shown ranks' ops, in timeline order
    ranks = result.rank_of[ids]
    return pd.DataFrame({
        "algorithm": label, "rank": ranks, "kind": np.array(OP_KINDS, dtype=object)[result.kind_of[ids]],
        "name": result.ops.field("name", ids), "start_s": result.start[ids], "end_s": result.end[ids],
        "bytes": result.ops.field("nbytes", ids), "ops": 1, "critical": ranks == critical,
        "ranks_total": gpus, "switch": ranks >= gpus}, columns=TIMELINE_COLUMNS)


def timeline_frame(runs: Iterable[tuple[str, Schedule, SimResult]], limit: int = MAX_RANKS) -> pd.DataFrame:
    """The bounded timelines of several runs (one per algorithm) as one table of :data:`TIMELINE_COLUMNS`."""
    with gc_paused():  # the runs hold millions of live objects: a collection would walk them all for nothing
        frames = [_run_frame(label, sched, result, limit) for label, sched, result in runs]
    if not frames:
        return pd.DataFrame(columns=TIMELINE_COLUMNS)
    return bound_timeline(pd.concat(frames, ignore_index=True))


def _complete(timeline: pd.DataFrame) -> pd.DataFrame:
    """A table from an older version (one row per op, every rank): the same bounds as a new one."""
    if {"ops", "critical", "ranks_total"} <= set(timeline.columns):
        return timeline if "switch" in timeline else timeline.assign(switch=False)
    parts = []
    for algo, part in timeline.groupby("algorithm", sort=False):
        ends = part.groupby("rank")["end_s"].max()
        critical = int(max(ends.index, key=lambda r: (ends[r], -r)))
        total = int(part["rank"].max()) + 1
        keep = shown_ranks(total, critical)
        part = part[part["rank"].isin(keep)]
        parts.append(part.assign(ops=1, critical=part["rank"] == critical, ranks_total=total, algorithm=algo,
                                 switch=False))
    return bound_timeline(pd.concat(parts, ignore_index=True).reindex(columns=TIMELINE_COLUMNS))


def _switches(part: pd.DataFrame) -> set[int]:
    return set(part.loc[part["switch"].astype(str).str.lower().isin(["true", "1"]), "rank"].astype(int))


def _caption(part: pd.DataFrame, ranks: Sequence[int]) -> str:
    total = int(part["ranks_total"].iloc[0])
    crit = part.loc[part["critical"].astype(bool), "rank"]
    gpus = len(ranks) - len(_switches(part))
    which = "all ranks" if gpus >= total else f"{gpus} of {total} ranks"
    if _switches(part):
        which += f" + the {SWITCH_LABEL} (NVLS: it reduces in the network; no GPU)"
    note = f"; critical rank {int(crit.iloc[0])} (*)" if len(crit) else ""
    merged = int(part["ops"].sum())
    bars = f"; {merged:,} ops in {len(part):,} bars" if merged > len(part) else ""
    return f"{which}{note}{bars}"


def gantt(timeline: pd.DataFrame) -> Figure:
    """One panel per algorithm, one row per shown rank (send and receive lanes below its compute lane)."""
    agg()  # matplotlib loaded when a figure is drawn (simulator.report.figures.agg)
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    timeline = _complete(timeline)
    algos = list(dict.fromkeys(timeline["algorithm"]))
    shown = {a: sorted(timeline.loc[timeline["algorithm"] == a, "rank"].unique()) for a in algos}
    rows = sum(len(r) for r in shown.values())
    fig, axes = plt.subplots(len(algos), 1, figsize=(10, 1.2 + 0.25 * rows + 0.3 * len(algos)), squeeze=False)
    for ax, algo in zip(axes[:, 0], algos, strict=True):
        part = timeline[timeline["algorithm"] == algo]
        ranks = shown[algo]
        row_of = {r: i for i, r in enumerate(ranks)}
        handles = []
        for kind, grp in part.groupby("kind"):
            color = _COLORS.get(str(kind), "black")
            y0 = grp["rank"].map(row_of).to_numpy(float) + _LANES.get(str(kind), 0.0) - 0.14
            x0, x1 = grp["start_s"].to_numpy() * 1e3, grp["end_s"].to_numpy() * 1e3
            boxes = np.stack([np.column_stack(c) for c in ((x0, y0), (x0, y0 + 0.28), (x1, y0 + 0.28), (x1, y0))],
                             axis=1)  # (bars, 4 corners, xy): one collection per kind, not an artist per bar
            # the array itself (not a list of arrays): matplotlib's fast path shares one template's codes
            ax.add_collection(PolyCollection(cast(Any, boxes), facecolors=color, edgecolors=color,  # stubs: a list
                                             linewidths=0.3))
            handles.append(Patch(color=color, label=str(kind)))
        ax.autoscale_view()
        critical, switches = set(part.loc[part["critical"].astype(bool), "rank"]), _switches(part)
        ax.set_yticks([i + 0.3 for i in range(len(ranks))],
                      [SWITCH_LABEL if r in switches else f"{r}*" if r in critical else str(r) for r in ranks],
                      fontsize=7)
        ax.set_title(f"{algo}: {_caption(part, ranks)}", fontsize=9, y=1.0)  # placed: nothing is drawn above
        ax.set_ylabel("rank")
        ax.invert_yaxis()
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes[-1, 0].set_xlabel("time (ms)")
    fig.tight_layout()
    return fig


def gantt_png(timeline: pd.DataFrame) -> bytes:
    """:func:`gantt`'s PNG: a report's figure job (:mod:`simulator.report.render`)."""
    return png(gantt(timeline))
