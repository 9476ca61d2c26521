"""Faceted figures of decode results: colour encodes the algorithm, facets and line style the swept parameters.

The x axis is the number of ranks (or, when that does not vary, the first swept parameter that does); the next
varying parameter makes the columns of panels, the one after the rows; any further ones get a line style and a
marker each. Out-of-memory points are drawn hollow and crossed. One legend, outside the axes, on the right, lists
the algorithms, the line styles, the out-of-memory marker and the reference lines (target, device memory).
"""

from __future__ import annotations

import io
import math
import numbers
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

from simulator.report.conclude import feasible, swept_keys

__all__ = ["Dims", "HLine", "dims_of", "facet_figure", "png"]

_STYLES: tuple[Any, ...] = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 2)))
_MARKERS = ("o", "s", "^", "D", "v", "P", "*")
_MAX_COLS = 4


@dataclass(frozen=True)
class Dims:
    x: str
    col: str | None
    row: str | None
    style: tuple[str, ...]


@dataclass(frozen=True)
class HLine:
    y: float
    label: str
    color: str = "black"
    style: Any = "--"


def dims_of(frame: pd.DataFrame) -> Dims:
    """Which column is the x axis, the panel columns, the panel rows, and the line styles."""
    varying = [c for c in ("ranks", "context", *swept_keys(frame)) if c in frame and frame[c].nunique() > 1]
    numeric = [c for c in varying if pd.api.types.is_numeric_dtype(frame[c])]
    x = "ranks" if "ranks" in varying or not numeric else numeric[0]
    rest = [c for c in varying if c != x]
    col = rest[0] if rest else None
    row = rest[1] if len(rest) > 1 and frame[rest[1]].nunique() <= 6 else None
    style = tuple(c for c in rest if c not in (col, row))
    return Dims(x, col, row, style)


def _colors(n: int) -> list[Any]:
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20" if n <= 20 else "turbo")
    return [cmap(i) if n <= 20 else cmap(i / max(n - 1, 1)) for i in range(n)]


def _name(key: str) -> str:
    return key.split(".")[-1]


def _value(key: str, value: Any) -> str:
    return f"{_name(key)} {value:,}" if isinstance(value, numbers.Integral) else f"{_name(key)} {value}"


def _panels(frame: pd.DataFrame, dims: Dims) -> tuple[tuple[int, int], list[tuple[int, int, str, pd.DataFrame]]]:
    """The grid's shape and its panels: (row, column, title, rows of the frame)."""
    if dims.col is None:
        return (1, 1), [(0, 0, "", frame)]
    cols = sorted(frame[dims.col].unique())
    if dims.row is None:
        ncols = min(len(cols), _MAX_COLS)
        return ((math.ceil(len(cols) / ncols), ncols),
                [(i // ncols, i % ncols, _value(dims.col, c), frame[frame[dims.col] == c]) for i, c in enumerate(cols)])
    rows = sorted(frame[dims.row].unique())
    return (len(rows), len(cols)), [
        (i, j, f"{_value(dims.col, c)}, {_value(dims.row, r)}", frame[(frame[dims.col] == c) & (frame[dims.row] == r)])
        for i, r in enumerate(rows) for j, c in enumerate(cols)]


def facet_figure(frame: pd.DataFrame, column: str, ylabel: str, *, scale: float = 1.0, log_y: bool = True,
                 lines: tuple[HLine, ...] = (), algorithms: list[str] | None = None) -> plt.Figure:
    """``column`` (times ``scale``) against ``dims_of(frame).x``, one line per algorithm and style combination."""
    dims = dims_of(frame)
    algos = algorithms or list(dict.fromkeys(frame["algorithm"]))
    colors = dict(zip(algos, _colors(len(algos)), strict=True))
    combos = list(dict.fromkeys(frame[list(dims.style)].itertuples(index=False, name=None))) if dims.style else [()]
    look = {c: (_STYLES[i % len(_STYLES)], _MARKERS[i % len(_MARKERS)]) for i, c in enumerate(combos)}
    ok = feasible(frame) if "latency_s" in frame else pd.Series(True, index=frame.index)
    (nrows, ncols), panels = _panels(frame, dims)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.9 * ncols, 3.1 * nrows + 0.4), squeeze=False,
                             sharey=True, sharex=True)
    numeric_x = pd.api.types.is_numeric_dtype(frame[dims.x])
    used = set()
    for i, j, title, part in panels:
        ax = axes[i, j]
        used.add((i, j))
        for (name, *style), grp in part.groupby(["algorithm", *dims.style], sort=False):
            algo = str(name)
            grp = grp.sort_values(dims.x)
            ls, marker = look[tuple(style)]
            y = grp[column] * scale
            good = ok.loc[grp.index]
            ax.plot(grp[dims.x], y, color=colors[algo], linestyle=ls, linewidth=1.4, zorder=2)
            ax.plot(grp[dims.x][good], y[good], color=colors[algo], linestyle="none", marker=marker, markersize=5,
                    zorder=3)
            if (~good).any():
                ax.plot(grp[dims.x][~good], y[~good], linestyle="none", marker=marker, markersize=8,
                        markerfacecolor="none", markeredgecolor=colors[algo], zorder=3)
                ax.plot(grp[dims.x][~good], y[~good], linestyle="none", marker="x", markersize=6,
                        color=colors[algo], zorder=3)
        for line in lines:
            ax.axhline(line.y, color=line.color, linestyle=line.style, linewidth=1.2, zorder=1)
        if numeric_x and frame[dims.x].min() > 0 and frame[dims.x].max() / frame[dims.x].min() >= 8:
            ax.set_xscale("log", base=2 if dims.x == "ranks" else 10)
            ax.xaxis.set_minor_locator(NullLocator())
        if log_y:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    for (i, j), ax in np.ndenumerate(axes):
        if (i, j) not in used:
            ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("ranks (GPUs)" if dims.x == "ranks" else _name(dims.x))
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    legend_in = _legend(fig, algos, colors, dims, combos, look, bool((~ok).any()), lines)
    panels_in = fig.get_figwidth()
    fig.set_figwidth(panels_in + legend_in)  # the legend gets its own room, right of the panels
    fig.subplots_adjust(left=0.85 / fig.get_figwidth(), right=(panels_in - 0.1) / fig.get_figwidth(),
                        bottom=0.6 / fig.get_figheight(), top=1 - 0.35 / fig.get_figheight(), wspace=0.08,
                        hspace=0.32)
    return fig


def _legend(fig: plt.Figure, algos: list[str], colors: dict[str, Any], dims: Dims, combos: list[tuple[Any, ...]],
            look: dict[tuple[Any, ...], tuple[Any, str]], any_oom: bool, lines: tuple[HLine, ...]) -> float:
    """One legend right of the panels; returns the width it needs (inches, estimated from its longest label)."""
    handles: list[Any] = [Line2D([], [], color=colors[a], linewidth=2.5) for a in algos]
    labels = list(algos)
    if dims.style:
        for combo in combos:
            ls, marker = look[combo]
            handles.append(Line2D([], [], color="dimgray", linestyle=ls, marker=marker))
            labels.append(", ".join(f"{_name(k)}={v}" for k, v in zip(dims.style, combo, strict=True)))
    if any_oom:
        handles.append((Line2D([], [], color="dimgray", linestyle="none", marker="o", markerfacecolor="none",
                               markersize=8), Line2D([], [], color="dimgray", linestyle="none", marker="x")))
        labels.append("out of memory (hollow, crossed)")
    for line in lines:
        handles.append(Line2D([], [], color=line.color, linestyle=line.style))
        labels.append(line.label)
    rows_fit = max(int((fig.get_figheight() - 0.5) / 0.17), 8)  # 8 pt lines
    ncol = math.ceil(len(handles) / rows_fit)
    title = "colour: algorithm" + ("\nstyle: " + ", ".join(map(_name, dims.style)) if dims.style else "")
    fig.legend(handles, labels, loc="upper right", bbox_to_anchor=(1.0, 0.99), fontsize=8, ncol=ncol,
               frameon=False, title=title, title_fontsize=8, alignment="left")
    return ncol * (0.75 + 0.062 * max(len(label) for label in labels)) + 0.1


def png(fig: plt.Figure) -> bytes:
    """The figure as PNG bytes; closes it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def busbw_figure(frame: pd.DataFrame) -> plt.Figure:
    """Collective rows: bus bandwidth against message size (log x), one panel per rank count, colour per
    algorithm."""
    ranks = sorted(frame["ranks"].unique())
    fig, axes = plt.subplots(1, len(ranks), figsize=(4.2 * len(ranks) + 2.0, 3.6), squeeze=False, sharey=True)
    for ax, p in zip(axes[0], ranks, strict=True):
        for algo, grp in frame[frame["ranks"] == p].groupby("algorithm", sort=True):
            grp = grp.sort_values("bytes")
            ax.plot(grp["bytes"], grp["busbw_GBps"], marker="o", label=str(algo))
        ax.set_xscale("log", base=2)
        ax.set_title(f"{p} ranks")
        ax.set_xlabel("bytes per rank")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("bus bandwidth (GB/s)")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.subplots_adjust(right=0.8, bottom=0.15)
    return fig
