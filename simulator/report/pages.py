"""Results -> figures + ``report.md`` + a self-contained ``report.html`` (the only module that draws).

Figures of a decode sweep: latency against ranks per algorithm (log axes, one panel per context), speedup of each
algorithm over ``ring``, peak memory per rank with the device capacity drawn, bytes moved, and a per-rank timeline
(Gantt) of one chosen point, bounded (:mod:`.timeline`). The report states the scenario, the topology, the package
version and the command that reproduces it.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from simulator.files import write_text_atomic
from simulator.report.markdown import markdown_table
from simulator.report.timeline import gantt

__all__ = ["META_FILE", "TIMELINE_FILE", "write_report"]

META_FILE = "meta.json"
TIMELINE_FILE = "timeline.csv"
_IDENTITY = ("ranks", "nodes", "context")


def _series_keys(frame: pd.DataFrame) -> list[str]:
    """Columns besides the x axis and the panel that distinguish result lines (algorithm, other swept keys)."""
    swept = [c for c in frame.columns if "." in c and frame[c].nunique() > 1]
    skip = {c for c in swept if any(frame[c].astype(str).equals(frame[k].astype(str)) for k in _IDENTITY)}
    return ["algorithm", *[c for c in swept if c not in skip]]


def _label(keys: Sequence[str], values: Any) -> str:
    values = values if isinstance(values, tuple) else (values,)
    parts = [str(values[0])] + [f"{k.split('.')[-1]}={v}" for k, v in zip(keys[1:], values[1:], strict=True)]
    return " ".join(parts)


def _panels(frame: pd.DataFrame, column: str, ylabel: str, *, log_y: bool = True,
            capacity: float | None = None) -> plt.Figure:
    contexts = sorted(frame["context"].unique())
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.2 * len(contexts), 3.6), squeeze=False, sharey=log_y)
    keys = _series_keys(frame)
    for ax, ctx in zip(axes[0], contexts, strict=True):
        part = frame[frame["context"] == ctx]
        for values, grp in part.groupby(keys, sort=True):
            grp = grp.sort_values("ranks")
            ax.plot(grp["ranks"], grp[column], marker="o", label=_label(keys, values))
        if capacity:
            ax.axhline(capacity, color="black", linestyle="--", linewidth=1, label="device memory")
        ax.set_xscale("log", base=2)
        if log_y:
            ax.set_yscale("log")
        ax.set_title(f"context {ctx:,}")
        ax.set_xlabel("ranks (GPUs)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def _with_speedup(frame: pd.DataFrame) -> pd.DataFrame:
    """``speedup``: the latency of ``ring`` at the same point over each row's latency."""
    keys = ["context", "ranks", *[k for k in _series_keys(frame) if k != "algorithm"]]
    ring = frame[frame["algorithm"] == "ring"][[*keys, "latency_s"]].rename(columns={"latency_s": "ring_s"})
    merged = frame.merge(ring.drop_duplicates(keys), on=keys, how="left")
    merged["speedup"] = merged["ring_s"] / merged["latency_s"]
    return merged


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _pivot(frame: pd.DataFrame, column: str, scale: float, ratios: bool) -> pd.DataFrame:
    """``column`` (times ``scale``) by point (context, ranks, other swept keys) and algorithm."""
    index = ["context", "ranks", *[k for k in _series_keys(frame) if k != "algorithm"]]
    table = frame.pivot_table(index=index, columns="algorithm", values=column, aggfunc="first") * scale
    if ratios and "ring" in table:
        for algo in [c for c in table.columns if c != "ring"]:
            table[f"ring/{algo}"] = table["ring"] / table[algo]
    return table.reset_index()


def write_report(frame: pd.DataFrame, out: Path, meta: dict[str, Any], timeline: pd.DataFrame | None = None,
                 capacity_bytes: float | None = None) -> list[Path]:
    """Write ``report.md``, ``report.html`` and the figures (PNG) into ``out``; returns the files written."""
    figures: dict[str, bytes] = {}
    if "latency_s" in frame and len(frame):
        ok = frame[frame["latency_s"].notna()]
        figures["latency.png"] = _png(_panels(ok, "latency_s", "decode step latency (s)"))
        if (ok["algorithm"] == "ring").any() and ok["algorithm"].nunique() > 1:
            figures["speedup.png"] = _png(_panels(_with_speedup(ok), "speedup", "speedup over ring (x)"))
        figures["memory.png"] = _png(_panels(ok, "peak_mem_bytes", "peak memory per rank (bytes)",
                                             capacity=capacity_bytes))
        moved = ok[ok["bytes_moved"] > 0]
        if len(moved):
            figures["bytes.png"] = _png(_panels(moved, "bytes_moved", "bytes moved (all ranks)"))
        tables = {"Latency (ms)": _pivot(ok, "latency_s", 1e3, True),
                  "Peak memory per rank (MB)": _pivot(ok, "peak_mem_bytes", 1e-6, False)}
    else:
        tables = {"Results": frame}
    if timeline is not None and len(timeline):
        figures["timeline.png"] = _png(gantt(timeline))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in figures.items():
        path = out / name
        path.write_bytes(data)
        written.append(path)
    intro = [f"# treering report: {meta.get('scenario', '?')}", "",
             f"- scenario: `{meta.get('source', '?')}`", f"- topology: `{meta.get('topology', '?')}`",
             f"- treering version: {meta.get('version', '?')}", f"- reproduce: `{meta.get('command', '?')}`",
             f"- rows: {len(frame)}", ""]
    md = list(intro)
    for title, table in tables.items():
        md += [f"## {title}", "", markdown_table(table), ""]
    md += [f"![{name}]({name})\n" for name in figures]
    write_text_atomic(out / "report.md", "\n".join(md))
    written.append(out / "report.md")
    body = [f"<h1>{html.escape(intro[0][2:])}</h1>", "<ul>"]
    body += [f"<li>{html.escape(line[2:])}</li>" for line in intro[2:7]]
    body.append("</ul>")
    for title, table in tables.items():
        body += [f"<h2>{html.escape(title)}</h2>", table.to_html(index=False, float_format=lambda x: f"{x:.4g}")]
    for name, data in figures.items():
        b64 = base64.b64encode(data).decode()
        body.append(f'<h3>{html.escape(name[:-4])}</h3><img alt="{name}" src="data:image/png;base64,{b64}">')
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>treering report</title><style>body{font-family:"
            "sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:2px 6px;font-size:12px}img{max-width:100%}</style></head><body>"
            + "\n".join(body) + "</body></html>")
    write_text_atomic(out / "report.html", page)
    written.append(out / "report.html")
    write_text_atomic(out / META_FILE, json.dumps(meta, indent=2))
    return written
