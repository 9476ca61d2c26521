"""``treering validate --nccl-tests LOG --topology T``: the simulator's bus bandwidth beside nccl-tests' measured one.

Every size of every run in the logs (:mod:`simulator.nccl.logs`) becomes a ``collective`` point on the topology,
simulated with ``auto`` (NCCL's choice of algorithm, protocol and channels by predicted time, as NCCL makes it);
the row holds the measured out-of-place bus bandwidth, the predicted one and the error. The topology must have as
many GPUs as the run has ranks (``--set topology_params.nodes=N`` sizes a parametric preset). Nothing is fitted
here: this is how a planner checks a topology against logs of a cluster it owns.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.errors import InputError
from simulator.nccl.logs import NcclTestsRow, NcclTestsRun, read_nccl_tests
from simulator.report.markdown import markdown_table
from simulator.run.prepare import prepare_point, simulate_point
from simulator.run.scenario import scenario_points

__all__ = ["MAX_SIZES", "NCCL_DTYPES", "OPERATIONS", "nccl_dtype", "summary_lines", "usable", "validate_nccl_tests"]

# nccl-tests' type names -> the dtype of the same element size (what a collective's bytes depend on)
NCCL_DTYPES: dict[str, str] = {
    "double": "fp64", "float64": "fp64", "int64": "fp64", "uint64": "fp64",
    "float": "fp32", "float32": "fp32", "int32": "fp32", "uint32": "fp32", "int": "fp32",
    "half": "fp16", "float16": "fp16", "bfloat16": "bf16",
    "int8": "fp8", "uint8": "fp8", "char": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "f8e4m3": "fp8",
    "f8e5m2": "fp8",
}
MAX_SIZES = 2_000  # sizes compared at most, each one simulation (a log of -b 8 -e 8G -f 2 has 31)
OPERATIONS = ("allreduce", "allgather", "reduce-scatter", "alltoall", "broadcast", "reduce")


def nccl_dtype(run: NcclTestsRun) -> str:
    names = {row.dtype for row in run.rows}
    if len(names) != 1 or next(iter(names)) not in NCCL_DTYPES:
        raise InputError(f"data type {', '.join(sorted(names))} is not one treering models; known: "
                         f"{', '.join(NCCL_DTYPES)}", file=run.source, line=run.line, field="type")
    return NCCL_DTYPES[next(iter(names))]


def usable(row: NcclTestsRow) -> bool:
    """Whether a size can be compared: bytes moved and a measured, finite, positive bus bandwidth."""
    return row.nbytes > 0 and math.isfinite(row.out_of_place.busbw_Bps) and row.out_of_place.busbw_Bps > 0


def _predict(run: NcclTestsRun, nbytes: int, dtype: str, topology: str, sets: Sequence[str], base: Path,
             force: bool = False) -> dict[str, Any]:
    tree = {"name": "nccl-tests", "topology": topology,
            "workload": {"kind": "collective", "collective": run.collective, "bytes": float(nbytes), "dtype": dtype},
            "algorithms": ["auto"]}
    point = scenario_points(tree, "--topology", base, sets, force)[0]
    prep = prepare_point(point)
    ranks = len(prep.cluster.ranks)
    if ranks != run.ranks:
        raise InputError(f"the topology has {ranks} GPUs; the nccl-tests run has {run.ranks} ranks (size a "
                         f"parametric preset with --set topology_params.nodes=N)", file=run.source, line=run.line,
                         field="--topology")
    return simulate_point(prep).rows[0]


def validate_nccl_tests(logs: Sequence[str], topology: str, sets: Sequence[str] = (),
                        base: Path | None = None, force: bool = False) -> pd.DataFrame:
    """One row per (run, size) of the logs: measured and predicted bus bandwidth (GB/s) and the error (%)."""
    rows = []
    read: list[tuple[str, list[NcclTestsRun]]] = []
    for log in logs:
        runs = read_nccl_tests(log)
        if not any(usable(row) for run in runs for row in run.rows):
            raise InputError("no size of the log has a measured bus bandwidth (every out-of-place busbw is 0, nan or "
                             "inf, or every size is 0): nothing to compare", file=log, line=runs[0].line,
                             field="busbw")
        read.append((log, runs))
    sizes = sum(1 for _, runs in read for run in runs for row in run.rows if usable(row))
    if sizes > MAX_SIZES:
        raise InputError(f"{sizes:,} sizes to simulate, one collective each (at most {MAX_SIZES:,}): compare fewer "
                         "logs or sizes at a time", file=logs[0], field="--nccl-tests")
    for log, runs in read:
        for run in runs:
            if run.collective not in OPERATIONS:
                raise InputError(f"collective {run.collective!r} is not modelled; treering models "
                                 f"{', '.join(OPERATIONS)}", file=run.source, line=run.line)
            dtype = nccl_dtype(run)
            for row in run.rows:
                if row.nbytes <= 0 or not math.isfinite(row.out_of_place.busbw_Bps):
                    continue
                pred = _predict(run, row.nbytes, dtype, topology, sets, base or Path.cwd(), force)
                measured = row.out_of_place.busbw_Bps / 1e9
                predicted = float(pred["busbw_GBps"])
                rows.append({"log": Path(log).name, "collective": run.collective, "ranks": run.ranks,
                             "bytes": row.nbytes, "dtype": dtype, "measured_time_s": row.out_of_place.time_s,
                             "predicted_time_s": float(pred["time_s"]), "measured_busbw_GBps": measured,
                             "predicted_busbw_GBps": predicted,
                             "error_pct": 100.0 * (predicted - measured) / measured if measured > 0 else math.nan,
                             "chosen": pred["chosen"], "channels": pred["channels"]})
    return pd.DataFrame(rows)


def summary_lines(frame: pd.DataFrame) -> list[str]:
    """Median and worst errors, overall and for the sizes of 1 MiB and more (bandwidth-bound)."""
    err = frame["error_pct"].abs().dropna()
    big = frame[frame["bytes"] >= 2**20]["error_pct"].abs().dropna()
    lines = [f"- sizes: {len(frame)} ({frame['bytes'].min():,} to {frame['bytes'].max():,} bytes per rank)"]
    if len(err):
        lines.append(f"- median |error| of the bus bandwidth: {statistics.median(err):.1f} %, max {err.max():.1f} %")
    if len(big):
        lines.append(f"- sizes of 1 MiB and more: median |error| {statistics.median(big):.1f} %, max {big.max():.1f} %")
    return lines


def summarize(frame: pd.DataFrame, command: str) -> str:
    """The Markdown summary written next to the table."""
    shown = frame.drop(columns=["measured_time_s", "predicted_time_s"])
    return "\n".join(["# nccl-tests validation", "", f"Command: `{command}`", "", *summary_lines(frame), "",
                      markdown_table(shown), ""])
