"""What result rows are and how their quantities read: the workload kind of a results table, axis labels by kind,
and the printed form of a table (one unit per quantity: times in ms, sizes in GB; plain numbers; a column that only
repeats another left out; swept keys by their last name).

Units and meanings come from the kinds' column schemas (:data:`simulator.run.kinds.KINDS`, each column declared
once with its unit): a column in seconds prints in ms, one in bytes in GB (a message size, ``bytes``, stays a count
of bytes), and a label such as "time to first token" is its column's meaning.
"""

from __future__ import annotations

import numbers
from functools import cache

import numpy as np
import pandas as pd

from simulator.report.conclude import repeated_columns
from simulator.report.document import plain_number, short_names
from simulator.run.kinds import KINDS
from simulator.run.rows import WHATIF_COLUMNS, Column

__all__ = ["BOOKKEEPING", "column_label", "latency_caption", "latency_label", "printable", "printed_table",
           "rows_kind", "schema"]

BOOKKEEPING = ("scenario", "events", "sim_wall_s", "point")  # in results.csv, not in a printed table

_PHASE_NOUNS = {"prefill": "prefill", "train": "training step", "generate": "request",
                "train-step": "training step"}  # what latency_s times
_PHASE_WHAT = {"prefill": "a prefill (forward only)", "train": "a training step's attention (forward + backward)",
               "generate": "a whole request (the prefill and every decode step)",
               "train-step": "a whole training step (every micro-batch, DP gradients, optimizer)"}
_DISPLAY = {"s": ("ms", 1e3), "bytes": ("GB", 1e-9)}  # a unit -> the unit it prints in, and the factor


@cache
def schema() -> dict[str, Column]:
    """Every result column of every workload kind, by name (the first kind's declaration of a shared name)."""
    out: dict[str, Column] = {}
    for kind in KINDS.values():
        for column in kind.columns:
            out.setdefault(column.name, column)
    for column in WHATIF_COLUMNS:  # a scenario's faults, variability (simulator.run.whatif)
        out.setdefault(column.name, column)
    return out


def rows_kind(frame: pd.DataFrame) -> str:
    """``collective``, ``flows``, ``generate``, ``prefill`` (forward or training rows) or ``decode``."""
    if "busbw_GBps" in frame:
        return "collective"
    if "finish_s" in frame:
        return "flows"
    if "phase" in frame:
        return "generate" if set(frame["phase"].dropna().astype(str)) == {"generate"} else "prefill"
    return "decode"


def _whole_model(frame: pd.DataFrame) -> bool:
    scoped = "scope" not in frame or bool((frame["scope"].astype(str) == "model").all())
    return "model" in frame and bool(frame["model"].notna().all()) and scoped


def latency_label(frame: pd.DataFrame) -> str:
    """What ``latency_s`` of these rows times, for an axis: ``decode step latency``, ``prefill latency``,
    ``prefill / training step latency``, ``request latency`` (``, whole model`` for ``scope: model``)."""
    phases = list(dict.fromkeys(frame["phase"].dropna().astype(str))) if "phase" in frame else []
    what = " / ".join(_PHASE_NOUNS.get(p, p) for p in phases) if phases else "decode step"
    return f"{what} latency" + (", whole model" if _whole_model(frame) else "")


def latency_caption(frame: pd.DataFrame) -> str:
    """The same in a sentence: ``Latency of a prefill (forward only), one attention layer.``"""
    phases = list(dict.fromkeys(frame["phase"].dropna().astype(str))) if "phase" in frame else []
    what = " or ".join(_PHASE_WHAT.get(p, p) for p in phases) if phases else "one decode step"
    return f"Latency of {what}, {'the whole model' if _whole_model(frame) else 'one attention layer'}."


def column_label(name: str) -> str:
    """A column's meaning up to its first colon, with its unit as printed (``time to first token (ms)``)."""
    column = schema()[name]
    unit = _DISPLAY.get(column.unit, (column.unit, 1.0))[0]
    head = column.meaning.split(":")[0].split(";")[0].strip()
    return f"{head} ({unit})" if unit else head


def _printed_name(name: str, unit: str) -> str:
    if unit == "ms":
        return name.removesuffix("_s") + "_ms"
    stem = name.replace("_bytes", "").replace("bytes_", "")
    return f"{stem}_{unit}"


def printable(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each column in seconds in ms (``latency_ms``, ``ttft_ms``) and each in bytes in GB
    (``moved_GB``, ``peak_mem_GB``), in place; the message size ``bytes`` stays in bytes."""
    cols = schema()
    out = frame.copy()
    renames = {}
    for name in frame.columns:
        column = cols.get(name)
        if column is None or column.unit not in _DISPLAY or name == "bytes":
            continue
        unit, factor = _DISPLAY[column.unit]
        if _printed_name(name, unit) in frame.columns:  # the row has it already (a train row's peak_mem_GB)
            out = out.drop(columns=[name])
            continue
        out[name] = pd.to_numeric(frame[name], errors="coerce") * factor
        renames[name] = _printed_name(name, unit)
    return out.rename(columns=renames)


def _cell(value: object) -> str:
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, numbers.Integral):
        return str(value)
    if isinstance(value, numbers.Real):
        return plain_number(float(value))
    return "-" if value is None or value != value else str(value)


def printed_table(frame: pd.DataFrame) -> str:
    """Result rows as a terminal table: without the bookkeeping columns (:data:`BOOKKEEPING`) and the columns that
    only repeat another (``sequence`` beside ``context``, ``workload.backward`` beside ``phase``), times in ms and
    sizes in GB (:func:`printable`), numbers as :func:`plain_number` writes them, a missing value as ``-``."""
    shown = frame.drop(columns=[c for c in BOOKKEEPING if c in frame])
    shown = printable(shown.drop(columns=repeated_columns(shown)))
    shown = shown.rename(columns=short_names(shown.columns))
    text = pd.DataFrame({c: [_cell(v) for v in shown[c].tolist()] for c in shown.columns}, index=shown.index)
    return text.to_string(index=False)
