"""Result rows: the documented column list of every workload kind, and the one function that builds a row.

docs/architecture.md, "Contracts": decode rows carry the stable columns (:data:`DECODE_COLUMNS`), flows rows
one row per flow (:data:`FLOW_COLUMNS`); a workload kind registers its column list in :data:`COLUMNS`. A row is
its kind's columns, in order, then any extra columns (``max_abs_err``, ``model``, ``tp``...), then one column per
swept key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["COLLECTIVE_COLUMNS", "COLUMNS", "DECODE_COLUMNS", "FLOW_COLUMNS", "GENERATE_COLUMNS", "PREFILL_COLUMNS",
           "make_row"]

DECODE_COLUMNS = ("scenario", "algorithm", "topology", "ranks", "nodes", "context", "batch", "heads", "head_dim",
                  "dtype", "latency_s", "compute_s", "comm_s", "bytes_moved", "peak_mem_bytes", "oom", "events",
                  "sim_wall_s")
FLOW_COLUMNS = ("flow", "src", "dst", "bytes", "start_s", "finish_s")
COLLECTIVE_COLUMNS = ("scenario", "algorithm", "topology", "ranks", "nodes", "dtype", "bytes_moved", "events",
                      "sim_wall_s", "collective", "bytes", "time_s", "algbw_GBps", "busbw_GBps", "protocol",
                      "channels", "chosen")

PREFILL_COLUMNS = (*DECODE_COLUMNS, "phase", "sequence", "layout", "tflops_per_gpu", "comm_hidden_frac", "imbalance")
GENERATE_COLUMNS = (*PREFILL_COLUMNS, "ttft_s", "tpot_s")

COLUMNS: dict[str, tuple[str, ...]] = {"decode": DECODE_COLUMNS, "flows": FLOW_COLUMNS,
                                       "collective": COLLECTIVE_COLUMNS, "prefill": PREFILL_COLUMNS,
                                       "generate": GENERATE_COLUMNS}


def make_row(kind: str, values: Mapping[str, Any], extra: Mapping[str, Any] | None = None,
             swept: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The row of a ``kind`` workload: every documented column from ``values`` (all required, no others), then
    ``extra``, then the swept keys."""
    columns = COLUMNS[kind]
    missing = [c for c in columns if c not in values]
    unknown = [c for c in values if c not in columns]
    if missing or unknown:
        raise ValueError(f"{kind} row: missing columns {missing}, undocumented columns {unknown}")
    row = {c: values[c] for c in columns}
    row.update(extra or {})
    row.update(swept or {})
    return row
