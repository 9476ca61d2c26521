"""Parse the result tables of NVIDIA's nccl-tests (``all_reduce_perf``, ``all_gather_perf``, ...) into typed rows.

A run prints a banner (``# nThread 1 nGpus 1 minBytes ...``), one ``#  Rank  N Group ...`` line per rank, a
two-line header naming the columns (``size count type redop root time algbw busbw #wrong`` for the out-of-place and
again ``time algbw busbw #wrong`` for the in-place run; older versions lack ``redop``/``root`` or say ``error``),
then one row per size, and ``# Avg bus bandwidth``. Times are in microseconds, bandwidths in GB/s (1e9 bytes/s);
this module returns SI units: seconds and bytes/s. A log is untrusted: size, count and root must be finite integers
(size and count at most :data:`simulator.support.limits.MAX_COUNT`), rank numbers at most :data:`MAX_RANK`; times
and bandwidths may print ``nan`` or ``inf`` (the size is then not usable), never a negative number. The collective's
name comes from ``# Collective test starting:
all_gather_perf`` (newer versions) or from the ``*_perf`` command line in the log; lines tagged by ``mpirun
--tag-output`` (``[1,0]<stdout>:``) are untagged first. A log may hold several runs.

>>> run = parse_nccl_tests(open("tests/fixtures/nccltests/all_gather_gb10_2x1.log").read(), "gb10.log")[0]
>>> run.collective, run.ranks, run.rows[0].nbytes, run.rows[0].out_of_place.busbw_Bps
('allgather', 2, 17179869184, 22940000000.0)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from simulator.errors import InputError, excerpt
from simulator.support.limits import MAX_COUNT

__all__ = ["COLLECTIVES", "MAX_LOG_BYTES", "MAX_RANK", "Measurement", "NcclTestsRow", "NcclTestsRun",
           "parse_nccl_tests", "read_nccl_tests"]

MAX_LOG_BYTES = 16 * 2**20
MAX_RANK = 2**24  # a rank number in a '#  Rank N' line (the largest jobs run about 10^5 GPUs)

# nccl-tests binary stem -> collective name as treering spells it (docs/reference.md)
COLLECTIVES: dict[str, str] = {
    "all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reduce-scatter",
    "alltoall": "alltoall", "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "sendrecv",
    "gather": "gather", "scatter": "scatter", "hypercube": "hypercube",
}
_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_BINARY = re.compile(r"\b(" + "|".join(sorted(COLLECTIVES, key=len, reverse=True)) + r")_perf(?:_mpi)?\b")
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\b")
_FIRST_COLS = ("size", "count", "type")


@dataclass(frozen=True)
class Measurement:
    """One of a row's two runs (out-of-place or in-place); ``wrong`` is the #wrong (or error) column as printed."""

    time_s: float
    algbw_Bps: float
    busbw_Bps: float
    wrong: str


@dataclass(frozen=True)
class NcclTestsRow:
    nbytes: int  # nccl-tests' size: the per-rank buffer
    count: int  # elements
    dtype: str
    redop: str | None
    root: int | None
    out_of_place: Measurement
    in_place: Measurement | None  # None where the test prints N/A (alltoall has no in-place run)
    line: int


@dataclass(frozen=True)
class NcclTestsRun:
    collective: str
    ranks: int
    rows: tuple[NcclTestsRow, ...]
    avg_busbw_Bps: float | None
    source: str
    line: int  # where its table header is


def read_nccl_tests(path: str) -> list[NcclTestsRun]:
    """:func:`parse_nccl_tests` of a file of at most :data:`MAX_LOG_BYTES` (a regular file: not a folder, a device or
    a FIFO); bytes that are not UTF-8 are read as U+FFFD."""
    p = Path(path)
    try:
        if not p.is_file():
            raise InputError("no such file" if not p.exists() else "not a regular file", file=path)
        with p.open("rb") as fh:
            data = fh.read(MAX_LOG_BYTES + 1)
    except OSError as err:
        raise InputError(f"cannot read file: {err.strerror or err}", file=path) from None
    if len(data) > MAX_LOG_BYTES:
        raise InputError(f"file over {MAX_LOG_BYTES:,} bytes (an nccl-tests log of 30 sizes is about 5 KB)",
                         file=path)
    return parse_nccl_tests(data.decode("utf-8", errors="replace"), path)


def parse_nccl_tests(text: str, src: str) -> list[NcclTestsRun]:
    """All runs in a nccl-tests log; :class:`InputError` located at the first malformed line."""
    lines = [_TAG.sub("", line) for line in text.splitlines()]
    runs: list[NcclTestsRun] = []
    collective: str | None = None
    ranks: set[int] = set()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("# Collective test starting:") or (not line.startswith("#") and _BINARY.search(line)):
            m = _BINARY.search(line)
            if m:
                collective, ranks = COLLECTIVES[m.group(1)], set()
        elif m := _RANK.match(line):
            if len(m.group(1)) > 9 or int(m.group(1)) > MAX_RANK:
                raise InputError(f"rank {excerpt(m.group(1))}: at most {MAX_RANK:,}", file=src, line=i + 1,
                                 field="rank")
            ranks.add(int(m.group(1)))
        elif _is_header(line):
            columns = line.lstrip("#").split()
            if collective is None:
                raise InputError("cannot tell which collective this table is: no '# Collective test starting' "
                                 "line and no *_perf command line before it", file=src, line=i + 1, field="collective")
            if not ranks:
                raise InputError("no '#  Rank N ...' lines before the table: the rank count is unknown",
                                 file=src, line=i + 1, field="ranks")
            run, i = _table(lines, i, columns, collective, len(ranks), src)
            runs.append(run)
            continue
        i += 1
    if not runs:
        raise InputError("no nccl-tests result table (a '#  size  count  type ...' header) found", file=src, line=1)
    return runs


def _is_header(line: str) -> bool:
    return line.startswith("#") and tuple(line.lstrip("#").split()[:3]) == _FIRST_COLS


def _table(lines: list[str], head: int, columns: list[str], collective: str, ranks: int,
           src: str) -> tuple[NcclTestsRun, int]:
    if columns.count("time") != 2 or columns.count("busbw") != 2 or columns.count("algbw") != 2:
        raise InputError("expected the columns time, algbw, busbw twice (out-of-place, in-place)",
                         file=src, line=head + 1, field="header")
    rows: list[NcclTestsRow] = []
    avg: float | None = None
    i = head + 1
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("# Avg bus bandwidth"):
            avg = _number(line.split(":", 1)[1], src, i, "avg_busbw") * 1e9
            i += 1
            break
        if line.startswith("#"):
            if rows and (_is_header(line) or line.startswith("# Collective test")):
                break
            i += 1
            continue
        if not line:
            if rows:
                break
            i += 1
            continue
        rows.append(_row(line.split(), columns, src, i))
        i += 1
    if not rows:
        raise InputError("the table has no rows", file=src, line=head + 1, field="rows")
    return NcclTestsRun(collective, ranks, tuple(rows), avg, src, head + 1), i


def _row(cells: list[str], columns: list[str], src: str, i: int) -> NcclTestsRow:
    if len(cells) != len(columns):
        raise InputError(f"expected {len(columns)} columns ({' '.join(columns)}), got {len(cells)}",
                         file=src, line=i + 1, field="row")
    first: dict[str, str] = {}
    second: dict[str, str] = {}  # the in-place run's columns
    for name, cell in zip(columns, cells, strict=True):
        (second if name in first and name in ("time", "algbw", "busbw", "#wrong", "error") else first)[name] = cell
    wrong_key = "#wrong" if "#wrong" in first else "error"
    oop = _measurement(first, wrong_key, src, i)
    ip = None if second.get("time") == "N/A" else _measurement(second, wrong_key, src, i)
    root = first.get("root")
    return NcclTestsRow(nbytes=_integer(first["size"], src, i, "size"), count=_integer(first["count"], src, i, "count"),
                        dtype=first["type"], redop=first.get("redop"),
                        root=None if root is None else _integer(root, src, i, "root"), out_of_place=oop, in_place=ip,
                        line=i + 1)


def _measurement(cols: dict[str, str], wrong_key: str, src: str, i: int) -> Measurement:
    return Measurement(time_s=_number(cols["time"], src, i, "time") * 1e-6,
                       algbw_Bps=_number(cols["algbw"], src, i, "algbw") * 1e9,
                       busbw_Bps=_number(cols["busbw"], src, i, "busbw") * 1e9,
                       wrong=cols.get(wrong_key, ""))


def _integer(cell: str, src: str, i: int, name: str) -> int:
    """A size, count or root: a finite integer (root -1: none), at most :data:`MAX_COUNT`."""
    x = _number(cell, src, i, name)
    if not math.isfinite(x) or x != int(x) or abs(x) > MAX_COUNT:
        raise InputError(f"expected an integer (at most 2^53), got {excerpt(cell.strip())}", file=src,
                         line=i + 1, field=name)
    return int(x)


def _number(cell: str, src: str, i: int, name: str) -> float:
    try:
        x = float(cell)
    except ValueError:
        raise InputError(f"{excerpt(cell.strip())} is not a number", file=src, line=i + 1, field=name) from None
    if x < 0 and name != "root":
        raise InputError(f"must not be negative, got {cell.strip()}", file=src, line=i + 1, field=name)
    return x
