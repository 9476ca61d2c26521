"""What a report concludes from decode results: per sweep point, the fastest algorithm that fits in memory, its
speedup, and what bounds it. Pure functions of the results table (no drawing).

A row is *feasible* when it has a latency and did not run out of memory (``oom``). Out-of-memory rows never win a
point and never serve as the reference of a speedup.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import pandas as pd

__all__ = ["feasible", "headline", "point_columns", "point_view", "summary", "swept_keys", "times"]

_IDENTITY = ("ranks", "nodes", "context")


def _twin(frame: pd.DataFrame, column: str, key: str) -> bool:
    """Whether swept ``column`` only repeats the stable column ``key`` (``topology_params.nodes`` and ``nodes``):
    equal for every algorithm, except those for which ``key`` does not vary (``single`` stays on one device)."""
    same = frame[column].astype(str) == frame[key].astype(str)
    if same.all():
        return True
    groups = [g.index for _, g in frame.groupby("algorithm", sort=False)] if "algorithm" in frame else [frame.index]
    if not all(same[i].all() or frame.loc[i, key].nunique() == 1 for i in groups):
        return False
    return any(same[i].all() and frame.loc[i, column].nunique() > 1 for i in groups)


def _swept(frame: pd.DataFrame) -> dict[str, str | None]:
    """Each varying swept column (dotted key) -> the stable column it repeats, or None."""
    swept = [c for c in frame.columns if "." in c and frame[c].nunique() > 1]
    return {c: next((k for k in _IDENTITY if k in frame and _twin(frame, c, k)), None) for c in swept}


def swept_keys(frame: pd.DataFrame) -> list[str]:
    """Swept columns (dotted keys) that vary and do not repeat a stable column (``topology_params.nodes``)."""
    return [c for c, twin in _swept(frame).items() if twin is None]


def point_view(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``frame`` with the columns that name its sweep point, and their names: a swept key that repeats a stable
    column is shown by that column's name (``nodes``, ``context``) with the point's value (also for ``single``,
    which stays on one device). Without a sweep, the point is named by its context."""
    view, keys = frame.copy(), []
    for column, twin in _swept(frame).items():
        if twin is None:
            keys.append(column)
        else:
            view[twin] = frame[column]
            keys.append(twin)
    if not keys and "context" in frame:
        keys = ["context"]
    order = [k for k in _IDENTITY[::-1] if k in keys]  # context, nodes, ranks first
    return view, order + [k for k in keys if k not in order]


def point_columns(frame: pd.DataFrame) -> list[str]:
    """The names of the columns of :func:`point_view` that name a sweep point."""
    return point_view(frame)[1]


def feasible(frame: pd.DataFrame) -> pd.Series:
    """Rows with a latency that fit in device memory."""
    ok = frame["latency_s"].notna()
    if "oom" in frame:
        ok &= ~frame["oom"].astype(str).str.lower().isin(["true", "1"])
    return ok


def times(ratio: float) -> str:
    """A ratio as ``23.4x`` or ``4,519x``."""
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x"


def _bound(row: pd.Series) -> str:
    comm = float(row["comm_s"]) / float(row["latency_s"]) if row["latency_s"] else 0.0
    return f"communication ({comm:.0%} of the step)" if comm > 0.5 else f"compute ({1 - comm:.0%} of the step)"


def _point_row(keys: dict[str, object], part: pd.DataFrame, ok: pd.Series, target_s: float | None,
               baseline: str) -> dict[str, object]:
    row: dict[str, object] = dict(keys)
    good = part[ok].sort_values("latency_s", kind="stable")
    oom = [str(a) for a in part.loc[~ok & part["latency_s"].notna(), "algorithm"]]
    if good.empty:
        row.update({"fastest": "none (all out of memory)", "ranks": "", "latency_ms": float("nan"),
                    f"x over {baseline}": "",
                    "next best": "", "bound by": "memory"})
    else:
        best = good.iloc[0]
        base = good[good["algorithm"] == baseline]
        if baseline not in set(part["algorithm"]):
            speedup = ""
        elif base.empty:
            speedup = f"({baseline} out of memory)"
        else:
            speedup = times(float(base["latency_s"].iloc[0]) / float(best["latency_s"]))
        runner = ""
        if len(good) > 1:
            ratio = float(good.iloc[1]["latency_s"]) / float(best["latency_s"])
            runner = f"{good.iloc[1]['algorithm']} ({f'+{ratio - 1:.1%}' if ratio < 2 else times(ratio)})"
        row.update({"fastest": str(best["algorithm"]), "ranks": int(best["ranks"]),
                    "latency_ms": float(best["latency_s"]) * 1e3,
                    f"x over {baseline}": speedup, "next best": runner, "bound by": _bound(best)})
    row["out of memory"] = ", ".join(oom) if oom else "-"
    if target_s is not None:
        lat = row["latency_ms"]
        assert isinstance(lat, float)
        row[f"target {target_s * 1e3:g} ms"] = ("not met" if lat != lat
                                                else "met" if lat <= target_s * 1e3 else
                                                f"missed ({lat / (target_s * 1e3):.3g}x over)")
    return row


def summary(frame: pd.DataFrame, target_s: float | None = None, baseline: str | None = None) -> pd.DataFrame:
    """One row per sweep point: the fastest feasible algorithm, its latency (ms), its speedup over ``baseline``
    (default: the first algorithm of the results), the runner-up, what bounds the winner (communication or
    compute, by the critical rank's split), the algorithms that ran out of memory, and the latency target's
    verdict when there is one."""
    baseline = baseline if baseline is not None else str(frame["algorithm"].iloc[0])
    view, keys = point_view(frame)
    ok = feasible(view)
    rows = []
    for values, part in view.groupby(keys, sort=True) if keys else [((), view)]:
        vals = values if isinstance(values, tuple) else (values,)
        rows.append(_point_row(dict(zip(keys, vals, strict=True)), part, ok.loc[part.index], target_s, baseline))
    return pd.DataFrame(rows)


def _where(row: pd.Series, keys: Sequence[str]) -> str:
    return ", ".join(f"{k.split('.')[-1]} {row[k]:,}" if isinstance(row[k], numbers.Integral)
                     else f"{k.split('.')[-1]} {row[k]}" for k in keys)


def headline(table: pd.DataFrame, frame: pd.DataFrame, target_s: float | None = None) -> list[str]:
    """The conclusions in a few sentences, from :func:`summary`'s table and the results."""
    keys = point_columns(frame)
    n = len(table)
    lines = []
    won = table[~table["fastest"].str.startswith("none")]
    counts = won["fastest"].value_counts()
    wins = ", ".join(f"`{a}` at {c} of {n}" for a, c in counts.items())
    lines.append(f"Fastest algorithm that fits in memory: {wins or 'none'} sweep points.")
    column = next(c for c in table.columns if str(c).startswith("x over "))
    baseline = str(column).removeprefix("x over ")
    sp = pd.to_numeric(won[column].str.removesuffix("x").str.replace(",", ""), errors="coerce")
    if sp.notna().any():
        values = sp.to_numpy(dtype=float)
        hi, lo = won.iloc[int(np.nanargmax(values))], won.iloc[int(np.nanargmin(values))]
        lines.append(f"Speedup of the fastest over `{baseline}`: from {times(sp.min())} at {_where(lo, keys)} "
                     f"(`{lo['fastest']}`) to {times(sp.max())} at {_where(hi, keys)} (`{hi['fastest']}`).")
    bound = won["bound by"].str.split(" ").str[0].value_counts()
    lines.append("The fastest is bound by " + ", ".join(f"{b} at {c}" for b, c in bound.items()) + " points "
                 "(the critical rank's time waiting on transfers vs. in kernels).")
    view, keys = point_view(frame)
    ok = feasible(view)
    oom = view[~ok & view["latency_s"].notna()]
    if len(oom):
        pts = oom.groupby(keys).size() if keys else [len(oom)]
        lines.append(f"Out of device memory: {len(oom)} rows at {len(pts)} points (drawn hollow and crossed, "
                     "excluded from the fastest and the speedups).")
    else:
        lines.append("No algorithm runs out of device memory at any point.")
    if target_s is not None:
        met = (table[f"target {target_s * 1e3:g} ms"] == "met").sum()
        lines.append(f"Latency target {target_s * 1e3:g} ms: met at {met} of {n} points.")
    return lines
