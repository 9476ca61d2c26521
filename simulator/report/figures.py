"""Faceted figures of result rows: colour encodes the algorithm, panels and line style the swept parameters.

The axes are the sweep's independent ones (:func:`simulator.report.conclude.point_view`: a swept key that only
repeats a column, as ``workload.prompt`` repeats ``context``, is one axis). The x axis is the number of ranks (or,
when that does not vary, the first swept number; a name or a flag, as ``phase``, is drawn as categories, markers
without lines); the next axis makes the columns of panels, the one after the rows; any further ones get a line
style and a marker each. Only combinations that exist get a panel. A figure stays readable at any sweep size: at
most :data:`MAX_PANELS` panels in at most :data:`MAX_COLS` columns (another numeric axis takes the x axis when that
keeps the panels within bounds; beyond, an even sample of panels, which the caption states: :func:`figure_note`),
and at most :data:`MAX_WIDTH_PX` pixels wide.

Series that coincide stay visible: the first algorithms are drawn widest and their markers largest. Out-of-memory
points are drawn hollow and crossed. Log axes carry plain-number ticks (1, 2, 5, 10...). One legend, outside the
axes, on the right, lists what the figure draws: its algorithms, line styles, the out-of-memory marker where a point
is out of memory, and the reference lines (target, device memory).
"""

from __future__ import annotations

import io
import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from simulator.report.conclude import feasible, is_categorical, point_view

if TYPE_CHECKING:
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

__all__ = ["DPI", "MAX_COLS", "MAX_PANELS", "MAX_WIDTH_PX", "Dims", "HLine", "agg", "dims_of", "facet_figure",
           "facet_png", "figure_note", "plain_tick", "png", "readable_log_axis", "series_look"]

_STYLES: tuple[Any, ...] = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 2)))
_MARKERS = ("o", "s", "^", "D", "v", "P", "*")
MAX_COLS = 4
MAX_PANELS = 12
MAX_STYLES = 8
MAX_WIDTH_PX = 2000
DENSE = 12  # points per series past which lines and markers are drawn finer
DPI = 110


@dataclass(frozen=True)
class Dims:
    x: str
    col: str | None
    row: str | None
    style: tuple[str, ...]
    categorical: bool = False  # x drawn as categories


@dataclass(frozen=True)
class HLine:
    y: float
    label: str
    color: str = "black"
    style: Any = "--"


def _combos(view: pd.DataFrame, keys: list[str]) -> int:
    return len(view[keys].astype(str).drop_duplicates()) if keys else 1


def _candidate(view: pd.DataFrame, x: str, pool: list[str]) -> Dims:
    col = pool[0] if pool else None
    row = pool[1] if len(pool) > 1 and view[pool[1]].nunique() <= 6 else None
    style = tuple(k for k in pool if k not in (col, row))
    if col is not None and row is not None and view[col].nunique() > MAX_COLS >= view[row].nunique():
        col, row = row, col  # the axis with fewer values makes the columns
    return Dims(x, col, row, style, is_categorical(view[x]))


def _dims(view: pd.DataFrame, keys: list[str]) -> Dims:
    varying = [k for k in keys if view[k].nunique() > 1]
    ranks = "ranks" in view and view["ranks"].nunique() > 1
    numbers = [k for k in varying if not is_categorical(view[k]) and not (ranks and k == "nodes")]
    xs = (["ranks"] if ranks else []) + numbers + [k for k in varying if is_categorical(view[k])]
    if not xs:  # one point
        xs = ["ranks"] if "ranks" in view else keys[:1] or [str(view.columns[0])]
    best: tuple[tuple[bool, int], Dims] | None = None
    for x in xs:
        dims = _candidate(view, x, [k for k in varying if k != x and not (x == "ranks" and k == "nodes")])
        panels = _combos(view, [c for c in (dims.col, dims.row) if c is not None])
        styles = _combos(view, list(dims.style))
        if panels <= MAX_PANELS and styles <= MAX_STYLES:
            return dims
        cost = (True, panels * styles)
        if best is None or cost < best[0]:
            best = (cost, dims)
    assert best is not None
    return best[1]


def dims_of(frame: pd.DataFrame) -> Dims:
    """Which axis is x, which make the panel columns and rows, and which the line styles."""
    view, keys = point_view(frame)
    return _dims(view, keys)


def _order(values: pd.Series) -> list[Any]:
    """Distinct values: numbers ascending, names and flags in the order they first appear."""
    if is_categorical(values):
        return list(dict.fromkeys(values))
    return sorted(values.unique())


def _name(key: str) -> str:
    return key.split(".")[-1]


def _value(key: str, value: Any) -> str:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return f"{_name(key)} {value:,}"
    return f"{_name(key)} {value}"


@dataclass(frozen=True)
class _Panel:
    row: int
    col: int
    title: str
    index: pd.Index


def _panels(view: pd.DataFrame, dims: Dims) -> tuple[tuple[int, int], list[_Panel], int]:
    """The grid's shape, its panels (only combinations that exist), and how many panels were left out."""
    if dims.col is None:
        return (1, 1), [_Panel(0, 0, "", view.index)], 0
    cols = _order(view[dims.col])
    if dims.row is not None:
        rows = _order(view[dims.row])
        full = _combos(view, [dims.col, dims.row]) == len(rows) * len(cols)
        if full and len(cols) <= MAX_COLS and len(rows) * len(cols) <= MAX_PANELS:
            return (len(rows), len(cols)), [
                _Panel(i, j, f"{_value(dims.col, c)}, {_value(dims.row, r)}",
                       view.index[(view[dims.col] == c) & (view[dims.row] == r)])
                for i, r in enumerate(rows) for j, c in enumerate(cols)], 0
    keys = [k for k in (dims.col, dims.row) if k is not None]
    combos = [tuple(c) for c in view[keys].drop_duplicates().itertuples(index=False, name=None)]
    order = {k: {v: i for i, v in enumerate(_order(view[k]))} for k in keys}
    combos.sort(key=lambda c: tuple(order[k][v] for k, v in zip(keys, c, strict=True)))
    left = max(len(combos) - MAX_PANELS, 0)
    if left:
        combos = [combos[round(float(i))] for i in np.linspace(0, len(combos) - 1, MAX_PANELS)]
    ncols = min(len(combos), MAX_COLS)
    panels = []
    for n, combo in enumerate(combos):
        mask = np.ones(len(view), dtype=bool)
        for k, v in zip(keys, combo, strict=True):
            mask &= (view[k] == v).to_numpy()
        panels.append(_Panel(n // ncols, n % ncols, ", ".join(_value(k, v) for k, v in zip(keys, combo, strict=True)),
                             view.index[mask]))
    return (math.ceil(len(combos) / ncols), ncols), panels, left


def figure_note(frame: pd.DataFrame) -> str:
    """What a figure of ``frame`` leaves out (an empty string when it draws every panel)."""
    view, keys = point_view(frame)
    dims = _dims(view, keys)
    (_, _), panels, left = _panels(view, dims)
    if not left:
        return ""
    return (f" {len(panels)} of {len(panels) + left} panels ({', '.join(_name(k) for k in (dims.col, dims.row) if k)}) "
            "are drawn, an even sample; the tables and results.csv have every point.")


def agg() -> None:
    """matplotlib loaded and set to draw without a display (Agg). The drawing functions load it when they first
    draw, not this module when it is imported: what lays figures out or reads results (the report's tables, a run
    whose figures another process draws, ``--no-report``) never loads it."""
    import matplotlib

    matplotlib.use("Agg")


def _colors(n: int) -> list[Any]:
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20" if n <= 20 else "turbo")
    return [cmap(i) if n <= 20 else cmap(i / max(n - 1, 1)) for i in range(n)]


def series_look(i: int, n: int, points: int = 0) -> tuple[float, float]:
    """(line width, marker size) of the ``i``-th of ``n`` series: the first widest, so that a later series drawn
    over an equal one leaves it visible around it; thinner and smaller where a series has many ``points`` (more than
    :data:`DENSE`), so that neighbouring markers do not merge."""
    width, size = (1.6, 5.0) if n <= 1 else (3.2 - 2.0 * i / (n - 1), 8.5 - 4.0 * i / (n - 1))
    if points > DENSE:
        width, size = width * 0.55, size * 0.5
    return width, size


def plain_tick(value: float, _pos: object = None) -> str:
    """A tick label as a plain number (``0.05``, ``2``, ``20,000``), a power of ten past 100,000."""
    if value <= 0 or not math.isfinite(value):
        return f"{value:g}"
    if 1e-3 <= value < 1e5:
        return f"{value:,.6g}"
    power = math.floor(math.log10(value) + 1e-9)
    mantissa = value / 10**power
    return f"$10^{{{power}}}$" if abs(mantissa - 1) < 1e-6 else f"${mantissa:.3g}\\times10^{{{power}}}$"


_SUBS: tuple[tuple[float, ...], ...] = ((1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0),
                                       (1.0, 1.5, 2.0, 3.0, 5.0, 7.0), (1.0, 2.0, 5.0), (1.0, 3.0), (1.0,))


def readable_log_axis(axis: Axis, low: float, high: float, most: int = 10) -> None:
    """Ticks of a log axis spanning [low, high] that can be read: the densest of 1, 1.2, 1.5 ... 9 / 1, 1.5, 2, 3,
    5, 7 / 1, 2, 5 / 1, 3 / 1 per decade that gives at most about ``most`` ticks (a narrow span, 0.5 to 1.1, still
    gets six), plain numbers, no minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    decades = max(math.log10(high / low), 0.1) if low > 0 and high > low else 0.1
    subs = next((s for s in _SUBS if decades * len(s) <= most), _SUBS[-1])
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=most + 2))
    axis.set_major_formatter(FuncFormatter(plain_tick))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def _fits(values: list[float]) -> bool:
    """Whether a tick at each of ``values`` leaves its label room in a panel (about 36 characters wide)."""
    return len(values) <= 10 and sum(len(plain_tick(v).replace(",", "")) + 2 for v in values) <= 36


def _x_axis(ax: Any, values: pd.Series, x: str) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

    lo, hi = float(values.min()), float(values.max())
    distinct = sorted(values.unique())
    if lo > 0 and hi / lo >= 8:
        ax.set_xscale("log", base=2 if x == "ranks" else 10)
        if _fits(distinct):
            ax.xaxis.set_major_locator(FixedLocator(distinct))
            ax.xaxis.set_major_formatter(FuncFormatter(plain_tick))
            ax.xaxis.set_minor_locator(NullLocator())
        else:
            readable_log_axis(ax.xaxis, lo, hi, most=5)  # a panel is about 4 inches wide
    else:
        if _fits(distinct):
            ax.xaxis.set_major_locator(FixedLocator(distinct))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.xaxis.set_major_formatter(FuncFormatter(plain_tick))


def facet_figure(frame: pd.DataFrame, column: str, ylabel: str, *, scale: float = 1.0, log_y: bool = True,
                 lines: tuple[HLine, ...] = (), algorithms: list[str] | None = None) -> Figure:
    """``column`` (times ``scale``) against ``dims_of(frame).x``, one series per algorithm and style combination.
    ``algorithms`` fixes the colours (and their order) across a report's figures."""
    agg()
    import matplotlib.pyplot as plt

    view, keys = point_view(frame)
    dims = _dims(view, keys)
    algos = list(dict.fromkeys([*(algorithms or []), *view["algorithm"].astype(str)]))
    colors = dict(zip(algos, _colors(len(algos)), strict=True))
    drawn = [a for a in algos if a in set(view["algorithm"].astype(str))]
    combos = list(dict.fromkeys(view[list(dims.style)].itertuples(index=False, name=None))) if dims.style else [()]
    look = {c: (_STYLES[i % len(_STYLES)], _MARKERS[i % len(_MARKERS)]) for i, c in enumerate(combos)}
    ok = feasible(view) if "latency_s" in view else pd.Series(True, index=view.index)
    if "oom" in view and "latency_s" not in view:
        ok = ~view["oom"].astype(str).str.lower().isin(["true", "1"])
    (nrows, ncols), panels, _ = _panels(view, dims)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.9 * ncols, 3.1 * nrows + 0.4), squeeze=False,
                             sharey=True, sharex=True)
    cats = [str(c) for c in _order(view[dims.x])] if dims.categorical else []
    dense = int(view[dims.x].nunique())  # points a series has at most
    where = {c: i for i, c in enumerate(cats)}
    used, any_oom, ys = set(), False, []
    for panel in panels:
        ax = axes[panel.row, panel.col]
        used.add((panel.row, panel.col))
        part = view.loc[panel.index]
        for (name, *style), grp in part.groupby(["algorithm", *dims.style], sort=False):
            algo = str(name)
            width, size = series_look(drawn.index(algo), len(drawn), dense)
            ls, marker = look[tuple(style)]
            if dims.categorical:
                shift = (drawn.index(algo) - (len(drawn) - 1) / 2) * min(0.08, 0.3 / max(len(drawn), 1))
                grp = grp.assign(_x=grp[dims.x].astype(str).map(where) + shift).sort_values("_x")
                xs, connect = grp["_x"], "none"
            else:
                grp = grp.sort_values(dims.x)
                xs, connect = grp[dims.x], ls
            y = grp[column] * scale
            ys.append(y)
            good = ok.loc[grp.index]
            color = colors[algo]
            if connect != "none":
                ax.plot(xs, y, color=color, linestyle=connect, linewidth=width, zorder=2)
            ax.plot(xs[good], y[good], color=color, linestyle="none", marker=marker, markersize=size, zorder=3)
            if (~good).any():
                any_oom = True
                ax.plot(xs[~good], y[~good], linestyle="none", marker=marker, markersize=size + 3,
                        markerfacecolor="none", markeredgecolor=color, zorder=3)
                ax.plot(xs[~good], y[~good], linestyle="none", marker="x", markersize=size + 1, color=color, zorder=3)
        for line in lines:
            ax.axhline(line.y, color=line.color, linestyle=line.style, linewidth=1.2, zorder=1)
        if dims.categorical:
            ax.set_xticks(range(len(cats)), cats)
            ax.set_xlim(-0.5, len(cats) - 0.5)
        else:
            _x_axis(ax, view[dims.x], dims.x)
        if log_y:
            ax.set_yscale("log")
        ax.set_title(panel.title, fontsize=10, y=1.0)  # placed, not searched for (nothing is drawn above a panel)
        ax.grid(True, which="major", alpha=0.3)
    if log_y:
        values = pd.concat(ys) if ys else pd.Series(dtype=float)
        values = pd.concat([values, pd.Series([line.y for line in lines], dtype=float)])
        values = values[np.isfinite(values) & (values > 0)]
        if len(values):
            readable_log_axis(axes[0, 0].yaxis, float(values.min()), float(values.max()))
    for (i, j), ax in np.ndenumerate(axes):
        if (i, j) not in used:
            ax.set_visible(False)
    bottom = {p.col: p.row for p in panels}
    for panel in panels:  # the lowest panel of each column carries the x label (and its tick labels)
        ax = axes[panel.row, panel.col]
        if bottom[panel.col] == panel.row:
            ax.set_xlabel("ranks (GPUs)" if dims.x == "ranks" else _name(dims.x))
            ax.xaxis.set_tick_params(labelbottom=True)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    legend_in = _legend(fig, drawn, colors, dims, combos, look, any_oom, lines)
    panels_in = fig.get_figwidth()
    fig.set_figwidth(panels_in + legend_in)  # the legend gets its own room, right of the panels
    fig.subplots_adjust(left=0.85 / fig.get_figwidth(), right=(panels_in - 0.1) / fig.get_figwidth(),
                        bottom=0.6 / fig.get_figheight(), top=1 - 0.35 / fig.get_figheight(), wspace=0.08,
                        hspace=0.38)
    return fig


def _legend(fig: Figure, algos: list[str], colors: dict[str, Any], dims: Dims, combos: list[tuple[Any, ...]],
            look: dict[tuple[Any, ...], tuple[Any, str]], any_oom: bool, lines: tuple[HLine, ...]) -> float:
    """One legend right of the panels, of what is drawn; returns the width it needs (inches, estimated from its
    longest label)."""
    from matplotlib.lines import Line2D

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


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes, at most :data:`MAX_WIDTH_PX` wide, in a palette of 256 colours; closes it.

    The figure is drawn once on an Agg canvas and its pixels taken as they are (what ``savefig`` would encode as a
    PNG, decoded again: the same pixels, without the round trip)."""
    agg()
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    fig.set_dpi(min(DPI, math.floor(MAX_WIDTH_PX / fig.get_figwidth())))
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    rgb = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1).convert("RGB")
    plt.close(fig)
    small = rgb.quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    out = io.BytesIO()
    small.save(out, format="PNG", optimize=True)
    return out.getvalue()


def facet_png(frame: pd.DataFrame, column: str, ylabel: str, **kwargs: Any) -> bytes:
    """:func:`facet_figure`'s PNG (:func:`png`): a report's figure job (:mod:`simulator.report.render`)."""
    return png(facet_figure(frame, column, ylabel, **kwargs))
