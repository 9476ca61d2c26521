"""``treering sensitivity``'s outputs: the tornado chart, the table and the conclusions (does the ranking flip?).

The records (:func:`simulator.run.sensitivity.run_sensitivity`) hold the outcome of each algorithm at the base
point and at each variation. Per algorithm, an input's bar spans the lowest to the highest outcome over its values,
as a change from the base (%); inputs sorted by the widest span (a tornado). The ranking of the algorithms is their
order by outcome (the lowest first); the conclusions say whether any variation changes it, which input and value,
and which algorithm is then best.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from simulator.report.figures import png
from simulator.support.files import write_atomic, write_csv_atomic, write_text_atomic

__all__ = ["conclusions", "ranking", "spans", "tornado_figure", "write_sensitivity"]


def ranking(frame: pd.DataFrame) -> list[str]:
    """The algorithms of ``frame`` (one variation's rows) from the lowest outcome to the highest (ties: by name)."""
    ordered = frame.sort_values(["outcome", "algorithm"], kind="stable")
    return [str(a) for a in ordered["algorithm"]]


def spans(records: pd.DataFrame) -> pd.DataFrame:
    """Per algorithm and input: the lowest and highest outcome over its values, as % changes from the base, and
    the value at each end; inputs by widest span first."""
    base = dict(zip(records.loc[records["key"] == "base", "algorithm"], records.loc[records["key"] == "base",
                                                                               "outcome"], strict=True))
    rows = []
    for (algo, key), group in records[records["key"] != "base"].groupby(["algorithm", "key"], sort=False):
        ref = float(base[algo])
        change = (group["outcome"] - ref) / ref * 100.0 if ref else group["outcome"] * 0.0
        lo, hi = int(change.to_numpy().argmin()), int(change.to_numpy().argmax())
        rows.append({"algorithm": algo, "key": key, "low_pct": float(change.iloc[lo]),
                     "low_value": str(group["value"].iloc[lo]), "high_pct": float(change.iloc[hi]),
                     "high_value": str(group["value"].iloc[hi])})
    out = pd.DataFrame(rows, columns=["algorithm", "key", "low_pct", "low_value", "high_pct", "high_value"])
    out["span"] = out["high_pct"] - out["low_pct"]
    return out.sort_values(["algorithm", "span"], ascending=[True, False], kind="stable").reset_index(drop=True)


def conclusions(records: pd.DataFrame, metric: str) -> list[str]:
    """What moves the outcome most per algorithm, and whether the ranking of the algorithms ever flips."""
    lines = []
    table = spans(records)
    for algo, group in table.groupby("algorithm", sort=False):
        top = group.iloc[0]
        lines.append(f"{algo}: {top['key']} moves {metric} most, {top['low_pct']:+.1f}% ({top['low_value']}) to "
                     f"{top['high_pct']:+.1f}% ({top['high_value']}).")
    base_rank = ranking(records[records["key"] == "base"])
    if len(base_rank) < 2:
        return [*lines, "One algorithm: no ranking to flip."]
    flips = []
    for (key, value), group in records[records["key"] != "base"].groupby(["key", "value"], sort=False):
        order = ranking(group)
        if order != base_rank:
            best = group.set_index("algorithm")["outcome"]
            flips.append(f"{key}={value}: {' < '.join(order)} ({order[0]} {best[order[0]]:.4g} vs "
                         f"{base_rank[0]} {best[base_rank[0]]:.4g})")
    if flips:
        lines.append(f"The ranking of the algorithms ({' < '.join(base_rank)} at the base point) flips under "
                     f"{len(flips)} variation(s): " + "; ".join(flips) + ".")
    else:
        lines.append(f"The ranking of the algorithms ({' < '.join(base_rank)}) holds under every variation.")
    return lines


def tornado_figure(records: pd.DataFrame, metric: str) -> plt.Figure:
    """One tornado per algorithm: each input's bar from its lowest to its highest change of ``metric`` (%)."""
    table = spans(records)
    algos = list(dict.fromkeys(records["algorithm"]))
    keys = list(dict.fromkeys(table["key"]))
    fig, axes = plt.subplots(1, len(algos), figsize=(4.2 * len(algos) + 1.5, 0.45 * len(keys) + 1.6),
                             squeeze=False, sharey=False)
    for ax, algo in zip(axes[0], algos, strict=True):
        group = table[table["algorithm"] == algo].iloc[::-1]  # the widest at the top
        y = range(len(group))
        ax.barh(list(y), group["high_pct"] - group["low_pct"], left=group["low_pct"], color="#4c72b0", height=0.6)
        ax.set_yticks(list(y), [f"{k}\n{lo} .. {hi}" if span > 0 else f"{k}\n(no change)" for k, lo, hi, span in
                                zip(group["key"], group["low_value"], group["high_value"], group["span"],
                                    strict=True)], fontsize=8)
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.set_title(algo, fontsize=10)
        ax.set_xlabel(f"{metric}: change from the base (%)", fontsize=9)
    fig.tight_layout()
    return fig


def write_sensitivity(records: pd.DataFrame, metric: str, out: Path, name: str) -> str:
    """``sensitivity.csv`` (the records), ``tornado.png`` and ``sensitivity.md`` (table and conclusions) in
    ``out``; returns the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(records, out / "sensitivity.csv")
    fig = tornado_figure(records, metric)
    data = png(fig)
    plt.close(fig)
    write_atomic(out / "tornado.png", lambda p: p.write_bytes(data))
    table = spans(records)
    lines = [f"# {name}: sensitivity of {metric}", "", *conclusions(records, metric), "",
             "![tornado](tornado.png)", "", "| algorithm | input | lowest | at | highest | at |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r.algorithm} | {r.key} | {r.low_pct:+.1f}% | {r.low_value} | {r.high_pct:+.1f}% | {r.high_value} |"
              for r in table.itertuples()]
    base = records[records["key"] == "base"]
    lines += ["", f"Base point ({metric}): " + ", ".join(
        f"{a} {v:.4g}" for a, v in zip(base["algorithm"], base["outcome"], strict=True)) + "."]
    text = "\n".join(lines) + "\n"
    write_text_atomic(out / "sensitivity.md", text)
    return text
