"""``treering``: the command line. Errors in user input print one line and exit with status 2."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd

from simulator import __version__
from simulator.cluster.bottleneck import whatif_note
from simulator.cluster.hostgraph import ImportOptions
from simulator.cluster.importers import FABRICS, import_topology
from simulator.cluster.summary import summarize
from simulator.cluster.topology import list_presets, load_topology, preset_description
from simulator.distributed.checks import check_scenario
from simulator.distributed.cli_args import add_calibrate_args, add_validate_args
from simulator.distributed.launch import RankFailure, spawn
from simulator.errors import InputError, excerpt
from simulator.models.presets import PRESETS
from simulator.nccl.calibrate import calibrate_from_nccl_tests
from simulator.nccl.validate import summarize as nccl_summary
from simulator.nccl.validate import summary_lines as nccl_summary_lines
from simulator.nccl.validate import validate_nccl_tests
from simulator.plan.cli import cmd_plan_ttft
from simulator.plan.decode import PlanRequest, PlanRow, plan
from simulator.plan.overlap import find_overlap, overlap_shape
from simulator.report.pages import TIMELINE_FILE, write_report
from simulator.report.plan_report import write_plan_report
from simulator.report.read import read_report_inputs, resumable_rows
from simulator.report.timeline import timeline_frame
from simulator.report.trace import chrome_trace, describe_cut, parse_ranks, parse_window
from simulator.run.kinds import KINDS
from simulator.run.prepare import check_points, point_runs, prepare_point
from simulator.run.prepared import PreparedPoint, layout_of
from simulator.run.rows import columns_markdown
from simulator.run.scenario import Point, Scenario, load_scenario, parse_set
from simulator.run.sweep import EXECUTORS, run_sweep
from simulator.support.files import write_csv_atomic, write_text_atomic
from simulator.support.outdir import check_output_dir, check_output_file, output_lock
from simulator.support.paths import DEFAULT_SCENARIO
from simulator.units import parse_bandwidth, parse_time_strict, parse_tokens

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _count(minimum: int) -> Any:
    """An argparse type: an integer >= ``minimum`` (at most 18 digits)."""
    def parse(text: str) -> int:
        try:
            value = int(text) if len(text) <= 18 else None
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {excerpt(text)}")
        return value

    return parse


_FORCE_HELP = "run work that is over the size limits (sweep points, topology, schedule ops) anyway"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="treering", description="Ring vs Tree attention on simulated GPU clusters.")
    p.add_argument("--version", action="version", version=f"treering {__version__}")
    sub = p.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run a scenario or sweep; print a table; write DIR/results.csv")
    run.add_argument("scenario", nargs="?", default=str(DEFAULT_SCENARIO),
                     help="scenario YAML (default: the embedded quickstart)")
    run.add_argument("-o", "--out", default=None, help="output folder (default: out/<scenario name>)")
    run.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                     help="override a dotted key of the scenario, e.g. --set topology_params.nodes=4")
    run.add_argument("--numeric", action="store_true",
                     help="also execute each schedule on random arrays and report max_abs_err against dense attention")
    run.add_argument("--timeline-point", type=_count(0), default=0, metavar="K",
                     help="sweep point (0-based) whose per-rank timeline the report draws (default 0)")
    run.add_argument("--no-report", action="store_true", help="write results.csv only")
    run.add_argument("--jobs", type=_count(1), default=os.cpu_count() or 1,
                     help="points simulated at once (default: the CPUs); 1 runs in this process")
    run.add_argument("--executor", default="process", choices=EXECUTORS, help="process (a local pool) or dask")
    run.add_argument("--scheduler", default=None, metavar="ADDRESS",
                     help="a Dask scheduler (tcp://host:8786); without it --executor dask starts a local cluster")
    run.add_argument("--resume", action="store_true",
                     help="keep the finished points of DIR/results.csv and run only the others")
    run.add_argument("--force", action="store_true", help=_FORCE_HELP)
    rep = sub.add_parser("report", help="(re)write the report of a results.csv: report.md, report.html, figures")
    rep.add_argument("results", help="a results.csv written by treering run (or its folder)")
    rep.add_argument("-o", "--out", default=None, help="output folder (default: the results' folder)")
    trace = sub.add_parser("trace", help="Chrome/Perfetto trace of one sweep point (ranks and link utilisation)")
    trace.add_argument("scenario", help="scenario YAML")
    trace.add_argument("--point", type=_count(0), default=0, metavar="K", help="sweep point, 0-based (default 0)")
    trace.add_argument("-o", "--out", required=True, help="trace JSON to write")
    trace.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                       help="override a dotted key of the scenario, as for run")
    trace.add_argument("--force", action="store_true", help=_FORCE_HELP)
    trace.add_argument("--ranks", default=None, metavar="LIST",
                       help="ranks to show, e.g. 0-7,12 (default: all up to 64; beyond, the critical rank and a "
                            "sample)")
    trace.add_argument("--window", default=None, metavar="START:END",
                       help="simulated time to show, e.g. 0:2ms or 1ms: (default: all of it)")
    schema = sub.add_parser("schema", help="print the JSON Schema of scenario files (for editors), or with --columns "
                                           "the result columns of every workload kind")
    schema.add_argument("--columns", nargs="?", const="all", default=None, metavar="KIND",
                        help=f"print the result columns (name, unit, meaning) of KIND ({', '.join(KINDS)}) or of all")
    pl = sub.add_parser("plan", help="smallest cluster whose decode step meets a time-between-tokens target, or "
                                     "whose prefill (generate) meets a time-to-first-token target (SCENARIO --ttft)")
    pl.add_argument("scenario", nargs="?", default=None,
                    help="with --ttft: a prefill or generate scenario (its topology family, model, prompt)")
    pl.add_argument("--ttft", default=None, help="time-to-first-token target with its unit, e.g. 2s (needs SCENARIO)")
    pl.add_argument("--model", default=None, help=f"model preset: {', '.join(PRESETS)} (decode plan)")
    pl.add_argument("--context", default=None, help="tokens of context: 1048576, 128K, 1M (K = 1024) (decode plan)")
    pl.add_argument("--tbt", default=None, help="time-between-tokens target with its unit, e.g. 50ms")
    pl.add_argument("--topology", default="dgx-h100", help="parametric preset or topology file (default dgx-h100)")
    pl.add_argument("--algorithms", default="ring,tree,tree-p2p", help="comma-separated (default ring,tree,tree-p2p)")
    pl.add_argument("--batch", type=_count(1), default=1, help="sequences decoded together (default 1)")
    pl.add_argument("--dtype", default="bf16", help="activations' dtype, and the kernels' FLOP rate (default bf16)")
    pl.add_argument("--weight-dtype", default=None, help="weights' dtype, e.g. fp8 (default: --dtype)")
    pl.add_argument("--kv-dtype", default=None, help="KV cache's dtype, e.g. fp8 (default: --dtype)")
    pl.add_argument("--tp", type=_count(1), default=None,
                    help="tensor parallel degree (default: search the divisors of the GPUs per node)")
    pl.add_argument("--max-nodes", type=_count(1), default=64, help="largest node count searched (default 64)")
    pl.add_argument("--mem-fraction", type=float, default=0.9,
                    help="fraction of device memory a configuration may use (default 0.9, as vLLM's "
                         "gpu_memory_utilization)")
    pl.add_argument("--eff-mem", type=float, default=None,
                    help="achievable fraction of HBM bandwidth, for every device (default: topologies/devices.yaml)")
    pl.add_argument("--eff-flops", type=float, default=None,
                    help="achievable fraction of peak FLOP/s, for every device (default: topologies/devices.yaml)")
    pl.add_argument("-o", "--out", default=None, metavar="PATH",
                    help="also write the plan: PATH.csv, PATH.json, or a folder (report.md, report.html, plan.csv)")
    pl.add_argument("--force", action="store_true", help=_FORCE_HELP)
    pl.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="what-if, e.g. --set topology_params.nic_bandwidth=800Gb/s or "
                         "--set devices.h100-sxm.eff_mem=0.8")
    ov = sub.add_parser("overlap", help="smallest per-rank shard at which ring prefill hides its transfers (by "
                                        "simulation), beside the Ring Attention paper's F/B")
    ov.add_argument("--model", required=True, help=f"model preset ({', '.join(PRESETS)}) or HEADS,KV_HEADS,HEAD_DIM")
    ov.add_argument("--topology", default="dgx-h100", help="preset or topology file (default dgx-h100)")
    ov.add_argument("--gpus", type=int, nargs="+", default=None, metavar="P",
                    help="ring sizes (default: 8 and every GPU of the topology)")
    ov.add_argument("--dtype", default="bf16", help="the attention's dtype (default bf16)")
    ov.add_argument("--set", dest="sets", action="append", default=[], metavar="PARAM=VALUE",
                    help="a parameter of a parametric preset, e.g. --set nodes=4")
    topo = sub.add_parser("topo", help="inspect topologies")
    topo_sub = topo.add_subparsers(dest="topo_verb", required=True, parser_class=_Parser)
    show = topo_sub.add_parser("show", help="print a summary of a preset or topology file")
    show.add_argument("topology", help="preset name (dgx-h100, ...) or a topology YAML path")
    show.add_argument("--set", dest="sets", action="append", default=[], metavar="PARAM=VALUE",
                      help="a parameter of a parametric preset, e.g. --set nodes=4")
    show.add_argument("--force", action="store_true", help=_FORCE_HELP)
    topo_sub.add_parser("list", help="list the preset topologies, with their description")
    _add_import_args(topo_sub.add_parser("import", help="write a topology YAML from nvidia-smi topo -m output or "
                                                        "NCCL topology XML dumps (one file per server)"))
    add_validate_args(sub.add_parser("validate", help="run the schedules for real (torch.distributed) and compare "
                                                      "with the simulator; writes DIR/validation.csv"))
    add_calibrate_args(sub.add_parser("calibrate", help="measure this machine with real ranks; write a topology"))
    return p


def _add_import_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE", help="nvidia-smi topo -m output or NCCL_TOPO_DUMP_FILE XML")
    p.add_argument("-o", "--out", required=True, help="topology YAML to write")
    p.add_argument("--nodes", type=int, default=None, help="servers (default: one per FILE)")
    p.add_argument("--fabric", default="rail", help=f"inter-node fabric: {', '.join(FABRICS)} (default rail)")
    p.add_argument("--name", default=None, help="topology name (default: the output file's stem)")
    p.add_argument("--device", default=None, help="GPU device spec (default: inferred from the file, and said so)")
    p.add_argument("--nvlink-gen", type=int, default=None, help="NVLink generation 1-5 (default: from the GPU)")
    p.add_argument("--pcie-bandwidth", default=None, help="PCIe links, when the file has no PCIe generation")
    p.add_argument("--nic-bandwidth", default=None, help="NIC port speed, e.g. 400Gb/s (default: the file's)")
    p.add_argument("--smp-bandwidth", default="40 GB/s", help="CPU socket to socket (default 40 GB/s, assumed)")
    p.add_argument("--nics", default=None, help="comma-separated NIC names joining the fabric (default: all)")


def _cmd_topo_import(args: argparse.Namespace) -> int:
    def bandwidth(value: str | None, flag: str) -> float | None:
        if value is None:
            return None
        try:
            bw = parse_bandwidth(value)
        except InputError as err:
            raise err.located(field=flag) from None
        if bw <= 0:
            raise InputError(f"must be positive, got {value!r}", field=flag)
        return bw

    opts = ImportOptions(device=args.device, nvlink_gen=args.nvlink_gen,
                         pcie_Bps=bandwidth(args.pcie_bandwidth, "--pcie-bandwidth"),
                         nic_Bps=bandwidth(args.nic_bandwidth, "--nic-bandwidth"),
                         smp_Bps=bandwidth(args.smp_bandwidth, "--smp-bandwidth") or 0.0,
                         nics=tuple(n.strip() for n in args.nics.split(",") if n.strip()) if args.nics else None)
    out = Path(args.out)
    text = import_topology(args.files, nodes=args.nodes, fabric_kind=args.fabric, name=args.name or out.stem,
                           opts=opts)
    write_text_atomic(out, text)
    print(f"wrote {out}")
    print(summarize(load_topology(str(out))))
    return 0


def _out_dir(arg: str | None, name: str) -> Path:
    out = Path(arg) if arg else Path("out") / name
    if out.exists() and not out.is_dir():
        raise InputError("output path exists and is not a folder", file=str(out), field="-o")
    return out


def _say(text: str = "") -> None:
    """Print to stdout; a reader that went away (``| head``) is not an error and the command goes on."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # later prints (and the exit's flush) go nowhere
        os.close(devnull)


def _cmd_run(args: argparse.Namespace) -> int:
    points = load_scenario(args.scenario, args.sets, args.force)
    out = _out_dir(args.out, points[0].scenario.name)
    _pick(points, args.timeline_point, "--timeline-point")
    prepared = check_points(points, args.numeric)
    if args.sets:
        base = load_scenario(args.scenario, force=args.force)[0]
        for note in _whatif_notes(base.scenario.topology, args.sets, dict(base.scenario.topology_params),
                                  base.base_dir):
            print(f"treering: note: {note}", file=sys.stderr)
    if args.resume:  # a damaged results.csv is refused before anything is written
        resumable_rows(out / "results.csv", len(points))
    check_output_dir(out)
    with output_lock(out):
        return _run_locked(args, points, prepared, out)


def _run_locked(args: argparse.Namespace, points: list[Point], prepared: list[PreparedPoint], out: Path) -> int:
    keep = None if args.no_report else args.timeline_point
    outcome = run_sweep(prepared, out, jobs=args.jobs, executor=args.executor, scheduler=args.scheduler,
                        resume=args.resume, progress=sys.stderr.isatty(), timeline_point=keep)
    frame = outcome.frame
    _say(format_table(frame))
    resumed = f", {outcome.resumed} resumed" if outcome.resumed else ""
    _say(f"\nwrote {out / 'results.csv'} and results.parquet ({len(frame)} rows, {len(points)} points{resumed})")
    if outcome.failed:
        print(f"treering: {outcome.failed} point(s) failed: see the error column of {out / 'results.csv'}",
              file=sys.stderr)
    if not args.no_report and "error" not in frame:
        prep = prepared[args.timeline_point]
        timeline = outcome.timeline  # from the sweep's own simulation; a resumed point is simulated again
        if timeline is None:
            timeline = timeline_frame(point_runs(prep))
        write_csv_atomic(timeline, out / TIMELINE_FILE)
        sc = prep.point.scenario
        meta: dict[str, Any] = {"scenario": sc.name, "source": args.scenario, "topology": _topology_label(points),
                "version": __version__, "command": shlex.join(["treering", *args.argv]),
                "timeline_point": prep.point.columns(), "capacity_bytes": _capacity(prepared),
                "baseline": sc.baseline or (prep.algorithms[0].label if prep.algorithms else None),
                "mem_fraction": sc.mem_fraction,
                **_report_meta(prep.point)}
        write_report(frame, out, meta, timeline, meta["capacity_bytes"])
        _say(f"wrote {out / 'report.md'} and {out / 'report.html'}")
    return 1 if outcome.failed else 0


def _report_meta(point: Point) -> dict[str, Any]:
    """Targets and scope for the report: target lines, and what the timeline of a ``scope: model`` point shows."""
    sc, meta = point.scenario, dict[str, Any]()
    if sc.targets.latency is not None:
        meta["targets"] = {"latency_s": sc.targets.latency}
    wl = sc.workload
    if wl.kind == "decode" and wl.scope == "model":
        meta["scope"] = "model"
        meta["layers"] = PRESETS[wl.model].layers if isinstance(wl.model, str) else None
    return meta


def _pick(points: list[Point], k: int, flag: str) -> Point:
    if not 0 <= k < len(points):
        raise InputError(f"must be between 0 and {len(points) - 1} (the sweep has {len(points)} points), got {k}",
                         field=flag)
    return points[k]


def _topology_label(points: list[Point]) -> str:
    """``dgx-h100; nodes: 1, 2, 4`` (each topology, then each parameter's values over the sweep)."""
    names = ", ".join(dict.fromkeys(p.scenario.topology for p in points))
    params: dict[str, list[Any]] = {}
    for p in points:
        for key, value in p.scenario.topology_params.items():
            params.setdefault(key, [])
            if value not in params[key]:
                params[key].append(value)
    return "; ".join([names, *(f"{k}: {', '.join(map(str, v))}" for k, v in params.items())])


def _capacity(prepared: list[PreparedPoint]) -> float | None:
    caps = {spec.mem_bytes for p in prepared for spec in p.cluster.specs.values()}
    return min(caps) if caps else None


def _cmd_schema(args: argparse.Namespace) -> int:
    if args.columns is None:
        _say(json.dumps(Scenario.model_json_schema(), indent=2))
        return 0
    if args.columns != "all" and args.columns not in KINDS:
        raise InputError(f"unknown workload kind {excerpt(args.columns)}; valid: {', '.join(KINDS)}", field="--columns")
    _say(columns_markdown({k: kind.columns for k, kind in KINDS.items() if args.columns in ("all", k)}))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    path = Path(args.results)
    if path.is_dir():
        path = path / "results.csv"
    if not path.is_file():
        raise InputError("no such results file", file=str(path))
    frame, meta, timeline = read_report_inputs(path)
    out = Path(args.out) if args.out else path.parent
    check_output_dir(out)
    with output_lock(out):
        write_report(frame, out, meta, timeline, meta.get("capacity_bytes"))
    _say(f"wrote {out / 'report.md'} and {out / 'report.html'}")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    if args.scenario is not None or args.ttft is not None:
        return cmd_plan_ttft(args, _say)
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
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir() \
            and Path(args.out).suffix not in (".csv", ".json"):
        raise InputError("exists and is not a folder (a report folder), a .csv or a .json", file=args.out, field="-o")
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if not algorithms:
        raise InputError(f"needs at least one algorithm name, got {excerpt(args.algorithms)}", field="--algorithms")
    req = PlanRequest(model=args.model, context=context, tbt_s=tbt, topology=args.topology,
                      algorithms=algorithms, batch=args.batch,
                      dtype=args.dtype, weight_dtype=args.weight_dtype, kv_dtype=args.kv_dtype, tp=args.tp,
                      max_nodes=args.max_nodes, mem_fraction=args.mem_fraction, eff_mem=args.eff_mem,
                      eff_flops=args.eff_flops, sets=args.sets, force=args.force)
    tty = sys.stderr.isatty()
    try:
        rows = plan(req, progress=(lambda line: print(f"\rplan: {line}\033[K", end="", file=sys.stderr))
                    if tty else None)
    except InputError as err:
        raise _plan_flag(err) from None
    if tty:
        print("\r\033[K", end="", file=sys.stderr)
    for note in _whatif_notes(args.topology, args.sets):
        print(f"treering: note: {note}", file=sys.stderr)
    table = plan_frame(rows, req)
    _say(f"{args.model}, context {req.context:,} tokens, target {tbt * 1e3:g} ms between tokens, on "
          f"{args.topology}, up to {req.max_nodes} nodes, memory fraction {req.mem_fraction:g}"
          + (f" ({', '.join(args.sets)})" if args.sets else ""))
    shown = table.drop(columns=["usable_mem_GB", "bottleneck", "evaluated"])
    with pd.option_context("display.width", 250, "display.max_colwidth", 200, "display.float_format",
                           "{:.4g}".format):
        _say(shown.to_string(index=False))
    if args.out:
        out = Path(args.out)
        if out.suffix not in (".csv", ".json"):  # a folder: the plan's report
            meta = {"model": args.model, "context": req.context, "target_s": tbt, "topology": args.topology,
                    "command": shlex.join(["treering", *args.argv]), "version": __version__,
                    "sets": list(args.sets), "mem_fraction": req.mem_fraction}
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


def _whatif_notes(topology: str, sets: Sequence[str], base_params: dict[str, Any] | None = None,
                  base_dir: Path | None = None) -> list[str]:
    """For each ``--set topology_params.X=V``: a note when it is capped by a slower link or changes no route
    (compared on two nodes of the topology, or on ``base_params``)."""
    notes = []
    params = dict(base_params if base_params is not None else {"nodes": 2})
    where = base_dir or Path.cwd()
    for item in sets:
        key, value = parse_set(item)
        if not key.startswith("topology_params.") or key == "topology_params.nodes":
            continue
        try:
            base = load_topology(topology, params, where)
            changed = load_topology(topology, {**params, key.removeprefix("topology_params."): value}, where)
        except InputError:
            continue  # the run itself reports bad parameters, located
        note = whatif_note(base, changed, f"--set {item}")
        if note:
            notes.append(note)
    return notes


def _cmd_trace(args: argparse.Namespace) -> int:
    points = load_scenario(args.scenario, args.sets, args.force)
    prep = prepare_point(_pick(points, args.point, "--point"))
    ranks = parse_ranks(args.ranks) if args.ranks is not None else None
    window = parse_window(args.window) if args.window is not None else None
    check_output_file(Path(args.out))
    runs = point_runs(prep, record_links=True)
    cluster = prep.cluster
    most = max((res.ranks for _, _, res in runs), default=0)
    if ranks is not None and max(ranks) >= most:
        raise InputError(f"rank {max(ranks)} is out of range: the point has {most} ranks (0-{most - 1})",
                         field="--ranks")
    meta = _report_meta(prep.point)
    note, suffix = None, ""
    if meta.get("scope") == "model":  # the runs are one layer's attention, not the whole step
        layers = meta.get("layers")
        suffix = f" (one attention layer{f' of {layers}' if layers else ''})"
        note = (f"scope: model; this trace shows ONE attention layer{f' of {layers}' if layers else ''} of the "
                "decode step, not the whole step (projections, MLP and LM head are not traced)")
    trace = chrome_trace([(lab + suffix, res, sched.placement_on(cluster.ranks)) for lab, sched, res in runs],
                         cluster, ranks, window, note)
    write_text_atomic(Path(args.out), json.dumps(trace))
    _say(f"wrote {args.out}: {len(trace['traceEvents'])} events ({', '.join(lab for lab, _, _ in runs)})")
    cut = describe_cut(trace["otherData"]["left_out"])
    if cut:
        _say(cut)
    if note:
        _say(f"note: {note}")
    return 0


def format_table(frame: pd.DataFrame) -> str:
    """The results as a terminal table (times in ms, bytes in MB for decode rows)."""
    shown = frame.drop(columns=[c for c in ("scenario", "events", "sim_wall_s", "point") if c in frame],
                       errors="ignore")
    twins = [c for i, c in enumerate(shown.columns) if "." in c
             and any(shown[c].astype(str).equals(shown[o].astype(str)) for o in shown.columns[:i])]
    shown = shown.drop(columns=twins)  # swept keys that repeat a stable column (nodes, context)
    if "latency_s" in shown:
        shown = shown.copy()
        for col in ("latency_s", "compute_s", "comm_s"):
            shown[col.replace("_s", "_ms")] = shown.pop(col) * 1e3
        for col in ("bytes_moved", "peak_mem_bytes"):
            shown[col.replace("_bytes", "").replace("bytes_", "") + "_MB"] = shown.pop(col) / 1e6
    with pd.option_context("display.max_rows", 500, "display.width", 200, "display.float_format", "{:.6g}".format):
        return shown.to_string(index=False)


def _cmd_topo(args: argparse.Namespace) -> int:
    if args.topo_verb == "list":
        for name in list_presets():
            print(f"{name:<14} {preset_description(name)}")
        return 0
    if args.topo_verb == "import":
        return _cmd_topo_import(args)
    params = dict(parse_set(s) for s in args.sets)
    cluster = load_topology(args.topology, params, Path.cwd(), args.force)
    _say(summarize(cluster))
    return 0


def _cmd_overlap(args: argparse.Namespace) -> int:
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


def _cmd_real(args: argparse.Namespace) -> int:
    """validate / calibrate: check the inputs here, then start the local ranks (rank 0 prints and writes)."""
    if args.verb == "validate" and args.nccl_tests:
        return _cmd_validate_nccl_tests(args)
    if args.verb == "calibrate" and args.from_nccl_tests:
        return calibrate_from_nccl_tests(args.from_nccl_tests, args.out, args.topology, args.hold_out, args.argv, _say)
    if args.procs < 1:
        raise InputError(f"must be at least 1, got {args.procs}", field="--procs")
    if args.verb == "validate":
        if not args.scenario:
            raise InputError("needs a scenario (real runs of its schedules) or --nccl-tests LOG (nccl-tests logs "
                             "against --topology)", field="validate")
        check_scenario(args)
        if args.topology:
            load_topology(args.topology)
    elif args.procs < 2:
        raise InputError(f"calibrate needs at least 2 ranks, got {args.procs}", field="--procs")
    else:
        if args.kernels_from:
            cluster = load_topology(args.kernels_from)
            if not cluster.ranks or not cluster.specs[cluster.ranks[0]].kernels:
                raise InputError("has no kernel profiles (kernels: under its device)", file=args.kernels_from,
                                 field="--kernels-from")
        for flag, dtypes in (("--kernel-dtypes", args.kernel_dtypes), ("--attend-rows", args.attend_rows or "")):
            for dtype in filter(None, dtypes.split(",")):
                if dtype not in ("fp32", "fp64", "bf16", "fp16"):
                    raise InputError(f"unknown dtype {dtype!r}; valid: fp32, fp64, bf16, fp16", field=flag)
        if args.attend_rows is not None:
            if args.kernels_from:
                raise InputError("profiles nothing with --kernels-from (its profiles are taken as they are)",
                                 field="--attend-rows")
            profiled = set(filter(None, args.kernel_dtypes.split(",")))
            for dtype in filter(None, args.attend_rows.split(",")):
                if dtype not in profiled:
                    raise InputError(f"{dtype} is not a profiled dtype (--kernel-dtypes {args.kernel_dtypes})",
                                     field="--attend-rows")
    try:
        with tempfile.TemporaryDirectory(prefix="treering-calibrate-") as tmp:
            # calibrate's rank 0 creates this file when its kernel profiles are done; the others sleep until then.
            # The profiles take what they take (slow where bf16 is emulated): --timeout counts from their end
            marker = Path(tmp) / "profiled"
            os.environ["TREERING_PROFILED_MARKER"] = str(marker)
            profiles = args.verb == "calibrate" and bool(args.kernel_dtypes)
            spawn(args.procs, list(args.argv), args.timeout, marker=marker if profiles else None)
    except RankFailure as err:
        print(f"treering: {args.verb} failed: {err}", file=sys.stderr)
        return 1
    return 0


def _cmd_validate_nccl_tests(args: argparse.Namespace) -> int:
    """nccl-tests logs against the simulator on ``--topology``: no ranks are started."""
    if not args.topology:
        raise InputError("--nccl-tests needs --topology: the cluster the logs were measured on", field="--topology")
    if args.scenario:
        raise InputError("give a scenario or --nccl-tests, not both", field="--nccl-tests")
    out = Path(args.out) if args.out else Path("out") / "nccl-tests-validation"
    check_output_dir(out)
    frame = validate_nccl_tests(args.nccl_tests, args.topology, args.sets)
    if not len(frame):
        raise InputError("no sizes to compare in the logs", file=args.nccl_tests[0], field="--nccl-tests")
    command = shlex.join(["treering", *args.argv])
    with output_lock(out):
        write_csv_atomic(frame, out / "nccl_validation.csv")
        write_text_atomic(out / "summary.md", nccl_summary(frame, command))
    shown = frame.drop(columns=["log", "measured_time_s", "predicted_time_s"])
    with pd.option_context("display.width", 250, "display.max_rows", 500, "display.float_format", "{:.4g}".format):
        _say(shown.to_string(index=False))
    _say("\n" + "\n".join(nccl_summary_lines(frame)))
    _say(f"wrote {out / 'nccl_validation.csv'} and {out / 'summary.md'}")
    return 0


VERBS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _cmd_run, "report": _cmd_report, "trace": _cmd_trace, "schema": _cmd_schema, "plan": _cmd_plan,
    "overlap": _cmd_overlap, "topo": _cmd_topo, "validate": _cmd_real, "calibrate": _cmd_real,
}  # every verb of the parser, and the function that runs it (returns the exit status)


def _leave_now(code: int) -> NoReturn:
    """End the process at once: what a run finished is already on disk (written atomically as points finish), and
    letting the interpreter free a large run's millions of ops on the way out would take seconds."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``treering`` with ``argv`` (default: the process's); returns the exit status (0, 1 failed points, 2 bad
    input, 130 interrupted)."""
    from_command_line = argv is None  # (callers that pass argv, tests among them, get the status returned)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    try:
        return VERBS[args.verb](args)
    except InputError as err:
        print(f"treering: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the disk filled up, a folder vanished mid-run: one line, not a traceback
        where = f"{err.filename}: " if err.filename else ""
        print(f"treering: error: {where}{err.strerror or err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("treering: interrupted (finished points are kept: run again with --resume)", file=sys.stderr)
        if from_command_line:
            _leave_now(130)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
