"""``treering plan --train --model M --sequence S --global-batch B (--gpus N | --max-gpus N [--step-time T])``:
its flags checked, the search run (:mod:`simulator.plan.train`) on N GPUs, or on whole servers doubling up to N
(with ``--step-time``: the fewest GPUs whose fastest layout meets it; without: the GPU count with the fastest step),
the answer printed (the fastest layout, the runner-up, what binds, the command and a scenario that reproduce it)
and written with ``-o PATH.csv`` or ``PATH.json``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from pathlib import Path
from typing import Any

import pandas as pd

from simulator import __version__
from simulator.cluster.topology import load_topology
from simulator.errors import InputError, excerpt
from simulator.models.presets import PRESETS
from simulator.plan.train import PLACEMENTS, TrainPlan, TrainRequest, plan_train
from simulator.report.document import plain_number
from simulator.support.console import say
from simulator.support.files import write_csv_atomic, write_text_atomic
from simulator.support.outdir import check_output_file
from simulator.support.progress import progress_line
from simulator.units import parse_time_strict, parse_tokens

__all__ = ["cmd_plan_train", "scenario_text"]

_NOT_HERE = (("scenario", "SCENARIO"), ("ttft", "--ttft"), ("tbt", "--tbt"), ("context", "--context"))


def _request(args: argparse.Namespace) -> tuple[TrainRequest, float | None]:
    """The request (``gpus``: ``--gpus``, or ``--max-gpus``, the largest count searched) and the step-time target."""
    for key, flag in _NOT_HERE:
        if getattr(args, key, None) is not None:
            raise InputError("does not apply to plan --train", field=flag)
    for flag, value in (("--model", args.model), ("--sequence", args.sequence),
                        ("--global-batch", args.global_batch)):
        if value is None:
            raise InputError("required with --train", field=flag)
    if (args.gpus is None) == (args.max_gpus is None):
        raise InputError("give one of --gpus N (plan on N GPUs) and --max-gpus N (search GPU counts up to N)",
                         field="--gpus")
    if args.model not in PRESETS:
        raise InputError(f"unknown model preset {excerpt(args.model)}; presets: {', '.join(PRESETS)}", field="--model")
    tokens = {}
    for flag, value in (("--sequence", args.sequence), ("--global-batch", args.global_batch)):
        try:
            tokens[flag] = parse_tokens(value)
        except InputError as err:
            raise err.located(field=flag) from None
    target = None
    if args.step_time is not None:
        try:
            target = parse_time_strict(args.step_time)
        except InputError as err:
            raise err.located(field="--step-time") from None
        if not target > 0:
            raise InputError(f"must be positive, got {args.step_time!r}", field="--step-time")
    if not 0 < args.mem_fraction <= 1:
        raise InputError(f"must be in (0, 1], got {args.mem_fraction}", field="--mem-fraction")
    if args.out and Path(args.out).suffix not in (".csv", ".json"):
        raise InputError("plan --train writes PATH.csv or PATH.json", field="-o")
    gpus = args.gpus if args.gpus is not None else args.max_gpus
    return TrainRequest(args.model, tokens["--sequence"], tokens["--global-batch"], gpus, args.dtype,
                        args.mem_fraction), target


def gpu_counts(req: TrainRequest, per_server: int, exact: bool) -> list[int]:
    """The GPU counts to plan on: ``req.gpus`` (``exact``, whole servers), or whole servers doubling up to it."""
    if exact:
        if req.gpus % per_server:
            raise InputError(f"{req.gpus} GPUs are not whole servers ({per_server} GPUs each)", field="--gpus")
        return [req.gpus]
    counts, n = [], per_server
    while n <= req.gpus:
        counts.append(n)
        n *= 2
    if not counts:
        raise InputError(f"less than one server ({per_server} GPUs)", field="--max-gpus")
    return counts


def scenario_text(req: TrainRequest, topology: str, nodes: int, row: dict[str, Any]) -> str:
    """A scenario file that runs the layout of ``row`` (``treering run``)."""
    parallel = ", ".join(f"{k}: {row[k]}" for k in ("tp", "cp", "pp", "virtual_stages", "dp", "cp_algorithm"))
    return "\n".join([
        f"name: plan-train-{req.model}", f"topology: {topology}", f"topology_params: {{nodes: {nodes}}}",
        "workload:", "  kind: train", f"  model: {req.model}", f"  sequence: {req.sequence}",
        f"  global_batch: {req.global_batch}", "  micro_batch: 1", f"  dtype: {req.dtype}",
        f"  parallel: {{{parallel}, sequence_parallel: {'true' if row['tp'] > 1 else 'false'}}}",
        f"  zero: {row['zero']}", f"  recompute: {row['recompute']}",
        *([f"  placement: {row['placement']}"] if row["placement"] != PLACEMENTS[0] else []),
        f"mem_fraction: {req.mem_fraction}", ""])


def _layout(row: dict[str, Any]) -> str:
    vpp = f" x{row['virtual_stages']} interleaved" if row["virtual_stages"] > 1 else ""
    order = f" (placement {row['placement']})" if row["placement"] != PLACEMENTS[0] else ""
    return (f"TP{row['tp']} CP{row['cp']} PP{row['pp']}{vpp} DP{row['dp']}{order} {row['cp_algorithm']}, "
            f"ZeRO {row['zero']}, "
            f"recompute {row['recompute']}: step {row['step_s']:.4g} s, {row['tflops_per_gpu']:.4g} TFLOP/s per GPU "
            f"(MFU {row['mfu']:.1%}), {row['peak_mem_GB']:.4g} GB per GPU, bound by {row['binding']}")


def cmd_plan_train(args: argparse.Namespace) -> int:
    base, target = _request(args)
    if args.out:
        check_output_file(Path(args.out))
    per_server = len(load_topology(args.topology, {"nodes": 1}).ranks)
    counts = gpu_counts(base, per_server, args.gpus is not None)
    plans: dict[int, TrainPlan] = {}
    chosen = None
    with progress_line("plan") as progress:
        for gpus in counts:
            req = dataclasses.replace(base, gpus=gpus)
            cluster = load_topology(args.topology, {"nodes": gpus // per_server}, force=args.force)
            plans[gpus] = result = plan_train(req, cluster, progress)
            if result.rows and target is not None and result.rows[0]["step_s"] <= target:
                chosen = gpus  # the fewest GPUs meeting the step time
                break
    fitted = {g: p for g, p in plans.items() if p.rows}
    if chosen is None and fitted:
        chosen = min(fitted, key=lambda g: (fitted[g].rows[0]["step_s"], g))
    what = f"{base.model} training step of {base.global_batch:,} tokens ({base.sequence:,} per sequence)"
    for gpus, result in plans.items():
        best = f"fastest {result.rows[0]['step_s']:.4g} s" if result.rows else "no layout fits"
        say(f"{what} on {gpus} GPUs of {args.topology}: {result.candidates} layouts, {result.over_memory} over "
            f"memory, {len(result.rows)} simulated in full, {result.bounded} bounded out; {best}")
    if chosen is None:
        say("no layout fits in memory")
        return 0
    result = plans[chosen]
    req = dataclasses.replace(base, gpus=chosen)
    if target is not None:
        met = result.rows[0]["step_s"] <= target
        say(f"step-time target {target:.4g} s: {'met' if met else 'not met'} on {chosen} GPUs")
    say("fastest: " + _layout(result.rows[0]))
    if len(result.rows) > 1:
        say("runner-up: " + _layout(result.rows[1]))
    say(f"binding: {result.rows[0]['binding']} (the largest of the exposed times and the pipeline bubble)")
    frame = pd.DataFrame.from_records(result.rows)
    with pd.option_context("display.width", 250, "display.float_format", plain_number):
        say(frame.head(10).to_string(index=False))
    say("reproduce: " + shlex.join(["treering", "plan", "--train", "--model", req.model, "--sequence",
                                    str(req.sequence), "--global-batch", str(req.global_batch), "--gpus",
                                    str(req.gpus), "--topology", args.topology, "--dtype", req.dtype,
                                    "--mem-fraction", str(req.mem_fraction)]))
    say("run the fastest with this scenario (treering run FILE):\n" + scenario_text(req, args.topology,
                                                                                   chosen // per_server,
                                                                                   result.rows[0]))
    if args.out:
        _write(Path(args.out), frame, result, req)
    return 0


def _write(out: Path, frame: pd.DataFrame, result: TrainPlan, req: TrainRequest) -> None:
    if out.suffix == ".csv":
        write_csv_atomic(frame, out)
    else:
        doc = {"request": dataclasses.asdict(req), "version": __version__,
               "candidates": result.candidates, "over_memory": result.over_memory, "bounded": result.bounded,
               "rows": frame.to_dict(orient="records")}
        write_text_atomic(out, json.dumps(doc, indent=2, default=str) + "\n")
    say(f"wrote {out}")
