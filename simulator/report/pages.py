"""Results -> figures + ``report.md`` + a self-contained ``report.html``.

Every report opens with its conclusions. For latency rows (decode, prefill, training, generate): per sweep point
the fastest algorithm that fits in memory (:mod:`.conclude`), its speedup over the baseline (the scenario's
``baseline``, else the first algorithm), the runner-up and how much slower it is, what bounds it, what ran out of
memory, the latency target's verdict; generate rows compare the time per output token, and state the time to first
token and the whole request beside it. Then the figures (:mod:`.figures`, labelled by what the rows time: a decode
step, a prefill, a training step, a request), the tables, and the per-rank timeline of one chosen point. A sweep of
more than :data:`LARGE_POINTS` points opens with summaries instead of a row per point (per panel of the figures,
the points with the largest and smallest speedups) and links results.csv. Collective and flows rows:
:mod:`.collective`. It states the scenario, the topology, the package version and the command that reproduces it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd

from simulator.report.conclude import (
    LATENCY,
    TPOT,
    Measure,
    feasible,
    headline,
    measure_of,
    ordered,
    overview,
    point_view,
    point_views_kept,
    summary,
)
from simulator.report.document import (
    Block,
    Code,
    Heading,
    Image,
    Items,
    Para,
    Table,
    plain_number,
    short_names,
    to_html,
    to_markdown,
)
from simulator.report.figures import HLine, dims_of, facet_png, figure_note
from simulator.report.labels import column_label, latency_caption, latency_label, rows_kind
from simulator.report.render import Drawer, Job, start_render
from simulator.report.timeline import gantt_png
from simulator.schedule.memory import usable_bytes
from simulator.support.files import replace_all, temp_beside, write_text_atomic

__all__ = ["LARGE_POINTS", "META_FILE", "TIMELINE_FILE", "baseline_of", "start_report", "timeline_caption",
           "write_pages", "write_report"]

META_FILE = "meta.json"
TIMELINE_FILE = "timeline.csv"
LARGE_POINTS = 50  # past this many sweep points a report opens with summaries and links the full results.csv
TOP = 10  # the points with the largest and the smallest speedups that a large sweep's report lists
_GANTT_BARS = 5000  # the timeline draws in 1.5 facet figures' time and one more per this many bars (start_render)
_MAX_RATIOS = 5  # beyond this many algorithms the latency table has no baseline/x columns (the speedup figure has)


def _cells(frame: pd.DataFrame, column: str, scale: float, baseline: str | None = None
           ) -> tuple[pd.DataFrame, bool]:
    """``column`` (times ``scale``) by point and algorithm, as text; out-of-memory cells end in ``OOM``; with a
    ``baseline``, its ratio to each other algorithm (``ring/tree``) where both fit. Also: whether a cell is OOM."""
    view, keys = point_view(frame)
    view = ordered(view, keys)
    algos = list(dict.fromkeys(frame["algorithm"]))
    marked = view.assign(_v=view[column] * scale, _ok=feasible(view))
    table = marked.pivot_table(index=keys, columns="algorithm", values="_v", aggfunc="first", sort=False)[algos]
    ok = marked.pivot_table(index=keys, columns="algorithm", values="_ok", aggfunc="first", sort=False)[algos]
    text = table.map(lambda v: plain_number(v) if v == v else "")
    oom = ~ok.astype(bool) & table.notna()
    text = text.where(~oom, text + " OOM")
    if baseline in algos and len(algos) <= _MAX_RATIOS:
        for algo in [a for a in algos if a != baseline]:
            ratio = table[baseline] / table[algo]
            both = ok[baseline].astype(bool) & ok[algo].astype(bool)
            text[f"{baseline}/{algo}"] = ratio.map(plain_number).where(both, "")
    text.columns.name = None
    if "ranks" not in keys:  # the point's GPUs (``single`` uses one of them)
        text.insert(0, "ranks", view.groupby(keys, sort=False)["ranks"].max())
    return text.reset_index(), bool(oom.to_numpy().any())


def _where(point: dict[str, Any]) -> str:
    names = short_names(point)
    return ", ".join(f"{names.get(k, k)}={v}" for k, v in point.items()) or "the only point"


def baseline_of(frame: pd.DataFrame, meta: dict[str, Any]) -> str | None:
    """The algorithm speedups are measured against: the scenario's ``baseline`` (meta.json), else the first
    algorithm in the results."""
    named = meta.get("baseline")
    if named is not None:
        return str(named)
    return str(frame["algorithm"].iloc[0]) if "algorithm" in frame and len(frame) else None


def _image(jobs: dict[str, Job], name: str, frame: pd.DataFrame, column: str, ylabel: str, caption: str,
           **kwargs: Any) -> Callable[[], Block]:
    """Drawing the figure made a job of ``jobs`` at once (:func:`write_report` draws them); returns what makes its
    block, its bytes to come (the caption, which states what the figure leaves out, is made then: after the jobs
    are started)."""
    jobs[name] = Job(facet_png, (frame, column, ylabel), kwargs)
    return lambda: Image(name, b"", caption + figure_note(frame))


def _const(block: Block) -> Callable[[], Block]:
    return lambda: block


def _figures(frame: pd.DataFrame, meta: dict[str, Any], capacity: float | None, baseline: str | None,
             measure: Measure, jobs: dict[str, Job]) -> Callable[[], list[Block]]:
    """The figures' jobs added to ``jobs`` at once; returns what makes their blocks (:func:`_image`)."""
    target = (meta.get("targets") or {}).get("latency_s")
    algos = list(dict.fromkeys(frame["algorithm"]))
    lat_lines = (HLine(target * 1e3, f"target {target * 1e3:g} ms", "crimson"),) if target else ()
    blocks: list[Callable[[], Block]] = [_const(Heading("Figures"))]
    if measure is TPOT:
        blocks.append(_image(jobs, "tpot.png", frame, "tpot_s", column_label("tpot_s"),
                             "Mean time per output token: the decode steps' mean latency.", scale=1e3,
                             algorithms=algos))
    else:
        blocks.append(_image(jobs, "latency.png", frame, "latency_s", f"{latency_label(frame)} (ms)",
                             latency_caption(frame) + (f" Target {target * 1e3:g} ms drawn." if target else ""),
                             scale=1e3, lines=lat_lines, algorithms=algos))
    if "p99_s" in frame and frame["p99_s"].notna().any():
        blocks.append(_tail_image(frame, algos, jobs))
    if baseline is not None and baseline in algos and len(algos) > 1:
        sp = _with_speedup(frame, baseline, measure.column)
        sp = sp[sp["algorithm"] != baseline]
        blocks.append(_image(
            jobs, "speedup.png", sp, "speedup", f"speedup over {baseline} (x)",
            f"`{baseline}`'s {measure.noun} over each algorithm's, at the same point (above 1: faster than "
            f"`{baseline}`; hollow: the algorithm or `{baseline}` runs out of memory).",
            lines=(HLine(1.0, f"{baseline} (1x)", "gray", ":"),), algorithms=algos))
    if measure is TPOT:
        view, keys = point_view(frame)
        first = view.drop_duplicates(keys) if keys else view.iloc[:1]
        label = "prefill " + ", ".join(dict.fromkeys(first["prefill"].astype(str))) if "prefill" in first \
            else "prefill"
        blocks.append(_image(jobs, "ttft.png", frame.loc[first.index].assign(algorithm=label), "ttft_s",
                             column_label("ttft_s"), "Time to first token: the prefill, the same for every decode "
                             "schedule.", scale=1e3))
        blocks.append(_image(jobs, "latency.png", frame, "latency_s", f"{latency_label(frame)} (ms)",
                             latency_caption(frame) + (f" Target {target * 1e3:g} ms drawn." if target else ""),
                             scale=1e3, lines=lat_lines, algorithms=algos))
    mem_lines = []
    if capacity:
        mem_lines.append(HLine(capacity / 1e9, f"device memory {capacity / 1e9:.4g} GB"))
        frac = meta.get("mem_fraction")
        if frac and frac < 1:
            usable = usable_bytes(capacity, frac)
            mem_lines.append(HLine(usable / 1e9, f"usable ({frac:.0%}) {usable / 1e9:.4g} GB", "gray"))
    blocks.append(_image(jobs, "memory.png", frame, "peak_mem_bytes", "peak memory per rank (GB)",
                         "Peak memory of the fullest rank, in GB (1e9 bytes).", scale=1e-9, lines=tuple(mem_lines),
                         algorithms=algos))
    moved = frame[frame["bytes_moved"] > 0]
    if len(moved):
        blocks.append(_image(jobs, "bytes.png", moved, "bytes_moved", "bytes moved, all ranks (GB)",
                             "Bytes sent by all ranks together, in GB.", scale=1e-9, algorithms=algos))
    return lambda: [make() for make in blocks]


def _tail_image(frame: pd.DataFrame, algos: list[str], jobs: dict[str, Job]) -> Callable[[], Block]:
    """With a scenario's ``variability:`` (simulator.run.whatif): each algorithm's latency over the trials, its
    median, 99th percentile and largest value, one line each."""
    rows = frame[frame["p99_s"].notna()]
    stats = (("p50_s", "p50"), ("p99_s", "p99"), ("max_s", "max"))
    parts = [rows.assign(algorithm=rows["algorithm"].astype(str) + f" {name}", tail=rows[column])
             for column, name in stats]
    stacked = pd.concat(parts, ignore_index=True)
    labels = [f"{a} {name}" for a in algos for _, name in stats]
    trials = int(rows["trials"].max())
    return _image(jobs, "tail.png", stacked, "tail", "latency over the trials (ms)",
                  f"Latency over {trials} trials with varied kernel and transfer durations: the median (p50), the "
                  "99th percentile and the largest, per algorithm (results.csv: p50_s, p90_s, p99_s, max_s).",
                  scale=1e3, algorithms=labels)


def _with_speedup(frame: pd.DataFrame, baseline: str, column: str = "latency_s") -> pd.DataFrame:
    """``speedup``: ``column`` of ``baseline`` at the same point over each row's; a row is out of memory when it
    or the baseline is."""
    view, keys = point_view(frame)
    view["_key"] = _joined(view, keys) if keys else ""
    base = view.assign(_ok=feasible(view))[view["algorithm"] == baseline]
    base = base[["_key", column, "_ok"]].rename(columns={column: "_base", "_ok": "_base_ok"})
    merged = frame.assign(_key=view["_key"]).merge(base.drop_duplicates("_key"), on="_key", how="left")
    merged.index = frame.index
    merged["speedup"] = merged["_base"] / merged[column]
    merged["oom"] = ~(feasible(merged) & merged["_base_ok"].fillna(False).astype(bool))
    return merged.drop(columns=["_key", "_base", "_base_ok"])


def _joined(view: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Each row's ``keys`` as text joined by ``|`` (column by column: a row-wise join costs a call per row)."""
    joined = view[keys[0]].astype(str)
    for key in keys[1:]:
        joined = joined + "|" + view[key].astype(str)
    return joined


def timeline_caption(meta: dict[str, Any]) -> str:
    """What the timeline draws: which sweep point, and (``scope: model``) that it is one layer's attention."""
    text = f"Per-rank timeline of sweep point {_where(meta.get('timeline_point') or {})}, every algorithm."
    if meta.get("scope") == "model":
        layers = meta.get("layers")
        text += (f" Scope `model`: this is ONE attention layer{f' (of {layers})' if layers else ''} of the decode "
                 "step, not the whole step; the step's latency in the tables adds every layer's projections, MLP "
                 "and attention and the LM head.")
    return text


def _csv_link(results: str) -> str:
    """A Markdown link to the results file, relative to the report."""
    return f"[{Path(results).name}]({quote(results)})"


def _large(frame: pd.DataFrame, table: pd.DataFrame, measure: Measure, results: str) -> list[Block]:
    """A large sweep's summaries: per panel of the figures, and the points with the largest and smallest
    speedups (with one algorithm: its slowest and fastest points); every point is in the results file."""
    dims = dims_of(frame)
    facets = [k for k in (dims.col, dims.row) if k is not None and k in table]
    parts = overview(table, facets, TOP, compare=frame["algorithm"].nunique() > 1)
    compare = "fastest" in parts["per facet"]
    what = ", ".join(f"`{k.split('.')[-1]}`" for k in facets)
    ranged = "the range of the fastest's speedup" if compare else f"the range of its {measure.noun} (ms)"
    blocks: list[Block] = [
        Para(f"{len(table):,} sweep points: the summaries below, then the figures; every row is in "
             f"{_csv_link(results)} ({len(frame):,} rows)."),
        Heading("Per panel of the figures" if facets else "Over every point", 3),
        Para(f"Per value of {what}: the points, {'where each algorithm is fastest, ' if compare else ''}{ranged}."
             if facets else f"The points, {'where each algorithm is fastest, ' if compare else ''}{ranged}."),
        Table(parts["per facet"])]
    if "largest" in parts:
        most, least = ("largest speedup", "smallest speedup") if compare else \
            (f"longest {measure.noun}", f"shortest {measure.noun}")
        blocks += [Heading(f"The {len(parts['largest'])} points with the {most}", 3), Table(parts["largest"]),
                   Heading(f"The {len(parts['smallest'])} points with the {least}", 3), Table(parts["smallest"])]
    return blocks


def _latency_blocks(frame: pd.DataFrame, meta: dict[str, Any], capacity: float | None, results: str,
                    jobs: dict[str, Job]) -> Callable[[], list[Block]]:
    """The figures' jobs added to ``jobs`` at once; returns what lays out the blocks (conclusions, tables, the
    figures' captions), so that the figures are drawn while it runs."""
    target = (meta.get("targets") or {}).get("latency_s")
    baseline = baseline_of(frame, meta)
    measure = measure_of(frame)
    figures = _figures(frame, meta, capacity, baseline, measure, jobs)
    return lambda: _laid_out(frame, results, target, baseline, measure, figures)


def _laid_out(frame: pd.DataFrame, results: str, target: float | None, baseline: str | None, measure: Measure,
              figures: Callable[[], list[Block]]) -> list[Block]:
    table = summary(frame, target, baseline, measure)
    large = len(table) > LARGE_POINTS
    blocks: list[Block] = [Heading("Conclusions"), Items(tuple(headline(table, frame, target, measure)))]
    if large:
        blocks += _large(frame, table, measure, results)
    elif frame["algorithm"].nunique() > 1:
        blocks += [Para("Per sweep point (out-of-memory rows never count as fastest; a speedup is the baseline's "
                        f"{measure.noun} over the fastest's):"), Table(table)]
    else:  # nothing to compare an algorithm with: no fastest, no speedup, no runner-up
        blocks += [Para("Per sweep point:"), Table(table.drop(columns=[
            c for c in table.columns if c in ("fastest", "next best") or "speedup over " in str(c)]))]
    blocks += figures()
    if large:
        return blocks
    tables = [(TPOT, "Time per output token (ms)"), (LATENCY, f"{latency_label(frame).capitalize()} (ms)")] \
        if measure is TPOT else [(LATENCY, f"{latency_label(frame).capitalize()} (ms)")]
    for m, title in tables:
        cells, any_oom = _cells(frame, m.column, 1e3, baseline)
        notes = [f"`{baseline}/x`: `{baseline}`'s {m.noun} over x's (above 1: x is faster)."] \
            if any("/" in str(c) for c in cells.columns) else []
        if any_oom:
            notes.append("`OOM`: the algorithm runs out of device memory at that point.")
        blocks += [Heading(title), *([Para(" ".join(notes))] if notes else []), Table(cells)]
    blocks += [Heading("Peak memory per rank (GB)"), Table(_cells(frame, "peak_mem_bytes", 1e-9)[0])]
    return blocks


def _data(data: bytes) -> Callable[[Path], object]:
    return lambda tmp: tmp.write_bytes(data)


def _text(text: str) -> Callable[[Path], object]:
    return lambda tmp: tmp.write_text(text, encoding="utf-8")


def write_pages(out: Path, title: str, blocks: list[Block], figures: dict[str, bytes]) -> list[Path]:
    """``report.md`` and ``report.html`` from ``blocks``, the PNG files beside them; returns the files written.
    Every file is written whole under a temporary name first, then all are renamed into place: a full disk leaves
    no truncated figure or page (the error names the file that failed, and the temporary files are removed)."""
    files = {out / name: _data(data) for name, data in figures.items()}
    files[out / "report.md"] = _text(to_markdown(blocks))
    files[out / "report.html"] = _text(to_html(blocks, title))
    done: list[tuple[Path, Path]] = []
    try:
        for path, write in files.items():
            done.append((temp_beside(path, write), path))
    except BaseException:
        for tmp, _ in done:
            tmp.unlink(missing_ok=True)
        raise
    replace_all(done)
    return list(files)


def _intro(title: str, meta: dict[str, Any], rows: int) -> list[Block]:
    return [Heading(title, 1),
            Items((f"scenario: `{meta.get('source', '?')}`", f"topology: `{meta.get('topology', '?')}`",
                   f"treering version: {meta.get('version', '?')}", f"rows: {rows}", "reproduce:")),
            Code(str(meta.get("command", "?")))]


def write_report(frame: pd.DataFrame, out: Path, meta: dict[str, Any], timeline: pd.DataFrame | None = None,
                 capacity_bytes: float | None = None, results: str = "results.csv", drawer: Drawer | None = None
                 ) -> list[Path]:
    """Write ``report.md``, ``report.html`` and the figures (PNG) into ``out``; returns the files written. Every
    kind of rows opens with its conclusions. ``results``: the results file, relative to ``out`` (what a large
    sweep's report links to). ``drawer``: a process ready to draw the figures (:mod:`.render`; it is closed), else
    they are drawn here."""
    return start_report(frame, out, meta, timeline, capacity_bytes, results, drawer)()


def _started(frame: pd.DataFrame, meta: dict[str, Any], timeline: pd.DataFrame | None, capacity_bytes: float | None,
             results: str, drawer: Drawer | None, title: str) -> tuple[list[Block], Callable[[], dict[str, bytes]]]:
    """The report's blocks, its figures started first (:func:`start_report`)."""
    blocks = _intro(title, meta, len(frame))
    kind = rows_kind(frame)
    link = _csv_link(results)
    jobs: dict[str, Job] = {}  # the figures to draw, each block's bytes to come (drawn below, two at a time)
    laid_out: Callable[[], list[Block]] | None = None  # what lays out the latency rows' blocks, once drawing
    if kind == "collective" and frame["busbw_GBps"].notna().any():
        from simulator.report.collective import collective_blocks  # (draws its figures itself, with matplotlib)

        blocks += collective_blocks(frame[frame["busbw_GBps"].notna()], LARGE_POINTS, link)
    elif kind == "flows" and len(frame):
        from simulator.report.collective import flows_blocks

        blocks += flows_blocks(frame, LARGE_POINTS * 10, link)
    elif "latency_s" in frame and frame["latency_s"].notna().any():
        laid_out = _latency_blocks(frame[frame["latency_s"].notna()], meta, capacity_bytes, results, jobs)
    else:
        shown = frame.head(LARGE_POINTS)
        blocks += [Heading("Conclusions"), Items((f"No row has a result to compare (see the `error` column, if any, "
                                                  f"of {link}).",)),
                   Heading("Results" if len(shown) == len(frame) else f"The first {len(shown)} of {len(frame)} rows"),
                   Table(shown)]
    if timeline is not None and len(timeline):
        jobs["timeline.png"] = Job(gantt_png, (timeline,), cost=1.5 + len(timeline) / _GANTT_BARS)
    drawing = start_render(jobs, drawer)  # the figures first: the tables and conclusions are laid out meanwhile
    if laid_out is not None:
        blocks += laid_out()
    if timeline is not None and len(timeline):
        blocks += [Heading("Timeline"), Image("timeline.png", b"", timeline_caption(meta))]
    return blocks, drawing


def start_report(frame: pd.DataFrame, out: Path, meta: dict[str, Any], timeline: pd.DataFrame | None = None,
                 capacity_bytes: float | None = None, results: str = "results.csv", drawer: Drawer | None = None
                 ) -> Callable[[], list[Path]]:
    """:func:`write_report` in two steps: the report's blocks made and its figures started (by ``drawer``, if
    given); the function returned waits for the figures and writes the files. The caller may write other files in
    between, while the figures are drawn."""
    title = f"treering report: {meta.get('scenario', '?')}"
    with point_views_kept():  # (the rows' view worked out once for the whole report)
        blocks, drawing = _started(frame, meta, timeline, capacity_bytes, results, drawer, title)

    def finish() -> list[Path]:
        drawn = drawing()
        done = [replace(b, data=drawn[b.name]) if isinstance(b, Image) and b.name in drawn else b for b in blocks]
        figures = {b.name: b.data for b in done if isinstance(b, Image)}
        written = write_pages(out, title, done, figures)
        write_text_atomic(out / META_FILE, json.dumps(meta, indent=2))
        return [*written, out / META_FILE]

    return finish
