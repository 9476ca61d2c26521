"""What a report of ``kind: collective`` rows concludes and draws: per sweep point the fastest algorithm (ties
named together), what NCCL's ``auto`` chose and how far it is from the fastest, the highest bus bandwidth; bus
bandwidth against the message size, one panel per rank count, one marker shape and size per algorithm so that
equal results (``auto`` running ``ring``) both show.

A ``flows`` report (:func:`flows_blocks`) states when the last flow finishes and each flow's achieved rate.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from simulator.report.conclude import extreme_row, ordered, point_view, times
from simulator.report.document import Block, Heading, Image, Items, Para, Table
from simulator.report.figures import MAX_COLS, plain_tick, png, series_look

__all__ = ["collective_blocks", "collective_conclusions", "collective_overview", "collective_table", "flows_blocks",
           "size_text"]

_MARKERS = ("o", "s", "^", "D", "v", "P", "*", "X")
_TIE = 1e-9  # relative: times this close are a tie


def size_text(nbytes: float) -> str:
    """A message size as it is usually written: ``1 MiB``, ``16 GiB``, ``3,000 B``."""
    n = int(nbytes)
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor:,} {unit}"
    return f"{n:,} B"


def _keys(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    view, keys = point_view(frame)
    keys = [k for k in keys if k != "context"]
    for k in ("bytes", "ranks"):  # a collective point is at least its size and its ranks
        if k not in keys and k in view:
            keys.insert(0, k)
    if "ranks" in keys and "nodes" in keys:
        keys.remove("ranks")
    return ordered(view, keys), keys


def _where(row: pd.Series, keys: list[str]) -> str:
    parts = []
    for k in keys:
        value = row[k]
        if k == "bytes":
            parts.append(size_text(float(value)))
        elif k in ("ranks", "nodes"):
            parts.append(f"{int(value)} {k if int(value) != 1 else k[:-1]}")
        else:
            parts.append(f"{k.split('.')[-1]} {value}")
    return ", ".join(parts)


def collective_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per sweep point: the fastest algorithm(s), its time and bus bandwidth, what ran, what ``auto``
    chose, and the runner-up with its time as a multiple of the fastest's."""
    view, keys = _keys(frame)
    rows = []
    for values, part in view.groupby(keys, sort=False):
        vals = values if isinstance(values, tuple) else (values,)
        row: dict[str, Any] = dict(zip(keys, vals, strict=True))
        if "bytes" in row:
            row["bytes"] = size_text(float(row["bytes"]))
        if "ranks" not in row:
            row["ranks"] = int(part["ranks"].max())
        part = part.sort_values("time_s", kind="stable")
        best = part.iloc[0]
        tied = part[part["time_s"] <= best["time_s"] * (1 + _TIE)]
        row["fastest"] = " = ".join(map(str, tied["algorithm"]))
        row["time_ms"] = float(best["time_s"]) * 1e3
        row["busbw_GBps"] = float(best["busbw_GBps"])
        row["ran"] = " = ".join(dict.fromkeys(map(str, tied["chosen"])))
        auto = part[part["algorithm"] == "auto"]
        if len(auto):
            row["auto chose"] = str(auto["chosen"].iloc[0])
        rest = part[part["time_s"] > best["time_s"] * (1 + _TIE)]
        if len(rest):
            ratio = float(rest.iloc[0]["time_s"]) / float(best["time_s"])
            row["next best"] = f"{rest.iloc[0]['algorithm']} ({times(ratio)} the time of {best['algorithm']})"
        else:
            row["next best"] = "-"
        rows.append(row)
    return pd.DataFrame(rows)


def _facet(table: pd.DataFrame) -> str:
    return "nodes" if "nodes" in table else "ranks"


def collective_overview(table: pd.DataFrame) -> pd.DataFrame:
    """A large sweep's summary of :func:`collective_table`: per node (or rank) count, the points, where each
    algorithm is fastest (a tie counts for each), and the highest bus bandwidth with the size and what ran."""
    rows = []
    for value, part in table.groupby(_facet(table), sort=False):
        wins = part["fastest"].str.split(" = ").explode().value_counts()
        top = extreme_row(part, "busbw_GBps", largest=True)
        rows.append({_facet(table): value, "points": len(part),
                     "fastest": ", ".join(f"{a} at {c}" for a, c in wins.items()),
                     "highest busbw_GBps": float(top["busbw_GBps"]),
                     "at": f"{top.get('bytes', '-')}, {top['ran']}"})
    return pd.DataFrame(rows)


def collective_conclusions(frame: pd.DataFrame) -> list[str]:
    """The conclusions in a few sentences."""
    view, keys = _keys(frame)
    groups = list(view.groupby(keys, sort=False))
    n = len(groups)
    wins: dict[str, int] = {}
    auto_won, auto_worst = 0, (1.0, "", "")
    for _, part in groups:
        best = float(part["time_s"].min())
        for algo in part.loc[part["time_s"] <= best * (1 + _TIE), "algorithm"]:
            wins[str(algo)] = wins.get(str(algo), 0) + 1
        auto = part[part["algorithm"] == "auto"]
        if len(auto):
            ratio = float(auto["time_s"].iloc[0]) / best
            if ratio <= 1 + _TIE:
                auto_won += 1
            elif ratio > auto_worst[0]:
                fastest = extreme_row(part, "time_s")
                auto_worst = (ratio, str(fastest["algorithm"]), _where(fastest, keys))
    counts = ", ".join(f"`{a}` at {c}" for a, c in sorted(wins.items(), key=lambda kv: -kv[1]))
    op = str(frame["collective"].iloc[0]) if "collective" in frame else "collective"
    lines = [f"Fastest {op} (the shortest time, the highest bus bandwidth): {counts} of {n} sweep points (a tie "
             "counts for each)."]
    if "auto" in set(frame["algorithm"]):
        line = f"`auto` (NCCL's choice by its predicted time) is the fastest at {auto_won} of {n} points"
        if auto_worst[1]:
            line += (f"; elsewhere it takes up to {times(auto_worst[0])} the time of the fastest (`{auto_worst[1]}` at "
                     f"{auto_worst[2]})")
        lines.append(line + ".")
    top = extreme_row(view, "busbw_GBps", largest=True)
    lines.append(f"Highest bus bandwidth: {float(top['busbw_GBps']):.4g} GB/s, `{top['algorithm']}` running "
                 f"{top['chosen']} at {_where(top, keys)}.")
    if view["chosen"].astype(str).str.startswith("nvls").any():
        lines.append("NVLS (NVLink SHARP) reduces in the NVSwitch: the switch joins the schedule as one more rank, "
                     "labelled NVSwitch in the timeline; it is no GPU and holds no buffer.")
    return lines


def busbw_figure(frame: pd.DataFrame, algorithms: list[str]) -> plt.Figure:
    """Bus bandwidth against the message size (log x), one panel per rank count, one colour, marker shape and size
    per algorithm (the first drawn largest and hollow, so that equal results all show)."""
    ranks = sorted(frame["ranks"].unique())
    ncols = min(len(ranks), MAX_COLS)
    nrows = math.ceil(len(ranks) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols + 2.0, 3.4 * nrows + 0.3), squeeze=False,
                             sharey=True)
    colors = plt.get_cmap("tab10")
    drawn = [a for a in algorithms if a in set(frame["algorithm"])]
    sizes = sorted(frame["bytes"].unique())
    for k, p in enumerate(ranks):
        ax = axes[k // ncols, k % ncols]
        for algo, grp in frame[frame["ranks"] == p].groupby("algorithm", sort=False):
            i = drawn.index(str(algo))
            width, size = series_look(i, len(drawn))
            grp = grp.sort_values("bytes")
            ax.plot(grp["bytes"], grp["busbw_GBps"], color=colors(i % 10), linewidth=width * 0.7, alpha=0.8,
                    marker=_MARKERS[i % len(_MARKERS)], markersize=size + 1, markerfacecolor="none",
                    markeredgewidth=1.4)
        ax.set_xscale("log", base=2)
        if len(sizes) <= 8:
            ax.xaxis.set_major_locator(FixedLocator(sizes))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: size_text(v)))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.tick_params(axis="x", labelsize=7)
        ax.yaxis.set_major_formatter(FuncFormatter(plain_tick))
        nodes = frame.loc[frame["ranks"] == p, "nodes"].iloc[0] if "nodes" in frame else None
        ax.set_title(f"{p} ranks" + (f" ({nodes} node{'s' if nodes != 1 else ''})" if nodes is not None else ""),
                     fontsize=10)
        ax.set_xlabel("message size per rank")
        ax.grid(True, alpha=0.3)
    for k in range(len(ranks), nrows * ncols):
        axes[k // ncols, k % ncols].set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("bus bandwidth (GB/s)")
    handles = [Line2D([], [], color=colors(i % 10), marker=_MARKERS[i % len(_MARKERS)], markerfacecolor="none",
                      markersize=series_look(i, len(drawn))[1] + 1) for i in range(len(drawn))]
    fig.legend(handles, drawn, loc="upper right", bbox_to_anchor=(1.0, 0.98), fontsize=8, frameon=False,
               title="algorithm", title_fontsize=8)
    fig.subplots_adjust(left=0.7 / fig.get_figwidth(), right=1 - 1.9 / fig.get_figwidth(),
                        bottom=0.55 / fig.get_figheight(), top=1 - 0.35 / fig.get_figheight(), wspace=0.08,
                        hspace=0.45)
    return fig


def collective_blocks(frame: pd.DataFrame, large: int, link: str = "[results.csv](results.csv)") -> list[Block]:
    """Conclusions, the per-point table (a link to results.csv past ``large`` points), the figure, the busbw
    table."""
    algos = list(dict.fromkeys(frame["algorithm"].astype(str)))
    table = collective_table(frame)
    blocks: list[Block] = [Heading("Conclusions"), Items(tuple(collective_conclusions(frame)))]
    if len(table) <= large:
        blocks += [Para("Per sweep point (a tie is named `a = b`; `ran`: the algorithm and protocol that ran):"),
                   Table(table)]
    else:
        blocks += [Para(f"{len(table):,} sweep points: a summary per {_facet(table)} below; every row is in {link}."),
                   Table(collective_overview(table))]
    blocks += [Heading("Figures"), Image("busbw.png", png(busbw_figure(frame, algos)),
                                         "nccl-tests' bus bandwidth against the per-rank message size; where two "
                                         "algorithms are equal their markers ring each other.")]
    if len(table) <= large:
        view = _keys(frame)[0]
        index = [*[k for k in ("nodes", "ranks") if k in view][:1], "bytes"]
        wide = view.pivot_table(index=index, columns="algorithm", values="busbw_GBps", aggfunc="first", sort=False)
        wide = wide[[a for a in algos if a in wide.columns]].reset_index()
        wide["bytes"] = wide["bytes"].map(size_text)
        wide.columns.name = None
        blocks += [Heading("Bus bandwidth (GB/s)"), Table(wide)]
    return blocks


def flows_blocks(frame: pd.DataFrame, large: int, link: str = "[results.csv](results.csv)") -> list[Block]:
    """Flows: when the last one finishes, and each flow's time and achieved rate."""
    done = frame.assign(time_ms=(frame["finish_s"] - frame["start_s"]) * 1e3)
    done["GBps"] = frame["bytes"] / (frame["finish_s"] - frame["start_s"]) / 1e9
    last = extreme_row(done, "finish_s", largest=True)
    points = int(frame["point"].nunique()) if "point" in frame else 1
    lines = [f"{len(frame)} flows{f' over {points} sweep points' if points > 1 else ''}; the last finishes at "
             f"{float(last['finish_s']) * 1e3:.4g} ms (flow {last['flow']}: {last['src']} -> {last['dst']}, "
             f"{float(last['bytes']) / 1e9:.4g} GB).",
             f"Achieved rates: from {done['GBps'].min():.4g} to {done['GBps'].max():.4g} GB/s per flow (its bytes "
             "over the time from its start to its last byte)."]
    shown = done.drop(columns=[c for c in ("point",) if c in done])
    shown = shown.assign(start_ms=shown.pop("start_s") * 1e3, finish_ms=shown.pop("finish_s") * 1e3,
                         GB=shown.pop("bytes") / 1e9)
    blocks: list[Block] = [Heading("Conclusions"), Items(tuple(lines))]
    if len(shown) <= large:
        blocks += [Heading("Flows"), Table(shown)]
    else:
        blocks.append(Para(f"{len(shown):,} flows: every row is in {link}."))
    return blocks
