"""Results -> figures + ``report.md`` + a self-contained ``report.html``.

A decode report opens with its conclusions (:mod:`.conclude`: per sweep point the fastest algorithm that fits in
memory, its speedup over the baseline (the scenario's ``baseline``, else the first algorithm), what bounds it, what
ran out of memory, the latency target's verdict), then the figures (:mod:`.figures`: latency with the target,
speedup over the baseline, peak memory per rank in GB with the device capacity, bytes moved; out-of-memory points
hollow and crossed), the tables, and the per-rank timeline of one chosen point. It states the scenario, the
topology, the package version and the command that reproduces it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from simulator.report.conclude import feasible, headline, point_view, summary
from simulator.report.document import Block, Code, Heading, Image, Items, Para, Table, to_html, to_markdown
from simulator.report.figures import HLine, busbw_figure, facet_figure, png
from simulator.report.timeline import gantt
from simulator.schedule.memory import usable_bytes
from simulator.support.files import write_text_atomic

__all__ = ["META_FILE", "TIMELINE_FILE", "baseline_of", "timeline_caption", "write_pages", "write_report"]

META_FILE = "meta.json"
TIMELINE_FILE = "timeline.csv"
MAX_FIGURE_IN = 300.0  # a figure side in inches: at 110 dpi, well under the 2^16 pixels a PNG may have
_MAX_RATIOS = 5  # beyond this many algorithms the latency table has no baseline/x columns (the speedup figure has)


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _cells(frame: pd.DataFrame, column: str, scale: float, baseline: str | None = None, fmt: str = ".4g"
           ) -> pd.DataFrame:
    """``column`` (times ``scale``) by point and algorithm, as text; out-of-memory cells end in ``OOM``; with a
    ``baseline``, its ratio to each other algorithm (``ring/tree``) where both fit."""
    view, keys = point_view(frame)
    algos = list(dict.fromkeys(frame["algorithm"]))
    marked = view.assign(_v=view[column] * scale, _ok=feasible(view))
    table = marked.pivot_table(index=keys, columns="algorithm", values="_v", aggfunc="first")[algos]
    ok = marked.pivot_table(index=keys, columns="algorithm", values="_ok", aggfunc="first")[algos]
    text = table.map(lambda v: format(v, fmt) if v == v else "")
    text = text.where(ok.astype(bool), text + " OOM")
    if baseline in algos and len(algos) <= _MAX_RATIOS:
        for algo in [a for a in algos if a != baseline]:
            ratio = table[baseline] / table[algo]
            both = ok[baseline].astype(bool) & ok[algo].astype(bool)
            text[f"{baseline}/{algo}"] = ratio.map(lambda v: format(v, fmt)).where(both, "")
    text.columns.name = None
    if "ranks" not in keys:  # the point's GPUs (``single`` uses one of them)
        text.insert(0, "ranks", view.groupby(keys)["ranks"].max())
    return text.reset_index()


def _where(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items()) or "the only point"


def baseline_of(frame: pd.DataFrame, meta: dict[str, Any]) -> str | None:
    """The algorithm speedups are measured against: the scenario's ``baseline`` (meta.json), else the first
    algorithm in the results."""
    named = meta.get("baseline")
    if named is not None:
        return str(named)
    return str(frame["algorithm"].iloc[0]) if "algorithm" in frame and len(frame) else None


def _figures(frame: pd.DataFrame, meta: dict[str, Any], capacity: float | None, baseline: str | None
             ) -> list[Block]:
    target = (meta.get("targets") or {}).get("latency_s")
    algos = list(dict.fromkeys(frame["algorithm"]))
    lat_lines = (HLine(target * 1e3, f"target {target * 1e3:g} ms", "crimson"),) if target else ()
    blocks: list[Block] = [Heading("Figures"), Image("latency.png", png(facet_figure(
        frame, "latency_s", "decode step latency (ms)", scale=1e3, lines=lat_lines, algorithms=algos)),
        "Decode step latency." + (f" Target {target * 1e3:g} ms drawn." if target else ""))]
    if baseline is not None and baseline in algos and len(algos) > 1:
        sp = _with_speedup(frame, baseline)
        sp = sp[sp["algorithm"] != baseline]
        blocks.append(Image("speedup.png", png(facet_figure(
            sp, "speedup", f"speedup over {baseline} (x)", lines=(HLine(1.0, f"{baseline} (1x)", "gray", ":"),),
            algorithms=algos)), f"Latency of `{baseline}` over each algorithm's, at the same point (hollow: the "
                                "algorithm or the baseline runs out of memory)."))
    mem_lines = []
    if capacity:
        mem_lines.append(HLine(capacity / 1e9, f"device memory {capacity / 1e9:.4g} GB"))
        frac = meta.get("mem_fraction")
        if frac and frac < 1:
            usable = usable_bytes(capacity, frac)
            mem_lines.append(HLine(usable / 1e9, f"usable ({frac:.0%}) {usable / 1e9:.4g} GB", "gray"))
    blocks.append(Image("memory.png", png(facet_figure(frame, "peak_mem_bytes", "peak memory per rank (GB)",
                                                       scale=1e-9, lines=tuple(mem_lines), algorithms=algos)),
                        "Peak memory of the fullest rank, in GB (1e9 bytes)."))
    moved = frame[frame["bytes_moved"] > 0]
    if len(moved):
        blocks.append(Image("bytes.png", png(facet_figure(moved, "bytes_moved", "bytes moved, all ranks (GB)",
                                                          scale=1e-9, algorithms=algos)),
                            "Bytes sent by all ranks together, in GB."))
    return blocks


def _with_speedup(frame: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """``speedup``: the latency of ``baseline`` at the same point over each row's; a row is out of memory when it
    or the baseline is."""
    view, keys = point_view(frame)
    view["_key"] = view[keys].astype(str).agg("|".join, axis=1)
    base = view.assign(_ok=feasible(view))[view["algorithm"] == baseline]
    base = base[["_key", "latency_s", "_ok"]].rename(columns={"latency_s": "_base_s", "_ok": "_base_ok"})
    merged = frame.assign(_key=view["_key"]).merge(base.drop_duplicates("_key"), on="_key", how="left")
    merged["speedup"] = merged["_base_s"] / merged["latency_s"]
    merged["oom"] = ~(feasible(merged) & merged["_base_ok"].fillna(False).astype(bool))
    return merged.drop(columns=["_key", "_base_s", "_base_ok"])


def timeline_caption(meta: dict[str, Any]) -> str:
    """What the timeline draws: which sweep point, and (``scope: model``) that it is one layer's attention."""
    text = f"Per-rank timeline of sweep point {_where(meta.get('timeline_point') or {})}, every algorithm."
    if meta.get("scope") == "model":
        layers = meta.get("layers")
        text += (f" Scope `model`: this is ONE attention layer{f' (of {layers})' if layers else ''} of the decode "
                 "step, not the whole step; the step's latency in the tables adds every layer's projections, MLP "
                 "and attention and the LM head.")
    return text


def _decode_blocks(frame: pd.DataFrame, meta: dict[str, Any], capacity: float | None) -> list[Block]:
    target = (meta.get("targets") or {}).get("latency_s")
    baseline = baseline_of(frame, meta)
    table = summary(frame, target, baseline)
    blocks: list[Block] = [Heading("Conclusions"), Items(tuple(headline(table, frame, target))),
                           Para("Per sweep point (out-of-memory rows never count as fastest):"),
                           Table(table)]
    blocks += _figures(frame, meta, capacity, baseline)
    blocks += [Heading("Latency (ms)"), Para("`OOM`: the algorithm runs out of device memory at that point."),
               Table(_cells(frame, "latency_s", 1e3, baseline)),
               Heading("Peak memory per rank (GB)"), Table(_cells(frame, "peak_mem_bytes", 1e-9))]
    return blocks


def write_pages(out: Path, title: str, blocks: list[Block], figures: dict[str, bytes]) -> list[Path]:
    """``report.md`` and ``report.html`` from ``blocks``, the PNG files beside them; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in figures.items():
        (out / name).write_bytes(data)
        written.append(out / name)
    write_text_atomic(out / "report.md", to_markdown(blocks))
    write_text_atomic(out / "report.html", to_html(blocks, title))
    return [*written, out / "report.md", out / "report.html"]


def _intro(title: str, meta: dict[str, Any], rows: int) -> list[Block]:
    return [Heading(title, 1),
            Items((f"scenario: `{meta.get('source', '?')}`", f"topology: `{meta.get('topology', '?')}`",
                   f"treering version: {meta.get('version', '?')}", f"rows: {rows}", "reproduce:")),
            Code(str(meta.get("command", "?")))]


def write_report(frame: pd.DataFrame, out: Path, meta: dict[str, Any], timeline: pd.DataFrame | None = None,
                 capacity_bytes: float | None = None) -> list[Path]:
    """Write ``report.md``, ``report.html`` and the figures (PNG) into ``out``; returns the files written."""
    title = f"treering report: {meta.get('scenario', '?')}"
    blocks = _intro(title, meta, len(frame))
    if "busbw_GBps" in frame and frame["busbw_GBps"].notna().any():  # a collective workload
        ok = frame[frame["busbw_GBps"].notna()]
        blocks += [Heading("Bus bandwidth"), Image("busbw.png", _png(busbw_figure(ok)),
                                                   "nccl-tests' bus bandwidth against the per-rank message size"),
                   Table(ok.pivot_table(index=["ranks", "bytes"], columns="algorithm", values="busbw_GBps",
                                        aggfunc="first").reset_index())]
    elif "latency_s" in frame and frame["latency_s"].notna().any():
        blocks += _decode_blocks(frame[frame["latency_s"].notna()], meta, capacity_bytes)
    else:
        blocks += [Heading("Results"), Table(frame)]
    if timeline is not None and len(timeline):
        blocks += [Heading("Timeline"), Image("timeline.png", _png(gantt(timeline)), timeline_caption(meta))]
    figures = {b.name: b.data for b in blocks if isinstance(b, Image)}
    written = write_pages(out, title, blocks, figures)
    write_text_atomic(out / META_FILE, json.dumps(meta, indent=2))
    return [*written, out / META_FILE]
