"""``treering plan``: the decode plan (``--model --context --tbt``, :mod:`simulator.plan.decode`) and
``treering plan SCENARIO --ttft T [--tbt T]`` (:mod:`simulator.plan.ttft`), their flags checked, their answers
printed and written; and ``treering overlap`` (:mod:`simulator.plan.overlap`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from simulator import __version__
from simulator.cluster.topology import load_topology
from simulator.engine.warmup import load_compiled
from simulator.errors import InputError, excerpt
from simulator.models.presets import PRESETS
from simulator.plan.decode import PlanRequest, PlanRow, ms, plan
from simulator.plan.overlap import find_overlap, overlap_shape
from simulator.plan.train_cli import cmd_plan_train
from simulator.plan.ttft import Config, TtftPlan, TtftRequest, plan_ttft, seconds
from simulator.run.prepared import layout_of
from simulator.support.console import say
from simulator.support.files import write_csv_atomic, write_text_atomic
from simulator.support.outdir import check_output_file, claim_output_dir
from simulator.support.progress import progress_line
from simulator.support.yaml_lines import parse_set
from simulator.units import parse_time_strict, parse_tokens

__all__ = ["cmd_overlap", "cmd_plan", "cmd_plan_ttft", "plan_frame", "ttft_frame"]

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
    """The plan's table: each strategy's best configuration at the answer's node count, best first; ``met`` judged
    for every row against the plan's targets (:mod:`simulator.plan.verdict`)."""
    def record(c: Config) -> dict[str, Any]:
        rec: dict[str, Any] = {"algorithm": c.strategy, "layout": c.layout, "met": c.meets(result.targets),
                               "nodes": c.nodes, "gpus": c.gpus, "tp": c.tp, "ttft_s": c.ttft_s}
        if result.kind == "generate":
            rec.update(decode=c.decode, tpot_ms=c.tpot_s * 1e3)
        rec.update(peak_mem_GB=c.peak_mem_bytes / 1e9, usable_mem_GB=c.usable_mem_bytes / 1e9, oom=c.oom,
                   bound=c.bound())
        return rec
    return pd.DataFrame.from_records([record(c) for c in result.rows])


def _config(c: Config) -> str:
    text = f"{c.nodes} node(s), {c.gpus} GPUs, tp {c.tp}: prefill {c.strategy} {c.layout}, TTFT {seconds(c.ttft_s)}"
    if c.decode is not None and not math.isnan(c.tpot_s):
        text += f", decode {c.decode} {ms(c.tpot_s)} per token"
    return text + f", {c.peak_mem_bytes / 1e9:.4g} GB per GPU ({c.bound()})"


@contextmanager
def _claimed(out: str | None) -> Iterator[None]:
    """``-o`` checked before the plan works: a ``.csv`` or ``.json`` file that can be written (its folder made), or a
    report folder, locked while the plan runs (:mod:`simulator.support.outdir`)."""
    if not out:
        yield
        return
    path = Path(out)
    if path.suffix in (".csv", ".json"):
        check_output_file(path)
        yield
        return
    if path.exists() and not path.is_dir():
        raise InputError("exists and is not a folder (a report folder), a .csv or a .json", file=out, field="-o")
    with claim_output_dir(path):
        yield


def cmd_plan_ttft(args: argparse.Namespace, say: Callable[[str], None]) -> int:
    """Run the plan, print the answer, the runner-up, what binds, the table and the command that reproduces it."""
    req = _request(args)
    with _claimed(args.out):
        load_compiled()
        return _plan_ttft(args, req, say)


def _plan_ttft(args: argparse.Namespace, req: TtftRequest, say: Callable[[str], None]) -> int:
    with progress_line("plan") as progress:
        result = plan_ttft(req, progress)
    targets = f"a time to first token of {seconds(req.ttft_s)}" + \
        (f" and {ms(req.tbt_s)} between tokens" if req.tbt_s is not None else "")
    say(f"{req.scenario}: {result.model} {result.kind} of {result.tokens:,} prompt tokens on {result.topology}, "
        f"target {targets}, up to "
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
    runs = result.evaluated - result.prefills  # a generate request's: its best prefill run whole, with its decode
    say(f"(simulated {result.prefills:,} of {result.space:,} configurations"
        + (f", {runs:,} of them run whole with their decode)" if runs else ")"))
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
        from simulator.report.plan_report import write_plan_report  # matplotlib: only for a report

        write_plan_report(frame.assign(binding=[result.binding] + [""] * (len(frame) - 1)), out, meta)
        print(f"wrote {out / 'report.md'}, {out / 'report.html'} and {out / 'plan.csv'}")
        return
    print(f"wrote {out}")


def cmd_plan(args: argparse.Namespace) -> int:
    if getattr(args, "train", False):
        return cmd_plan_train(args)
    if args.scenario is not None or args.ttft is not None:
        return cmd_plan_ttft(args, say)
    for flag, value in (("--model", args.model), ("--context", args.context), ("--tbt", args.tbt)):
        if value is None:
            raise InputError("required (or plan a prefill: treering plan SCENARIO --ttft T)", field=flag)
    if args.model not in PRESETS:
        raise InputError(f"unknown model preset {excerpt(args.model)}; presets: {', '.join(PRESETS)}", field="--model")
    try:
        tbt = parse_time_strict(args.tbt)
        context = parse_tokens(args.context)
    except InputError as err:
        raise err.located(field="--tbt" if "time" in err.message or "unit" in err.message else "--context") \
            from None
    if tbt <= 0:
        raise InputError(f"must be positive, got {args.tbt!r}", field="--tbt")
    for flag, value in (("--mem-fraction", args.mem_fraction), ("--eff-mem", args.eff_mem),
                        ("--eff-flops", args.eff_flops)):
        if value is not None and not 0 < value <= 1:
            raise InputError(f"must be in (0, 1], got {value}", field=flag)
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if not algorithms:
        raise InputError(f"needs at least one algorithm name, got {excerpt(args.algorithms)}", field="--algorithms")
    topologies = [t.strip() for t in args.topology.split(",") if t.strip()]
    if getattr(args, "objective", "gpus") != "cost" and len(topologies) > 1:
        raise InputError("one topology (several need --objective cost)", field="--topology")
    if not topologies:
        raise InputError(f"needs a topology, got {excerpt(args.topology)}", field="--topology")
    req = PlanRequest(model=args.model, context=context, tbt_s=tbt, topology=topologies[0],
                      algorithms=algorithms, batch=args.batch,
                      dtype=args.dtype, weight_dtype=args.weight_dtype, kv_dtype=args.kv_dtype, tp=args.tp,
                      max_nodes=args.max_nodes, mem_fraction=args.mem_fraction, eff_mem=args.eff_mem,
                      eff_flops=args.eff_flops, sets=args.sets, force=args.force)
    if getattr(args, "objective", "gpus") == "cost":
        if args.out and Path(args.out).suffix != ".csv":
            raise InputError("--objective cost writes a .csv", field="-o")
        with _claimed(args.out):
            load_compiled()
            return _plan_cost(args, req, topologies)
    with _claimed(args.out):
        load_compiled()  # the checks done: the engine's code, compiled in parallel on a fresh install
        return _plan_decode(args, req)


def _plan_cost(args: argparse.Namespace, req: PlanRequest, topologies: list[str]) -> int:
    """The cheapest configuration meeting the target across ``topologies`` (:mod:`simulator.plan.cost`)."""
    from simulator.plan.cost import cost_frame, plan_cost

    named = [o.strip() for o in (args.offers or "").split(",") if o.strip()]
    say(f"{args.model}, context {req.context:,} tokens, target {req.tbt_s * 1e3:g} ms between tokens, the cheapest "
        f"on {', '.join(topologies)}, up to {req.max_nodes} nodes" + (f" ({', '.join(args.sets)})" if args.sets
                                                                    else ""))
    try:
        with progress_line("plan") as progress:
            priced = plan_cost(req, topologies, named, progress)
    except InputError as err:
        raise _plan_flag(err) from None
    for p in priced:
        how = "given" if named else "the cheapest rented offer listed for it"
        say(f"{p.topology}: {p.device} at ${p.offer.usd_per_gpu_hour:.4g}/GPU-hour ({p.offer.name}, {how}; "
            f"{p.offer.date})")
    table = cost_frame(priced, req)
    if len(table) and bool(table["met"].iloc[0]):
        top = table.iloc[0]
        say(f"answer: {top['algorithm']} on {top['topology']}, {int(top['gpus'])} GPUs (tp {int(top['tp'])}), "
            f"{top['tbt_ms']:.4g} ms between tokens, ${top['usd_per_hour']:.4g}/hour, "
            f"${top['usd_per_m_tokens']:.4g} per million tokens")
    else:
        say("not met on any topology")
    with pd.option_context("display.width", 250, "display.max_colwidth", 80, "display.float_format",
                           "{:.4g}".format):
        say(table.drop(columns=["binding"]).to_string(index=False))
    if args.out:
        write_csv_atomic(table, Path(args.out))
        print(f"wrote {args.out}")
    return 0


def _plan_decode(args: argparse.Namespace, req: PlanRequest) -> int:
    tbt = req.tbt_s
    say(f"{args.model}, context {req.context:,} tokens, target {tbt * 1e3:g} ms between tokens, on "
        f"{args.topology}, up to {req.max_nodes} nodes, memory fraction {req.mem_fraction:g}"
        + (f" ({', '.join(args.sets)})" if args.sets else ""))  # the resolved request, before the search
    try:
        with progress_line("plan") as progress:
            rows = plan(req, progress)
    except InputError as err:
        raise _plan_flag(err) from None
    if args.sets:
        from simulator.run.commands import whatif_notes  # the run verbs' module (matplotlib): only when asked

        for note in whatif_notes(args.topology, args.sets):
            print(f"treering: note: {note}", file=sys.stderr)
    table = plan_frame(rows, req)
    shown = table.drop(columns=["usable_mem_GB", "bottleneck", "evaluated"])
    with pd.option_context("display.width", 250, "display.max_colwidth", 200, "display.float_format",
                           "{:.4g}".format):
        say(shown.to_string(index=False))
    say(f"(simulated {sum(r.evaluated for r in rows):,} of {sum(r.space for r in rows):,} configurations)")
    if args.out:
        out = Path(args.out)
        if out.suffix not in (".csv", ".json"):  # a folder: the plan's report
            meta = {"model": args.model, "context": req.context, "target_s": tbt, "topology": args.topology,
                    "command": shlex.join(["treering", *args.argv]), "version": __version__,
                    "sets": list(args.sets), "mem_fraction": req.mem_fraction}
            from simulator.report.plan_report import write_plan_report  # matplotlib: only for a report

            write_plan_report(table, out, meta)
            print(f"wrote {out / 'report.md'}, {out / 'report.html'} and {out / 'plan.csv'}")
            return 0
        if out.suffix == ".csv":
            write_csv_atomic(table, out)
        else:
            doc = {"request": {k: (list(v) if isinstance(v, (list, tuple)) else v)
                               for k, v in dataclasses.asdict(req).items()},
                   "version": __version__, "rows": table.to_dict(orient="records")}
            write_text_atomic(out, json.dumps(doc, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


_PLAN_FLAGS = {"algorithms": "--algorithms", "topology": "--topology", "topology_params": "--topology",
               "workload.model": "--model", "workload.dtype": "--dtype", "workload.weight_dtype": "--weight-dtype",
               "workload.kv_dtype": "--kv-dtype", "workload.batch": "--batch", "workload.tp": "--tp",
               "workload.context": "--context", "mem_fraction": "--mem-fraction"}


def _plan_flag(err: InputError) -> InputError:
    """An error in the scenario plan builds from its flags, told as the flag's (``--dtype: ...``)."""
    if err.file != "treering plan" or not err.field:
        return err
    for key, flag in _PLAN_FLAGS.items():
        if err.field == key or err.field.startswith(key + "."):
            return InputError(err.message, field=flag)
    return InputError(err.message, file="--set", field=err.field)  # the other keys come from --set only


def plan_frame(rows: Sequence[PlanRow], req: PlanRequest) -> pd.DataFrame:
    """The plan as a table: the answer per algorithm (or its fastest fitting configuration, ``met`` False)."""
    records = []
    for row in rows:
        e = row.best
        records.append({"algorithm": row.algorithm, "met": row.met, "nodes": e.nodes if e else None,
                        "gpus": e.gpus if e else None, "tp": e.tp if e else None,
                        "tbt_ms": e.latency_s * 1e3 if e else None,
                        "peak_mem_GB": e.peak_mem_bytes / 1e9 if e else None,
                        "usable_mem_GB": e.usable_mem_bytes / 1e9 if e else None,
                        "binding": row.binding, "bottleneck": e.bottleneck() if e else None,
                        "evaluated": row.evaluated})
    return pd.DataFrame.from_records(records)


def cmd_overlap(args: argparse.Namespace) -> int:
    cluster = load_topology(args.topology, dict(parse_set(s) for s in args.sets), Path.cwd())
    shape = overlap_shape(args.model, args.dtype)
    sizes = args.gpus or sorted({min(8, len(cluster.ranks)), len(cluster.ranks)})
    print(f"ring prefill overlap, {args.model} attention ({shape.heads} heads, {shape.kv_heads} KV heads, head_dim "
          f"{shape.head_dim}), {args.dtype}, non-causal blocks, on {cluster.name}")
    print(f"{'gpus':>5} {'tokens_per_gpu':>15} {'closed_form':>12} {'F_TFLOPs':>9} {'B_GBps':>8} {'simulations':>11}")
    for p in sizes:
        if not 2 <= p <= len(cluster.ranks):
            raise InputError(f"must be between 2 and the {len(cluster.ranks)} GPUs, got {p}", field="--gpus")
        res = find_overlap(shape, cluster, layout_of(cluster, p))
        found = str(res.tokens) if res.tokens is not None else "not found"
        print(f"{p:>5} {found:>15} {res.closed_form:>12.0f} {res.flops / 1e12:>9.1f} {res.bandwidth / 1e9:>8.1f} "
              f"{res.simulations:>11}")
    return 0
