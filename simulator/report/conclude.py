"""What a report concludes from latency results (decode, prefill, training, generate): per sweep point, the fastest
algorithm that fits in memory, its speedup, and what bounds it. Pure functions of the results table (no drawing).

A row is *feasible* when it has a latency and did not run out of memory (``oom``). Out-of-memory rows never win a
point and never serve as the reference of a speedup.

What is compared is a :class:`Measure`: a step's or a prefill's ``latency_s``, or, for ``generate`` rows, the time
per output token (``tpot_s``): there the prefill is shared by every decode schedule, so the time to first token and
the whole request are stated beside it, never folded into one ratio.

A swept key that only repeats a column of the rows (``topology_params.nodes`` and ``nodes``, ``workload.prompt``
``32K`` and ``context`` 32768, ``workload.backward`` and ``phase``: :data:`REPEATS`; ``workload.layout`` and
``layout``, equal values under the key's last name) names its points by that column: it is one axis, not two.
"""

from __future__ import annotations

import numbers
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simulator.report.document import plain_number

__all__ = ["LATENCY", "REPEATS", "TPOT", "Measure", "extreme_row", "feasible", "headline", "is_categorical",
           "measure_of", "ordered", "overview", "point_columns", "point_view", "ratio_values", "repeated_columns",
           "speedup_column", "summary", "swept_keys", "times"]

_IDENTITY = ("ranks", "nodes", "context")
_WHOLE_KEYS = ("faults",)  # top-level scenario keys that a sweep may vary whole (their column has no dot)

# a column -> the column of the rows it can only repeat (each value of one names one value of the other)
REPEATS: dict[str, str] = {
    "topology_params.nodes": "nodes", "topology_params.gpus": "ranks", "workload.context": "context",
    "workload.prompt": "context", "workload.sequence": "context", "workload.backward": "phase",
    "workload.bytes": "bytes", "sequence": "context",
    "faults": "faults_applied",  # a swept fault list, named by what it did (simulator.run.whatif)
}


@dataclass(frozen=True)
class Measure:
    """The quantity a report compares: its column (seconds), its name in sentences, its table column's stem."""

    column: str
    noun: str
    short: str


LATENCY = Measure("latency_s", "latency", "latency")
TPOT = Measure("tpot_s", "time per output token", "tpot")


def measure_of(frame: pd.DataFrame) -> Measure:
    """``generate`` rows (with ``tpot_s``) compare the time per output token; the others their latency."""
    return TPOT if "tpot_s" in frame and frame["tpot_s"].notna().any() else LATENCY


def is_categorical(values: pd.Series) -> bool:
    """Names, flags and mixed values are categories (drawn and ordered as such), numbers are quantities."""
    return pd.api.types.is_bool_dtype(values) or not pd.api.types.is_numeric_dtype(values)


def _bijective(part: pd.DataFrame, column: str, key: str) -> bool:
    pairs = part[[column, key]].astype(str).drop_duplicates()
    return bool(pairs[column].is_unique and pairs[key].is_unique)


def _twin_map(frame: pd.DataFrame, column: str, key: str, exact: bool) -> dict[str, Any] | None:
    """``column``'s values (as text) -> ``key``'s, when ``column`` only repeats ``key``: equal values (``exact``) or one
    to one, for every algorithm, except those for which ``key`` does not vary (``single`` stays on one device)."""
    if key not in frame or column not in frame:
        return None

    def pair(index: pd.Index) -> pd.DataFrame:  # the two columns' rows (all of them: no copy of the others)
        return frame[[column, key]] if index is frame.index else frame.loc[index, [column, key]]

    def same(index: pd.Index) -> bool:
        part = pair(index)
        if exact:
            return bool((part[column].astype(str) == part[key].astype(str)).all())
        return _bijective(part, column, key)

    if same(frame.index):
        good = [frame.index]
    else:
        groups = [g.index for _, g in frame.groupby("algorithm", sort=False)] if "algorithm" in frame else []
        if not groups or not all(same(i) or frame.loc[i, key].nunique() == 1 for i in groups):
            return None
        good = [i for i in groups if same(i) and frame.loc[i, column].nunique() > 1]
        if not good:
            return None
    pairs = pd.concat([pair(i) for i in good]).drop_duplicates(column)
    return dict(zip(pairs[column].astype(str), pairs[key], strict=True))


def _twin(frame: pd.DataFrame, column: str) -> tuple[str, dict[str, Any]] | None:
    """The column ``column`` repeats, and how its values map onto that column's; None when it repeats none."""
    parts = column.split(".")  # ``workload.layout`` and ``layout``, ``workload.model.heads`` and ``heads``
    own = [] if any(p.isdigit() for p in parts) else [(parts[-1], True)]  # not a key into a list (flows.1.bytes)
    candidates = ([(REPEATS[column], False)] if column in REPEATS else []) + own + [(k, True) for k in _IDENTITY]
    for key, exact in candidates:
        if key != column:
            mapping = _twin_map(frame, column, key, exact)
            if mapping is not None:
                return key, mapping
    return None


def _swept(frame: pd.DataFrame) -> dict[str, tuple[str, dict[str, Any]] | None]:
    """Each varying swept column (dotted key) -> the column it repeats (and the map onto it), or None."""
    return {c: _twin(frame, c) for c in frame.columns
            if ("." in c or c in _WHOLE_KEYS) and frame[c].nunique() > 1}


def repeated_columns(frame: pd.DataFrame) -> list[str]:
    """Columns that only repeat another column of ``frame`` (``sequence`` beside ``context``, ``workload.backward``
    beside ``phase``, ``topology_params.nodes`` beside ``nodes``): what a table need not show twice."""
    return [c for c in frame.columns if (c in REPEATS or "." in c) and _twin(frame, c) is not None]


def swept_keys(frame: pd.DataFrame) -> list[str]:
    """Swept columns (dotted keys) that vary and do not repeat a column of the rows."""
    return [c for c, twin in _swept(frame).items() if twin is None]


_KEPT: dict[int, tuple[pd.DataFrame, pd.DataFrame, list[str]]] | None = None  # frame id -> frame, view, keys


@contextmanager
def point_views_kept() -> Iterator[None]:
    """Inside the block, :func:`point_view` works out each frame's view once (a frame is known by its identity, and
    held, so that its id is not reused) and hands out copies: laying out one report asks for the same rows' view up
    to ten times. The frames given to it must not change inside the block."""
    global _KEPT
    outer = _KEPT
    _KEPT = {} if outer is None else outer
    try:
        yield
    finally:
        _KEPT = outer


def point_view(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``frame`` with the columns that name its sweep point, and their names: a swept key that repeats a column of
    the rows is shown by that column's name (``nodes``, ``context``, ``phase``) with the point's value (also for
    ``single``, which stays on one device). Without a sweep, the point is named by its context."""
    if _KEPT is None:
        return _point_view(frame)
    kept = _KEPT.get(id(frame))
    if kept is None or kept[0] is not frame:
        kept = _KEPT[id(frame)] = (frame, *_point_view(frame))
    return kept[1].copy(), list(kept[2])


def _point_view(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    view, keys = frame.copy(), []
    for column, twin in _swept(frame).items():
        if twin is None:
            keys.append(column)
        elif twin[0] not in keys:
            name, mapping = twin
            view[name] = frame[column].astype(str).map(mapping).astype(frame[name].dtype)
            keys.append(name)
    if not keys and "context" in frame:
        keys = ["context"]
    order = [k for k in _IDENTITY[::-1] if k in keys]  # context, nodes, ranks first
    return view, order + [k for k in keys if k not in order]


def point_columns(frame: pd.DataFrame) -> list[str]:
    """The names of the columns of :func:`point_view` that name a sweep point."""
    return point_view(frame)[1]


def ordered(view: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """``view``'s rows by their point: numbers ascending, names and flags in the order they first appear (the
    sweep's order), so that ``1M`` follows ``32K`` and ``prefill`` precedes ``train``."""
    if not keys:
        return view
    rank = {}
    for k in keys:
        values = view[k]
        if is_categorical(values):
            text = values.astype(str)
            rank[k] = text.map({v: i for i, v in enumerate(dict.fromkeys(text))})
        else:
            rank[k] = values
    return view.loc[pd.DataFrame(rank, index=view.index).sort_values(list(keys), kind="stable").index]


def feasible(frame: pd.DataFrame) -> pd.Series:
    """Rows with a latency that fit in device memory."""
    ok = frame["latency_s"].notna()
    if "oom" in frame:
        ok &= ~frame["oom"].astype(str).str.lower().isin(["true", "1"])
    return ok


def times(ratio: float) -> str:
    """A ratio as ``23.4x`` or ``4,519x``; one within half a percent of 1 with three decimals (``1.004x``), so that
    a near tie does not read ``1x``."""
    if ratio >= 100:
        return f"{ratio:,.0f}x"
    if ratio != 1 and abs(ratio - 1) < 0.005:
        return f"{ratio:.3f}x"
    return f"{ratio:.3g}x"


def _duration(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def _bound(row: Mapping[str, Any]) -> str:
    comm = float(row["comm_s"]) / float(row["latency_s"]) if row["latency_s"] else 0.0
    return f"communication ({comm:.0%} of the latency)" if comm > 0.5 else \
        f"compute ({1 - comm:.0%} of the latency)"


def speedup_column(baseline: str, measure: Measure = LATENCY) -> str:
    """The summary's speedup column: ``speedup over ring`` (``TPOT speedup over ring`` for generate rows)."""
    return f"{'TPOT ' if measure is TPOT else ''}speedup over {baseline}"


def _ratio(base: list[dict[str, Any]], best: Mapping[str, Any], column: str, baseline: str, present: bool) -> str:
    if not present:
        return ""
    if not base:
        return f"({baseline} out of memory)"
    return times(float(base[0][column]) / float(best[column]))


def _ascending(rows: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    """``rows`` by ``column`` ascending, ties in their order and NaN last (pandas' stable ``sort_values``)."""
    return sorted(rows, key=lambda r: (r[column] != r[column], 0.0 if r[column] != r[column] else r[column]))


def _point_row(keys: dict[str, object], part: list[dict[str, Any]], ok: list[bool], ran: list[bool],
               target_s: float | None, baseline: str, measure: Measure) -> dict[str, object]:
    """One point's summary row from its rows (``part``: each a mapping of the columns it reads, in the results'
    order), whether each is feasible (``ok``) and whether each has a latency (``ran``)."""
    row: dict[str, object] = dict(keys)
    col, value = measure.column, f"{measure.short}_ms"
    good = _ascending([r for r, fits in zip(part, ok, strict=True) if fits], col)
    oom = [str(r["algorithm"]) for r, fits, has in zip(part, ok, ran, strict=True) if has and not fits]
    present = baseline in {r["algorithm"] for r in part}
    if not good:
        row.update({"fastest": "none (all out of memory)", "ranks": "", value: float("nan"),
                    speedup_column(baseline, measure): "", "next best": ""})
        if measure is TPOT:
            row.update({"ttft_ms": float("nan"), "request_ms": float("nan"), f"request speedup over {baseline}": ""})
        else:
            row["bound by"] = "memory"
    else:
        best = good[0]
        base = [r for r in good if r["algorithm"] == baseline]
        runner = ""
        if len(good) > 1:
            second = good[1]
            runner = (f"{second['algorithm']} ({times(float(second[col]) / float(best[col]))} the {measure.noun} "
                      f"of {best['algorithm']})")
        row.update({"fastest": str(best["algorithm"]), "ranks": int(best["ranks"]), value: float(best[col]) * 1e3,
                    speedup_column(baseline, measure): _ratio(base, best, col, baseline, present),
                    "next best": runner})
        if measure is TPOT:
            row.update({"ttft_ms": float(best["ttft_s"]) * 1e3, "request_ms": float(best["latency_s"]) * 1e3,
                        f"request speedup over {baseline}": _ratio(base, best, "latency_s", baseline, present)})
        else:
            row["bound by"] = _bound(best)
    row["out of memory"] = ", ".join(oom) if oom else "-"
    if target_s is not None:
        lat = float(best["latency_s"]) * 1e3 if good else float("nan")
        row[f"target {target_s * 1e3:g} ms"] = ("not met" if lat != lat
                                                else "met" if lat <= target_s * 1e3 else
                                                f"missed ({lat / (target_s * 1e3):.3g}x over)")
    return row


_READ = ("algorithm", "latency_s", "comm_s", "ranks", "ttft_s", "tpot_s")  # the columns a point's summary reads


def summary(frame: pd.DataFrame, target_s: float | None = None, baseline: str | None = None,
            measure: Measure | None = None) -> pd.DataFrame:
    """One row per sweep point: the fastest feasible algorithm by ``measure`` (default :func:`measure_of`), its
    value (ms), its speedup over ``baseline`` (default: the first algorithm of the results), the runner-up and how
    much slower it is, what bounds the winner (communication or compute, by the critical rank's split; for generate
    rows instead the time to first token and the whole request with its own speedup), the algorithms that ran out of
    memory, and the latency target's verdict when there is one."""
    measure = measure or measure_of(frame)
    baseline = baseline if baseline is not None else str(frame["algorithm"].iloc[0])
    view, keys = point_view(frame)
    ok = feasible(view)
    if measure is TPOT:
        ok &= view["tpot_s"].notna()
    view = ordered(view, keys)
    fits, ran = ok.loc[view.index].tolist(), view["latency_s"].notna().tolist()
    # each row as a plain mapping of the columns read (a point's rows picked out of the frame cost far more)
    read = [c for c in _READ if c in view]
    columns = [view[c].tolist() for c in read]
    records = [dict(zip(read, values, strict=True)) for values in zip(*columns, strict=True)]
    groups: list[tuple[tuple[Any, ...], list[int]]] = [((), list(range(len(view))))]
    if keys:
        # the points as groupby(sort=False) gives them: in order of first appearance, rows in order, named by their
        # key values (a row with a missing key value belongs to no point)
        found = view.groupby(keys, sort=False).indices
        groups = sorted(((k if isinstance(k, tuple) else (k,), [int(i) for i in at]) for k, at in found.items()),
                        key=lambda group: group[1][0])
    rows = [_point_row(dict(zip(keys, vals, strict=True)), [records[i] for i in part], [fits[i] for i in part],
                       [ran[i] for i in part], target_s, baseline, measure) for vals, part in groups]
    return pd.DataFrame(rows)


def _value(key: str, value: Any) -> str:
    return f"{key.split('.')[-1]} {value:,}" if isinstance(value, numbers.Integral) and not isinstance(value, bool) \
        else f"{key.split('.')[-1]} {value}"


def _where(row: pd.Series, keys: Sequence[str]) -> str:
    return ", ".join(_value(k, row[k]) for k in keys) or "the only point"


def ratio_values(column: pd.Series) -> pd.Series:
    """``2.36x``, ``4,519x`` -> numbers (anything else: NaN)."""
    text = column.astype(str).str.removesuffix("x").str.replace(",", "")
    return pd.to_numeric(text, errors="coerce")


def _range_line(won: pd.DataFrame, column: str, keys: Sequence[str], what: str) -> str | None:
    sp = ratio_values(won[column])
    if not sp.notna().any():
        return None
    values = sp.to_numpy(dtype=float)
    hi, lo = won.iloc[int(np.nanargmax(values))], won.iloc[int(np.nanargmin(values))]
    if len(won) == 1 or sp.min() == sp.max():
        return f"{what}: {times(sp.max())} at {_where(hi, keys)} (`{hi['fastest']}`)."
    return (f"{what}: from {times(sp.min())} at {_where(lo, keys)} (`{lo['fastest']}`) to {times(sp.max())} at "
            f"{_where(hi, keys)} (`{hi['fastest']}`).")


def extreme_row(frame: pd.DataFrame, column: str, largest: bool = False) -> pd.Series:
    """The first row with the smallest (``largest``: the largest) value of ``column``."""
    values = frame[column].to_numpy(dtype=float)
    return frame.iloc[int(np.nanargmax(values) if largest else np.nanargmin(values))]


def _ttft_line(frame: pd.DataFrame, keys: list[str]) -> str:
    view = point_view(frame)[0]
    firsts = ordered(view, keys).groupby(keys, sort=False).first().reset_index() if keys else view.iloc[:1]
    lo, hi = extreme_row(firsts, "ttft_s"), extreme_row(firsts, "ttft_s", largest=True)
    prefill = ", ".join(f"`{p}`" for p in dict.fromkeys(frame["prefill"].astype(str))) if "prefill" in frame else ""
    shared = f" (the prefill{f', {prefill},' if prefill else ''} is the same for every decode schedule)"
    if len(firsts) == 1 or lo["ttft_s"] == hi["ttft_s"]:
        return f"Time to first token{shared}: {_duration(float(hi['ttft_s']))}."
    return (f"Time to first token{shared}: from {_duration(float(lo['ttft_s']))} at {_where(lo, keys)} to "
            f"{_duration(float(hi['ttft_s']))} at {_where(hi, keys)}.")


def _by_value(frame: pd.DataFrame, measure: Measure) -> list[str]:
    """With one algorithm: for each swept name or flag (a layout, a model), where each value is fastest against the
    others at the same point otherwise, and how much slower the slowest gets."""
    view, keys = point_view(frame)
    view = view[feasible(view)]
    lines = []
    for key in [k for k in keys if is_categorical(view[k]) and view[k].nunique() > 1]:
        others = [k for k in keys if k != key]
        wins: Counter[str] = Counter()
        worst: tuple[float, str, str] = (1.0, "", "")
        compared = 0
        for _, part in (view.groupby(others, sort=False) if others else [((), view)]):
            if part[key].nunique() < 2:
                continue
            compared += 1
            best = float(part[measure.column].min())
            wins.update(part.loc[part[measure.column] <= best * (1 + 1e-9), key].astype(str))
            slow = extreme_row(part, measure.column, largest=True)
            if float(slow[measure.column]) / best > worst[0]:
                worst = (float(slow[measure.column]) / best, str(slow[key]), _where(slow, others))
        if not compared:
            continue
        name = key.split(".")[-1]
        counts = ", ".join(f"`{v}` at {c}" for v, c in wins.most_common())
        same = " and ".join(k.split(".")[-1] for k in others) or "point"
        line = f"By {name}, at the same {same}: fastest {counts} of {compared} (a tie counts for each)"
        if worst[1]:
            line += f"; the slowest, `{worst[1]}`, takes up to {times(worst[0])} the {measure.noun} of the fastest " \
                    f"(at {worst[2] or 'the only point'})"
        lines.append(line + ".")
    return lines


def headline(table: pd.DataFrame, frame: pd.DataFrame, target_s: float | None = None,
             measure: Measure | None = None) -> list[str]:
    """The conclusions in a few sentences, from :func:`summary`'s table and the results."""
    measure = measure or measure_of(frame)
    keys = point_columns(frame)
    n = len(table)
    lines = []
    if measure is TPOT:
        lines.append(_ttft_line(frame, keys))
    won = table[~table["fastest"].str.startswith("none")]
    algos = list(dict.fromkeys(frame["algorithm"].astype(str)))
    what = " per output token" if measure is TPOT else ""
    if len(algos) == 1:
        lines.append(f"One algorithm, `{algos[0]}`: it fits in memory at {len(won)} of {n} sweep points.")
    else:
        wins = ", ".join(f"`{a}` at {c} of {n}" for a, c in won["fastest"].value_counts().items())
        lines.append(f"Fastest algorithm{what} that fits in memory: {wins or 'none'} sweep points.")
    column = next(c for c in table.columns if "speedup over " in str(c) and not str(c).startswith("request"))
    baseline = str(column).split("speedup over ", 1)[1]
    if len(algos) > 1:
        line = _range_line(won, column, keys, f"Speedup of the fastest over `{baseline}` (`{baseline}`'s "
                                              f"{measure.noun} / the fastest's)")
        if line:
            lines.append(line)
        if measure is TPOT:
            steps = int(frame["new_tokens"].iloc[0]) if "new_tokens" in frame and frame["new_tokens"].nunique() == 1 \
                else None
            request = _range_line(won, f"request speedup over {baseline}", keys,
                                  f"The whole request (the prefill and {steps or 'every'} decode step"
                                  f"{'s' if steps != 1 else ''}), whose shared prefill counts in both: `{baseline}`'s "
                                  "latency / the fastest's")
            if request:
                lines.append(request)
    else:
        lines += _by_value(frame, measure)
    if "bound by" in table:
        bound = won["bound by"].str.split(" ").str[0].value_counts()
        who = f"`{algos[0]}`" if len(algos) == 1 else "The fastest"
        lines.append(f"{who} is bound by " + ", ".join(f"{b} at {c}" for b, c in bound.items()) + " points "
                     "(the critical rank's time waiting on transfers vs. in kernels).")
    if "chosen" in frame and frame["chosen"].notna().any():  # prefill's auto: which it ran, and by how much
        lines.append(_auto_line(frame))
    if "binding" in frame:  # training steps: what costs the step most besides compute
        bind = frame["binding"].dropna().astype(str).value_counts()
        lines.append("Besides compute, the step is bound by " + ", ".join(f"`{b}` at {c}" for b, c in bind.items())
                     + " points (the parallel dimension whose communication costs the step most, its `*_exposed_s`,"
                     " or the pipeline `bubble`).")
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
    lines += _cost_line(frame, keys, target_s)
    return lines


def _cost_line(frame: pd.DataFrame, keys: Sequence[str], target_s: float | None) -> list[str]:
    """With a scenario's ``cost:`` (simulator.run.whatif): the cheapest row per million tokens that fits (and meets
    the latency target, when there is one)."""
    if "usd_per_m_tokens" not in frame or not frame["usd_per_m_tokens"].notna().any():
        return []
    view = point_view(frame)[0]
    ok = view[view["usd_per_m_tokens"].notna() & ~view["oom"].astype(bool)]
    if target_s is not None and "latency_s" in ok:
        ok = ok[ok["latency_s"] <= target_s]
    if not len(ok):
        return ["No row that fits" + (" and meets the target" if target_s is not None else "") + " has a cost."]
    best = ok.iloc[int(ok["usd_per_m_tokens"].to_numpy().argmin())]
    return [f"Cheapest per million tokens{' meeting the target' if target_s is not None else ''}: `{best['algorithm']}`"
            f" at {_where(best, keys)}: ${best['usd_per_m_tokens']:.4g} per million tokens "
            f"(${best['usd_per_hour']:.4g} an hour)."]


def overview(table: pd.DataFrame, facets: Sequence[str], top: int = 10, compare: bool = True
             ) -> dict[str, pd.DataFrame]:
    """A large sweep's summaries from :func:`summary`'s table: per value of the ``facets`` (the figures' panels),
    how many points each algorithm wins and the range of the speedup; and the ``top`` points with the largest and
    the smallest speedup (``largest``, ``smallest``). Without algorithms to ``compare`` (one algorithm), the range
    of its value (``latency_ms``, ``tpot_ms``) instead, and the ``top`` slowest and fastest points."""
    column = next((c for c in table.columns if "speedup over " in str(c) and not str(c).startswith("request")), None)
    fmt: Callable[[float], str]
    if not compare or column is None:
        column = next(c for c in table.columns if str(c).endswith("_ms"))
        values = pd.to_numeric(table[column], errors="coerce")
        compare, fmt = False, plain_number
    else:
        values, fmt = ratio_values(table[column]), times
    label = f"{column}: min"
    out: dict[str, pd.DataFrame] = {}
    rows = []
    for keys, part in (table.groupby(list(facets), sort=False) if facets else [((), table)]):
        vals = keys if isinstance(keys, tuple) else (keys,)
        row: dict[str, object] = dict(zip(facets, vals, strict=True))
        row["points"] = len(part)
        if compare:
            row["fastest"] = ", ".join(f"{a} at {c}" for a, c in part["fastest"].value_counts().items())
        v = values.loc[part.index]
        if v.notna().any():
            row[label] = fmt(float(v.min()))
            row["median"] = fmt(float(np.nanmedian(v.to_numpy(dtype=float))))
            row["max"] = fmt(float(v.max()))
        rows.append(row)
    out["per facet"] = pd.DataFrame(rows)
    if values.notna().any():
        ranked = table.assign(_v=values).dropna(subset=["_v"]).sort_values("_v", ascending=False, kind="stable")
        if not compare:
            ranked = ranked.drop(columns=[c for c in ranked.columns if c in ("fastest", "next best")
                                          or "speedup over " in str(c)])
        out["largest"] = ranked.head(top).drop(columns="_v")
        out["smallest"] = ranked.tail(top).iloc[::-1].drop(columns="_v")
    return out


def _auto_line(frame: pd.DataFrame) -> str:
    """What ``auto`` ran at how many rows, and its margin over the schedule it did not choose (that one's latency
    over the chosen one's: the range over those rows)."""
    rows = frame[frame["chosen"].notna()]
    parts = []
    for name, mine in rows.groupby(rows["chosen"].astype(str), sort=True):
        text = f"`{name}` at {len(mine)} row{'s' if len(mine) != 1 else ''}"
        if "other_latency_s" in mine and mine["other_latency_s"].notna().any():
            ratio = (mine["other_latency_s"] / mine["latency_s"]).dropna()
            low, high = f"{float(ratio.min()):.3g}", f"{float(ratio.max()):.3g}"
            other = "ring-q" if name == "ring" else "ring"
            text += f" (`{other}` took {low if low == high else f'{low}-{high}'}x as long)"
        parts.append(text)
    return "`auto` ran the faster by simulation of pass-KV (`ring`) and pass-Q (`ring-q`): " + "; ".join(parts) + "."
