"""``treering plan -o DIR``: the plan as a report (``report.md``, ``report.html``, ``plan.csv``, figures).

:func:`write_plan_report` takes the plan's answer table, one row per algorithm (the columns ``plan`` prints:
``algorithm, nodes, gpus, tp, tbt_ms, peak_mem_GB, binding``; any others are shown as they are), and optionally
every configuration the search simulated (``candidates``: one row each with ``algorithm, ranks, latency_s,
peak_mem_bytes, oom`` and optionally ``tp``), which are drawn: time between tokens and peak memory per GPU
against GPUs, the target and the device memory as lines, out-of-memory configurations hollow and crossed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.report.document import Block, Code, Heading, Image, Items, Para, Table
from simulator.report.figures import HLine, facet_figure, png
from simulator.report.pages import META_FILE, write_pages
from simulator.schedule.memory import usable_bytes
from simulator.support.files import write_csv_atomic, write_text_atomic

__all__ = ["PLAN_FILE", "plan_conclusion", "write_plan_report"]

PLAN_FILE = "plan.csv"


def _met(row: pd.Series) -> bool:
    if "met" in row:
        return bool(row["met"])
    try:
        float(row.get("nodes", "-"))  # ``plan`` writes "-" when not met
    except (TypeError, ValueError):
        return False
    return True


def _num(value: Any) -> str:
    return f"{int(value)}" if isinstance(value, float) and value.is_integer() else str(value)


def _config(row: pd.Series) -> str:
    """``tree on 4 node(s), 32 GPUs, 8 way tensor parallel, 25.09 ms, 60.6 GB per GPU``."""
    names = {"nodes": "node(s)", "gpus": "GPUs", "tp": "way tensor parallel"}
    where = ", ".join(f"{_num(row[c])} {names[c]}" for c in names if c in row and pd.notna(row[c]))
    text = f"`{row['algorithm']}` on {where}"
    if "layout" in row and pd.notna(row["layout"]):
        text += f" ({row['layout']})"
    if "ttft_s" in row and pd.notna(row["ttft_s"]):
        text += f", TTFT {float(row['ttft_s']):.4g} s"
    if "tbt_ms" in row and pd.notna(row["tbt_ms"]):
        text += f", {float(row['tbt_ms']):.4g} ms"
    if "tpot_ms" in row and pd.notna(row["tpot_ms"]):
        text += f", {float(row['tpot_ms']):.4g} ms per output token"
    if "peak_mem_GB" in row and pd.notna(row["peak_mem_GB"]):
        text += f", {float(row['peak_mem_GB']):.4g} GB per GPU"
    return text


def plan_conclusion(frame: pd.DataFrame, meta: dict[str, Any]) -> list[str]:
    """The answer in sentences: the smallest configuration that meets the target (or, when none does, the fastest
    one that fits), and each algorithm's verdict with its binding constraint."""
    target = meta.get("target_s")
    goal = f"a time between tokens of {target * 1e3:g} ms" if target else "the target"
    if meta.get("ttft_s"):  # plan SCENARIO --ttft: a time to first token, and perhaps one between tokens
        goal = f"a time to first token of {meta['ttft_s']:g} s" + (f" and {goal}" if target else "")
    met = frame[frame.apply(_met, axis=1)] if len(frame) else frame
    order = [c for c in ("gpus", "ttft_s", "tbt_ms") if c in frame]
    lines = []
    if len(met):
        best = met.assign(**{c: pd.to_numeric(met[c], errors="coerce") for c in order}).sort_values(order).iloc[0]
        lines.append(f"Smallest configuration that meets {goal}: {_config(best)}.")
    else:
        lines.append(f"No algorithm meets {goal} within the search.")
        speed = next((c for c in ("ttft_s", "tbt_ms") if c in frame), None)
        if speed:
            fits = frame.assign(**{speed: pd.to_numeric(frame[speed], errors="coerce")}).dropna(subset=[speed])
            if len(fits):
                lines.append(f"The fastest configuration that fits: {_config(fits.sort_values(speed).iloc[0])}.")
    for _, row in frame.iterrows():
        verdict = "meets it" if _met(row) else "does not meet it"
        why = [f"binding: {row[c]}" if c == "binding" else f"bottleneck: {row[c]}"
               for c in ("binding", "bottleneck") if c in row and pd.notna(row[c]) and str(row[c])]
        lines.append(f"`{row['algorithm']}` {verdict}" + (f" ({'; '.join(why)})" if why else "") + ".")
    return lines


def _figures(candidates: pd.DataFrame, meta: dict[str, Any]) -> list[Block]:
    frame = candidates.rename(columns={"tp": "workload.tp"})
    algos = list(dict.fromkeys(frame["algorithm"]))
    target = meta.get("target_s")
    cap = meta.get("capacity_bytes")
    frac = meta.get("mem_fraction")
    lat_lines = (HLine(target * 1e3, f"target {target * 1e3:g} ms", "crimson"),) if target else ()
    mem_lines = [HLine(cap / 1e9, f"device memory {cap / 1e9:.4g} GB")] if cap else []
    if cap and frac and frac < 1:
        usable = usable_bytes(cap, frac)
        mem_lines.append(HLine(usable / 1e9, f"usable ({frac:.0%}) {usable / 1e9:.4g} GB", "gray"))
    return [Heading("Every configuration simulated"),
            Image("plan-latency.png", png(facet_figure(frame, "latency_s", "time between tokens (ms)", scale=1e3,
                                                       lines=lat_lines, algorithms=algos)),
                  "Time between tokens of each configuration tried (hollow, crossed: out of memory)."),
            Image("plan-memory.png", png(facet_figure(frame, "peak_mem_bytes", "peak memory per GPU (GB)",
                                                      scale=1e-9, lines=tuple(mem_lines), algorithms=algos)),
                  "Peak memory of the fullest GPU (weights, KV cache of every layer, buffers), in GB.")]


def write_plan_report(frame: pd.DataFrame, out_dir: Path, meta: dict[str, Any],
                      candidates: pd.DataFrame | None = None) -> list[Path]:
    """Write ``plan.csv``, ``report.md``, ``report.html``, ``meta.json`` (and figures of ``candidates``) into
    ``out_dir``; returns the files written. ``meta``: ``model``, ``context``, ``target_s``, ``topology``,
    ``command``, ``version``, optionally ``sets``, ``capacity_bytes``, ``mem_fraction``."""
    title = f"treering plan: {meta.get('model', '?')}, context {meta.get('context', '?'):,} tokens" \
        if isinstance(meta.get("context"), int) else f"treering plan: {meta.get('model', '?')}"
    target = meta.get("target_s")
    goal = [f"{meta['ttft_s']:g} s to first token"] if meta.get("ttft_s") else []
    goal += [f"{target * 1e3:g} ms between tokens"] if target else []
    facts = [f"model: `{meta.get('model', '?')}`", f"topology: `{meta.get('topology', '?')}`",
             f"target: {' and '.join(goal) or '?'}",
             f"treering version: {meta.get('version', '?')}", "reproduce:"]
    if meta.get("sets"):
        facts.insert(2, "what-if: " + ", ".join(f"`{s}`" for s in meta["sets"]))
    blocks: list[Block] = [Heading(title, 1), Items(tuple(facts)), Code(str(meta.get("command", "?"))),
                           Heading("Conclusion"), Items(tuple(plan_conclusion(frame, meta))),
                           Para("Per algorithm:"), Table(frame)]
    if candidates is not None and len(candidates):
        blocks += _figures(candidates, meta)
    figures = {b.name: b.data for b in blocks if isinstance(b, Image)}
    written = write_pages(out_dir, title, blocks, figures)
    write_csv_atomic(frame, out_dir / PLAN_FILE)
    write_text_atomic(out_dir / META_FILE, json.dumps(meta, indent=2))
    return [*written, out_dir / PLAN_FILE, out_dir / META_FILE]
