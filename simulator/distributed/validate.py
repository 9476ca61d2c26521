"""``treering validate``: run the schedules for real, time them, check them, and compare with the simulator.

For each sweep point and algorithm every rank runs ``--warmup`` untimed then ``--iters`` timed iterations; an
iteration's time is the maximum over ranks (barrier, run, all_reduce MAX) and the median over iterations is
``measured_s``. Rank 0 then checks the outputs against single-device attention (``max_abs_err``) and against the
simulator's numeric mode on the same torch inputs (``bitwise_equal_to_sim``: equal bit for bit; expected where
the merge order is the same, i.e. with ``--collectives decomposed`` or schedules without collectives), simulates
the same schedule on the topology (``predicted_s``) and writes ``validation.csv`` and ``summary.md``. Prefill points
(outputs and gradients, ``grad_max_abs_err``) run in :mod:`.prefill_validate`, training steps (``kind: train``: the
whole step of a small model, its gradients against single-process autograd) in :mod:`.train_validate`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from simulator.algorithms import build_schedule
from simulator.cluster.topology import Cluster, load_topology
from simulator.distributed.checks import check_scenario, out_dir
from simulator.distributed.common import device_for, init_group, rank_layout, timed_iterations
from simulator.distributed.drift import drift_before
from simulator.distributed.floor import FLOOR_COLUMN, compared, floor_lines, timing
from simulator.distributed.prefill_validate import prefill_point_rows
from simulator.distributed.runner import RankRunner
from simulator.distributed.train_validate import TRAIN_COLUMNS, train_point_rows
from simulator.engine.core import simulate
from simulator.errors import InputError
from simulator.kernels.payload import transfer_layouts
from simulator.kernels.profiles import extrapolated_text
from simulator.numeric.decode import Inputs, dense_attention, make_inputs, max_abs_error, run_numeric
from simulator.report.markdown import markdown_table
from simulator.run.prepared import PreparedPoint
from simulator.run.scenario import Point
from simulator.schedule.core import Schedule
from simulator.support.files import write_csv_atomic, write_text_atomic
from simulator.workloads.shape import DecodeShape

__all__ = ["COLUMNS", "drift_lines", "run_rank", "summarize", "summary_lines"]

COLUMNS = ["algorithm", "ranks", "context", "measured_s", "predicted_s", "error_pct", "max_abs_err",
           "bitwise_equal_to_sim"]
# quartiles of the per-iteration times (measured_s is their median), and the floor of identical runs
# (simulator.distributed.floor)
SPREAD = ["measured_q1_s", "measured_q3_s", FLOOR_COLUMN]
# kernels the prediction timed beyond their profiled shapes (and on which axes); the machine's speed against its
# calibration right before the runs (simulator.distributed.drift)
EXTRA = ["extrapolated", "drift"]
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
DRIFT_WITHIN = 0.10  # a run whose drift is within this of 1 ran on the machine as calibrated (summary_lines)
PER_ALGORITHM = ["grad_max_abs_err", *TRAIN_COLUMNS]  # prefill: dQ, dK, dV against torch autograd (NaN without a
# backward); train: gradients and loss against single-process autograd, the prediction's parts


def _cluster(args: argparse.Namespace, point: Point, ranks: int) -> Cluster:
    sc = point.scenario
    force = bool(getattr(args, "force", False))
    cluster = (load_topology(args.topology, force=force) if args.topology
               else load_topology(sc.topology, sc.topology_params, point.base_dir, force))
    if len(cluster.ranks) < ranks:
        raise InputError(f"the topology has {len(cluster.ranks)} ranks; this run has {ranks}",
                         file=args.topology or point.source, field="topology")
    return cluster


def _time_runs(args: argparse.Namespace, sched: Schedule, inp: Inputs, shape: DecodeShape,
               device: torch.device) -> tuple[list[float], dict[str, Any]]:
    rank, layouts = dist.get_rank(), transfer_layouts(sched, shape)
    return timed_iterations(args, lambda pool: RankRunner(sched, inp, rank, shape, layouts, args.collectives, device,
                                                          pool), device)


def _point_rows(args: argparse.Namespace, prep: PreparedPoint, device: torch.device) -> list[dict[str, Any]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    layout = rank_layout()
    point, shape = prep.point, prep.shape
    assert shape is not None
    np_inputs = make_inputs(np.random.default_rng(args.seed), shape.batch, shape.heads, shape.kv_heads,
                            shape.head_dim, shape.context, np.float64 if shape.dtype == "fp64" else np.float32)
    inp = np_inputs.to(lambda a: torch.from_numpy(a).to(device))
    if shape.dtype in HALF:  # run in the workload's dtype; the reference sees the same rounded inputs
        inp = inp.to(lambda a: a.to(HALF[shape.dtype]) if a.is_floating_point() else a)
        np_inputs = inp.to(lambda a: (a.double() if a.is_floating_point() else a).cpu().numpy())
    cpu_inputs = inp.to(lambda a: a.cpu())
    rows = []
    cluster = _cluster(args, point, world)
    for algo in prep.algorithms:
        sched = build_schedule(algo.name, algo.params, shape, layout)
        drift = drift_before(sched, cluster, layout, device, not args.no_drift)
        times, bufs = _time_runs(args, sched, inp, shape, device)
        stats = timing(times)
        mine = {r: bufs[b].cpu() for r, b in sched.meta["outputs"] if r == rank}
        gathered: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if rank != 0:
            continue
        assert gathered is not None
        outputs = {r: out for part in gathered for r, out in part.items()}
        sim = run_numeric(sched, cpu_inputs)
        bitwise = all(torch.equal(outputs[r], sim.outputs[r]) for r in sim.outputs)
        result = simulate(sched, cluster)
        predicted = result.makespan
        rows.append({
            "algorithm": algo.label, "ranks": sched.ranks, "context": shape.context,
            **compared(stats, predicted),
            "max_abs_err": max_abs_error([o.double() for o in outputs.values()], dense_attention(np_inputs)),
            "bitwise_equal_to_sim": bitwise, **stats,
            "extrapolated": extrapolated_text(result.extrapolated), "drift": drift,
            **dict(point.swept),
        })
    return rows


def _spread(row: Mapping[Any, Any]) -> str:
    ms = [float(row[c]) * 1e3 for c in ("measured_s", "measured_q1_s", "measured_q3_s")]
    return f"{ms[0]:.3g} ms [{ms[1]:.3g}, {ms[2]:.3g}]"


def _faster(frame: pd.DataFrame) -> tuple[int, list[str], int]:
    """Points where the faster algorithm was predicted right, and the others: a tie where the measured times of
    the predicted and the measured fastest overlap within their iterations' interquartile ranges (the machine
    does not tell them apart), else a miss. Returns (right, ties described, points)."""
    keys = [c for c in frame.columns if c not in COLUMNS + SPREAD + EXTRA + PER_ALGORITHM or c in ("ranks", "context")]
    right, ties, points = 0, [], 0
    for _, grp in frame.groupby(keys, dropna=False) if keys else [((), frame)]:
        points += 1
        by_alg = {str(row["algorithm"]): row for row in grp.to_dict("records")}
        measured = min(by_alg, key=lambda a: float(by_alg[a]["measured_s"]))
        predicted = min(by_alg, key=lambda a: float(by_alg[a]["predicted_s"]))
        a, b = by_alg[measured], by_alg[predicted]
        if measured == predicted:
            right += 1
        elif "measured_q1_s" in b and float(b["measured_q1_s"]) <= float(a["measured_q3_s"]):
            ties.append(f"{int(a['ranks'])} ranks, context {int(a['context'])}: {measured} {_spread(a)} vs "
                        f"{predicted} {_spread(b)}")
    return right, ties, points


def per_algorithm(frame: pd.DataFrame) -> list[str]:
    """Median and 90th-percentile |error| of each algorithm, and how often it was predicted too fast."""
    out = []
    for alg, grp in frame.groupby("algorithm", sort=False):
        err = grp["error_pct"]
        out.append(f"  - {alg}: median |error| {err.abs().median():.1f} %, 90th percentile "
                   f"{err.abs().quantile(0.9):.1f} %, predicted too fast at {int((err < 0).sum())} of {len(err)}")
    return out


def drift_lines(frame: pd.DataFrame, within: float = DRIFT_WITHIN) -> list[str]:
    """The machine's drift from its calibration (the ``drift`` column) and the errors where it stayed within
    ``within`` of it and where it did not: how much of the error the machine's own change can account for."""
    if "drift" not in frame or not frame["drift"].notna().any():
        return []
    timed = frame[frame["drift"].notna()]
    drift, err = timed["drift"], timed["error_pct"].abs()
    steady = (drift - 1).abs() <= within
    parts = [f"{label} at {int(sel.sum())} of {len(timed)} (median |error| {err[sel].median():.1f} %)"
             for label, sel in ((f"within {within:.0%}", steady), ("beyond", ~steady)) if sel.any()]
    return [f"- machine speed against its calibration (drift: the dominant kernel's nearest profiled point timed "
            f"again right before each run, now / calibrated): median {drift.median():.2f}x, range "
            f"{drift.min():.2f}-{drift.max():.2f}x; " + "; ".join(parts)]


def train_lines(frame: pd.DataFrame) -> list[str]:
    """Training steps: their gradients' and losses' largest errors against single-process autograd."""
    if "grad_max_rel_err" not in frame or not frame["grad_max_rel_err"].notna().any():
        return []
    steps = frame[frame["grad_max_rel_err"].notna()]
    return [f"- training steps ({len(steps)}): every rank's gradient of every weight against single-process "
            f"autograd, largest error {steps['grad_max_rel_err'].max():.3g} of the weight's largest gradient "
            f"({steps['grad_max_abs_err'].max():.3g} absolute); loss {steps['loss_abs_err'].max():.3g} absolute"]


def summary_lines(frame: pd.DataFrame) -> list[str]:
    """Error statistics and whether the faster algorithm was predicted right at every point."""
    err = frame["error_pct"].abs()
    right, ties, points = _faster(frame)
    faster = f"- faster algorithm predicted right at {right} of {points} points" + (
        " (every point)" if right == points else f" ({right + len(ties)} of {points} right or a measured tie)")
    if ties:
        faster += (f"; {len(ties)} more {'is a tie' if len(ties) == 1 else 'are ties'} (the measured times overlap "
                   "within their iterations' interquartile ranges): " + "; ".join(ties))
    extrapolated = int((frame["extrapolated"].fillna("") != "").sum()) if "extrapolated" in frame else 0
    attention = frame[frame["max_abs_err"].notna()] if "max_abs_err" in frame else frame.iloc[:0]
    grads = attention["grad_max_abs_err"].dropna() if "grad_max_abs_err" in frame else pd.Series(dtype=float)
    return [
        f"- points x algorithms: {len(frame)}",
        f"- median |error|: {err.median():.1f} %, 90th percentile: {err.quantile(0.9):.1f} %, max |error|: "
        f"{err.max():.1f} %",
        *per_algorithm(frame),
        faster,
        f"- predictions with a kernel timed beyond its profiled shapes: {extrapolated} of {len(frame)}",
        *floor_lines(frame),
        *drift_lines(frame),
    ] + ([f"- max abs error against single-device attention: {attention['max_abs_err'].max():.3g}",
          f"- bitwise equal to the simulator's numeric mode: {int(attention['bitwise_equal_to_sim'].sum())} of "
          f"{len(attention)}"] if len(attention) else []) \
        + ([f"- max abs error of dQ, dK, dV against torch autograd: {grads.max():.3g}"] if len(grads) else []) \
        + train_lines(frame)


def summarize(frame: pd.DataFrame, command: str) -> str:
    """The Markdown summary written next to validation.csv."""
    return "\n".join(["# Validation summary", "", f"Command: `{command}`", "", *summary_lines(frame), "",
                      markdown_table(frame), ""])


REAL_ROWS: dict[str, Callable[[argparse.Namespace, PreparedPoint, torch.device], list[dict[str, Any]]]] = {
    "decode": _point_rows, "prefill": lambda args, prep, device: prefill_point_rows(args, prep, device, _cluster),
    "train": lambda args, prep, device: train_point_rows(args, prep, device, _cluster),
}  # the workload kinds that run for real, and how (distributed.checks.REAL_KINDS names the same kinds)


def run_rank(args: argparse.Namespace) -> None:
    """One rank of ``treering validate`` (rank 0 writes the outputs)."""
    prepared = check_scenario(args)
    init_group(args.backend, args.timeout)
    # no try/finally: on an error the rank exits at once (destroying the group could wait on failed peers)
    device = device_for(args.backend)
    rows = [row for prep in prepared for row in REAL_ROWS[prep.kind](args, prep, device)]
    if dist.get_rank() == 0:
        frame = pd.DataFrame(rows)
        out = out_dir(args, prepared)
        write_csv_atomic(frame, out / "validation.csv")
        command = "treering " + " ".join(getattr(args, "argv", []))
        write_text_atomic(out / "summary.md", summarize(frame, command))
        with pd.option_context("display.width", 200, "display.float_format", "{:.4g}".format):
            print(frame.to_string(index=False))
        print("\n" + "\n".join(summary_lines(frame)))
        print(f"wrote {out / 'validation.csv'} and {out / 'summary.md'}")
    dist.destroy_process_group()
