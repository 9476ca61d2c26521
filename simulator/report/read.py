"""Reading result files back (``treering report``, ``treering run --resume``): untrusted input, checked once here.

``results.csv``, ``timeline.csv`` and ``meta.json`` may have been edited, truncated, converted or replaced by
something else. Each must be a regular UTF-8 file of at most :data:`MAX_RESULT_BYTES`; a CSV must parse, carry the
columns its reader needs, and hold finite, non-negative numbers in its numeric columns (a missing value only in a
row that records an ``error``); ``point`` indices must be whole numbers from 0; ``meta.json`` must match
:class:`Meta`. Anything else is one located :class:`InputError` line (``file:line: column: message``, the line of
the CSV row).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simulator.errors import InputError, excerpt
from simulator.report.pages import META_FILE, TIMELINE_FILE
from simulator.support.yaml_lines import read_text_file

__all__ = ["MAX_RESULT_BYTES", "NUMERIC_COLUMNS", "REPORT_COLUMNS", "TIMELINE_COLUMNS", "Meta", "read_csv_checked",
           "read_meta", "read_report_inputs", "resumable_rows"]

MAX_RESULT_BYTES = 512 * 2**20
NUMERIC_COLUMNS = ("latency_s", "compute_s", "comm_s", "bytes_moved", "peak_mem_bytes", "events", "sim_wall_s",
                   "ranks", "nodes", "context", "batch", "heads", "head_dim", "bytes", "start_s", "finish_s",
                   "end_s", "rank")
REPORT_COLUMNS = ("algorithm", "context", "ranks", "latency_s", "peak_mem_bytes", "bytes_moved")
TIMELINE_COLUMNS = ("algorithm", "rank", "kind", "start_s", "end_s")


class Meta(BaseModel):
    """``meta.json`` beside a results.csv: what the report states (other keys are kept as they are)."""

    model_config = ConfigDict(extra="allow")

    scenario: str = Field("?", max_length=1000)
    source: str = Field("?", max_length=10_000)
    topology: str = Field("?", max_length=10_000)
    version: str = Field("?", max_length=100)
    command: str = Field("?", max_length=100_000)
    capacity_bytes: float | None = Field(None, gt=0, allow_inf_nan=False)


def _cell(value: Any) -> str:
    """A short excerpt of one CSV cell (numpy scalars as plain numbers)."""
    return excerpt(value.item() if hasattr(value, "item") else value)


def read_csv_checked(path: Path, required: Iterable[str] = ()) -> pd.DataFrame:
    """A results-like CSV: parsed, with ``required`` columns and sane numeric columns."""
    text = read_text_file(path, MAX_RESULT_BYTES)
    try:
        frame = pd.read_csv(io.StringIO(text))
    except pd.errors.EmptyDataError:
        raise InputError("empty file: no header row", file=str(path), line=1) from None
    except (pd.errors.ParserError, ValueError, OverflowError) as err:
        msg = " ".join(str(err).split())
        raise InputError(f"not a results CSV: {msg[:100]}", file=str(path)) from None
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InputError(f"missing column(s) {', '.join(missing)}; is this a file written by treering run?",
                         file=str(path), line=1)
    failed = frame["error"].notna() if "error" in frame else pd.Series(False, index=frame.index)
    for col in [c for c in NUMERIC_COLUMNS if c in frame.columns]:
        values = pd.to_numeric(frame[col], errors="coerce")
        not_number = frame[col].notna() & values.isna()
        absent = values.isna() & ~failed
        out_of_range = values.notna() & ~((values >= 0) & (values < math.inf))
        bad = not_number | absent | out_of_range
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise InputError(f"must be a finite number >= 0, got {_cell(frame[col].iloc[row])}", file=str(path),
                             line=row + 2, field=col)
        frame[col] = values
    return frame


def _points(frame: pd.DataFrame, path: Path, total: int | None) -> pd.Series:
    values = pd.to_numeric(frame["point"], errors="coerce")
    high = math.inf if total is None else total
    bad = values.isna() | (values != values.round()) | (values < 0) | (values >= high)
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        what = "a point index of this sweep" if total is not None else "a point index"
        limit = f" (0 to {total - 1})" if total is not None else ""
        raise InputError(f"must be {what}{limit}, got {_cell(frame['point'].iloc[row])}", file=str(path),
                         line=row + 2, field="point")
    return values.astype("int64")


def resumable_rows(path: Path, total: int, say: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The finished rows of a sweep of ``total`` points in ``path`` (rows with an ``error`` run again). A row that
    repeats one of its point (same point, algorithm and flow: a file appended to, or two files joined) is dropped,
    said once through ``say``: every point's rows are kept once."""
    if path.is_dir():
        raise InputError("is a folder, not a results file", file=str(path))
    if not path.exists():
        return []
    try:
        frame = read_csv_checked(path, ("point",))
    except InputError as err:
        raise InputError(f"cannot resume from it: {err.message}", file=err.file, line=err.line,
                         field=err.field) from None
    frame["point"] = _points(frame, path, total)
    if "error" in frame:
        frame = frame[frame["error"].isna()].drop(columns="error")
    twice = frame.duplicated(subset=["point", *[c for c in ("algorithm", "flow") if c in frame]], keep="first")
    if twice.any():
        points = sorted({int(p) for p in frame.loc[twice, "point"]})
        shown = ", ".join(map(str, points[:10])) + (f" and {len(points) - 10} more" if len(points) > 10 else "")
        if say is not None:
            say(f"{path}: dropped {int(twice.sum())} duplicated row(s) of point(s) {shown}: each point's rows are "
                "kept once")
        frame = frame[~twice]
    return [{str(k): v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
            for row in frame.to_dict("records")]


def read_meta(path: Path) -> dict[str, Any]:
    """``meta.json`` checked against :class:`Meta`."""
    text = read_text_file(path, 1_000_000)
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"not JSON: {str(exc)[:100]}", file=str(path)) from None
    if not isinstance(raw, dict):
        raise InputError("must be a JSON object", file=str(path), line=1)
    try:
        return Meta.model_validate(raw).model_dump()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise InputError(f"{first['msg']}, got {excerpt(first.get('input'))}", file=str(path), field=field) from None


def read_report_inputs(path: Path) -> tuple[pd.DataFrame, dict[str, Any], pd.DataFrame | None]:
    """results.csv (``path``), with its meta.json and timeline.csv when they are beside it."""
    frame = read_csv_checked(path)
    if frame.empty:
        raise InputError("has no result rows (a header only): nothing to report; run the scenario again",
                         file=str(path), line=2)
    if "latency_s" in frame:
        frame = read_csv_checked(path, REPORT_COLUMNS)
    if "point" in frame:
        frame["point"] = _points(frame, path, None)
    meta_path, timeline_path = path.parent / META_FILE, path.parent / TIMELINE_FILE
    meta = (read_meta(meta_path) if meta_path.exists()
            else {"scenario": path.parent.name, "command": "(unknown: no meta.json beside it)"})
    timeline = read_csv_checked(timeline_path, TIMELINE_COLUMNS) if timeline_path.exists() else None
    return frame, meta, timeline
