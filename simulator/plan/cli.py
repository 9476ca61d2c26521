"""``treering plan SCENARIO --ttft T [--tbt T]``: the command line of :mod:`simulator.plan.ttft` (its flags checked,
its answer printed and written)."""

from __future__ import annotations

import argparse
import json
import math
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from simulator import __version__
from simulator.errors import InputError
from simulator.plan.decode import ms
from simulator.plan.ttft import Config, TtftPlan, TtftRequest, plan_ttft, seconds
from simulator.report.plan_report import write_plan_report
from simulator.support.files import write_csv_atomic, write_text_atomic
from simulator.units import parse_time_strict

__all__ = ["cmd_plan_ttft", "ttft_frame"]

_DECODE_ONLY = ("model", "context", "eff_mem", "eff_flops", "weight_dtype", "kv_dtype")
_SCENARIO_KEYS = (("algorithms", "ring,tree,tree-p2p", "algorithms=[ring, tree]"), ("batch", 1, "workload.batch=N"),
                  ("dtype", "bf16", "workload.dtype=D"), ("mem_fraction", 0.9, "mem_fraction=F"),
                  ("topology", "dgx-h100", "topology=T"))  # the decode plan's flags, with their defaults


def _target(value: str | None, flag: str) -> float | None:
    if value is None:
        return None
    try:
        x = parse_time_strict(value)
    except InputError as err:
        raise err.located(field=flag) from None
    if not x > 0:
        raise InputError(f"must be positive, got {value!r}", field=flag)
    return x


def _request(args: argparse.Namespace) -> TtftRequest:
    if args.scenario is None:
        raise InputError("needs a prefill or generate scenario: treering plan SCENARIO --ttft T", field="--ttft")
    if args.ttft is None:
        raise InputError("required with a scenario (plan SCENARIO --ttft T [--tbt T])", field="--ttft")
    ttft, tbt = _target(args.ttft, "--ttft"), _target(args.tbt, "--tbt")
    assert ttft is not None
    for key in _DECODE_ONLY:
        if getattr(args, key) is not None:
            raise InputError("the scenario sets it (change it with --set KEY=VALUE)",
                             field="--" + key.replace("_", "-"))
    for key, default, hint in _SCENARIO_KEYS:
        if getattr(args, key) != default:
            raise InputError(f"the scenario sets it (change it with --set {hint})", field="--" + key.replace("_", "-"))
    return TtftRequest(scenario=args.scenario, ttft_s=ttft, tbt_s=tbt, tp=args.tp, max_nodes=args.max_nodes,
                       sets=tuple(args.sets), force=args.force)


def ttft_frame(result: TtftPlan) -> pd.DataFrame:
    """The plan's table: each strategy's best configuration at the answer's node count, best first."""
    def record(c: Config) -> dict[str, Any]:
        rec: dict[str, Any] = {"algorithm": c.strategy, "layout": c.layout, "met": False, "nodes": c.nodes,
                               "gpus": c.gpus, "tp": c.tp, "ttft_s": c.ttft_s}
        if result.kind == "generate":
            rec.update(decode=c.decode, tpot_ms=c.tpot_s * 1e3)
        rec.update(peak_mem_GB=c.peak_mem_bytes / 1e9, usable_mem_GB=c.usable_mem_bytes / 1e9, oom=c.oom,
                   bound=c.bound())
        return rec
    frame = pd.DataFrame.from_records([record(c) for c in result.rows])
    if len(frame):
        frame.loc[0, "met"] = result.met
    return frame


def _config(c: Config) -> str:
    text = f"{c.nodes} node(s), {c.gpus} GPUs, tp {c.tp}: prefill {c.strategy} {c.layout}, TTFT {seconds(c.ttft_s)}"
    if c.decode is not None and not math.isnan(c.tpot_s):
        text += f", decode {c.decode} {ms(c.tpot_s)} per token"
    return text + f", {c.peak_mem_bytes / 1e9:.4g} GB per GPU ({c.bound()})"


def cmd_plan_ttft(args: argparse.Namespace, say: Callable[[str], None]) -> int:
    """Run the plan, print the answer, the runner-up, what binds, the table and the command that reproduces it."""
    req = _request(args)
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir() \
            and Path(args.out).suffix not in (".csv", ".json"):
        raise InputError("exists and is not a folder (a report folder), a .csv or a .json", file=args.out, field="-o")
    result = plan_ttft(req)
    targets = f"a time to first token of {seconds(req.ttft_s)}" + \
        (f" and {ms(req.tbt_s)} between tokens" if req.tbt_s is not None else "")
    say(f"{req.scenario}: {result.model} {result.kind} on {result.topology}, target {targets}, up to "
        f"{req.max_nodes} nodes"
        + (f" ({', '.join(req.sets)})" if req.sets else ""))
    if result.rows:
        say(("answer: " if result.met else "not met; the lowest TTFT: ") + _config(result.rows[0]))
        if len(result.rows) > 1:
            say("runner-up: " + _config(result.rows[1]))
    say(f"binding: {result.binding}")
    frame = ttft_frame(result)
    with pd.option_context("display.width", 250, "display.max_colwidth", 200, "display.float_format",
                           "{:.4g}".format):
        if len(frame):
            say(frame.drop(columns=["usable_mem_GB", "oom"]).to_string(index=False))
    if result.reproduce:
        say("reproduce: " + shlex.join(result.reproduce))
    say(f"({result.evaluated} configurations simulated)")
    if args.out:
        _write(Path(args.out), frame, result, req, args)
    return 0


def _write(out: Path, frame: pd.DataFrame, result: TtftPlan, req: TtftRequest, args: argparse.Namespace) -> None:
    request = {"scenario": req.scenario, "ttft_s": req.ttft_s, "tbt_s": req.tbt_s, "tp": req.tp,
               "max_nodes": req.max_nodes, "sets": list(req.sets)}
    if out.suffix == ".csv":
        write_csv_atomic(frame, out)
    elif out.suffix == ".json":
        doc = {"request": request, "version": __version__, "met": result.met, "binding": result.binding,
               "reproduce": result.reproduce, "rows": frame.to_dict(orient="records")}
        write_text_atomic(out, json.dumps(doc, indent=2, default=str) + "\n")
    else:
        meta = {"model": result.model, "ttft_s": req.ttft_s, "target_s": req.tbt_s, "topology": result.topology,
                "command": shlex.join(["treering", *args.argv]), "version": __version__, "sets": list(req.sets),
                "reproduce": shlex.join(result.reproduce)}
        write_plan_report(frame.assign(binding=[result.binding] + [""] * (len(frame) - 1)), out, meta)
        print(f"wrote {out / 'report.md'}, {out / 'report.html'} and {out / 'plan.csv'}")
        return
    print(f"wrote {out}")
