"""``treering``: the command line. Errors in user input print one line and exit with status 2."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd

from simulator import __version__
from simulator.cluster.summary import summarize
from simulator.cluster.topology import load_topology
from simulator.distributed.checks import check_scenario
from simulator.distributed.cli_args import add_calibrate_args, add_validate_args
from simulator.distributed.launch import RankFailure, spawn
from simulator.errors import InputError
from simulator.files import write_csv_atomic, write_text_atomic
from simulator.models import PRESETS
from simulator.paths import DEFAULT_SCENARIO
from simulator.plan import PlanRequest, parse_tokens, plan
from simulator.points import check_points, cluster_for, point_runs
from simulator.report.pages import META_FILE, TIMELINE_FILE, write_report
from simulator.report.timeline import timeline_frame
from simulator.report.trace import chrome_trace, describe_cut, parse_ranks, parse_window
from simulator.scenario import Point, Scenario, load_scenario, parse_set
from simulator.sweep import run_sweep
from simulator.units import parse_time

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="treering", description="Ring vs Tree attention on simulated GPU clusters.")
    sub = p.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run a scenario or sweep; print a table; write DIR/results.csv")
    run.add_argument("scenario", nargs="?", default=str(DEFAULT_SCENARIO),
                     help="scenario YAML (default: the embedded quickstart)")
    run.add_argument("-o", "--out", default=None, help="output folder (default: out/<scenario name>)")
    run.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                     help="override a dotted key of the scenario, e.g. --set topology_params.nodes=4")
    run.add_argument("--numeric", action="store_true",
                     help="also execute each schedule on random arrays and report max_abs_err against dense attention")
    run.add_argument("--timeline-point", type=int, default=0, metavar="K",
                     help="sweep point (0-based) whose per-rank timeline the report draws (default 0)")
    run.add_argument("--no-report", action="store_true", help="write results.csv only")
    run.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                     help="points simulated at once (default: the CPUs); 1 runs in this process")
    run.add_argument("--executor", default="process", help="process (a local pool) or dask")
    run.add_argument("--scheduler", default=None, metavar="ADDRESS",
                     help="a Dask scheduler (tcp://host:8786); without it --executor dask starts a local cluster")
    run.add_argument("--resume", action="store_true",
                     help="keep the finished points of DIR/results.csv and run only the others")
    rep = sub.add_parser("report", help="(re)write the report of a results.csv: report.md, report.html, figures")
    rep.add_argument("results", help="a results.csv written by treering run (or its folder)")
    rep.add_argument("-o", "--out", default=None, help="output folder (default: the results' folder)")
    trace = sub.add_parser("trace", help="Chrome/Perfetto trace of one sweep point (ranks and link utilisation)")
    trace.add_argument("scenario")
    trace.add_argument("--point", type=int, default=0, metavar="K", help="sweep point, 0-based (default 0)")
    trace.add_argument("-o", "--out", required=True, help="trace JSON to write")
    trace.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    trace.add_argument("--ranks", default=None, metavar="LIST",
                       help="ranks to show, e.g. 0-7,12 (default: all up to 64; beyond, the critical rank and a "
                            "sample)")
    trace.add_argument("--window", default=None, metavar="START:END",
                       help="simulated time to show, e.g. 0:2ms or 1ms: (default: all of it)")
    sub.add_parser("schema", help="print the JSON Schema of scenario files (for editors)")
    pl = sub.add_parser("plan", help="smallest cluster whose decode step meets a time-between-tokens target")
    pl.add_argument("--model", required=True, help=f"model preset: {', '.join(PRESETS)}")
    pl.add_argument("--context", required=True, help="tokens of context: 1048576, 128K, 1M (K = 1024)")
    pl.add_argument("--tbt", required=True, help="time-between-tokens target, e.g. 50ms")
    pl.add_argument("--topology", default="dgx-h100", help="preset or topology file (default dgx-h100)")
    pl.add_argument("--algorithms", default="ring,tree,tree-p2p", help="comma-separated (default ring,tree,tree-p2p)")
    pl.add_argument("--batch", type=int, default=1)
    pl.add_argument("--dtype", default="bf16")
    pl.add_argument("--tp", type=int, default=None, help="tensor parallel degree (default: GPUs per node)")
    pl.add_argument("--max-nodes", type=int, default=64)
    pl.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="what-if, e.g. --set topology_params.nic_bandwidth=800Gb/s")
    topo = sub.add_parser("topo", help="inspect topologies")
    topo_sub = topo.add_subparsers(dest="topo_verb", required=True, parser_class=_Parser)
    show = topo_sub.add_parser("show", help="print a summary of a preset or topology file")
    show.add_argument("topology", help="preset name (dgx-h100, ...) or a topology YAML path")
    show.add_argument("--set", dest="sets", action="append", default=[], metavar="PARAM=VALUE",
                      help="a parameter of a parametric preset, e.g. --set nodes=4")
    add_validate_args(sub.add_parser("validate", help="run the schedules for real (torch.distributed) and compare "
                                                      "with the simulator; writes DIR/validation.csv"))
    add_calibrate_args(sub.add_parser("calibrate", help="measure this machine with real ranks; write a topology"))
    return p


def _out_dir(arg: str | None, name: str) -> Path:
    out = Path(arg) if arg else Path("out") / name
    if out.exists() and not out.is_dir():
        raise InputError("output path exists and is not a folder", file=str(out), field="-o")
    return out


def _cmd_run(args: argparse.Namespace) -> int:
    points = load_scenario(args.scenario, args.sets)
    out = _out_dir(args.out, points[0].scenario.name)
    point = _pick(points, args.timeline_point, "--timeline-point")
    if args.jobs < 1:
        raise InputError(f"must be at least 1, got {args.jobs}", field="--jobs")
    check_points(points, args.numeric)
    outcome = run_sweep(points, out, jobs=args.jobs, executor=args.executor, scheduler=args.scheduler,
                        resume=args.resume, numeric=args.numeric, progress=sys.stderr.isatty())
    frame = outcome.frame
    print(format_table(frame))
    resumed = f", {outcome.resumed} resumed" if outcome.resumed else ""
    print(f"\nwrote {out / 'results.csv'} and results.parquet ({len(frame)} rows, {len(points)} points{resumed})")
    if outcome.failed:
        print(f"treering: {outcome.failed} point(s) failed: see the error column of {out / 'results.csv'}",
              file=sys.stderr)
    if not args.no_report and "error" not in frame:
        timeline = timeline_frame(point_runs(point))
        write_csv_atomic(timeline, out / TIMELINE_FILE)
        sc = point.scenario
        meta: dict[str, Any] = {"scenario": sc.name, "source": args.scenario, "topology": _topology_label(points),
                "version": __version__, "command": shlex.join(["treering", *args.argv]),
                "timeline_point": dict(point.swept), "capacity_bytes": _capacity(points)}
        write_report(frame, out, meta, timeline, meta["capacity_bytes"])
        print(f"wrote {out / 'report.md'} and {out / 'report.html'}")
    return 1 if outcome.failed else 0


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


def _capacity(points: list[Point]) -> float | None:
    caps = {spec.mem_bytes for p in points for spec in cluster_for(p).specs.values()}
    return min(caps) if caps else None


def _cmd_report(args: argparse.Namespace) -> int:
    path = Path(args.results)
    if path.is_dir():
        path = path / "results.csv"
    if not path.is_file():
        raise InputError("no such results file", file=str(path))
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read results: {err}", file=str(path)) from None
    meta_path, timeline_path = path.parent / META_FILE, path.parent / TIMELINE_FILE
    meta: dict[str, Any] = (json.loads(meta_path.read_text()) if meta_path.exists()
                            else {"scenario": path.parent.name, "command": "(unknown: no meta.json beside it)"})
    timeline = pd.read_csv(timeline_path) if timeline_path.exists() else None
    out = Path(args.out) if args.out else path.parent
    write_report(frame, out, meta, timeline, meta.get("capacity_bytes"))
    print(f"wrote {out / 'report.md'} and {out / 'report.html'}")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    if args.model not in PRESETS:
        raise InputError(f"unknown model preset {args.model!r}; presets: {', '.join(PRESETS)}", field="--model")
    tbt = parse_time(args.tbt.replace("ms", " ms").replace("us", " us")) if isinstance(args.tbt, str) else args.tbt
    if tbt <= 0:
        raise InputError(f"must be positive, got {args.tbt!r}", field="--tbt")
    req = PlanRequest(model=args.model, context=parse_tokens(args.context), tbt_s=tbt, topology=args.topology,
                      algorithms=[a.strip() for a in args.algorithms.split(",") if a.strip()], batch=args.batch,
                      dtype=args.dtype, tp=args.tp, max_nodes=args.max_nodes, sets=args.sets)
    table = plan(req)
    print(f"{args.model}, context {req.context:,} tokens, target {tbt * 1e3:g} ms between tokens, "
          f"on {args.topology}" + (f" ({', '.join(args.sets)})" if args.sets else ""))
    with pd.option_context("display.width", 200, "display.float_format", "{:.4g}".format):
        print(table.to_string(index=False))
    return 0


def _cmd_trace(args: argparse.Namespace) -> int:
    points = load_scenario(args.scenario, args.sets)
    point = _pick(points, args.point, "--point")
    ranks = parse_ranks(args.ranks) if args.ranks is not None else None
    window = parse_window(args.window) if args.window is not None else None
    runs = point_runs(point, record_links=True)
    cluster = cluster_for(point)
    most = max((res.ranks for _, _, res in runs), default=0)
    if ranks is not None and max(ranks) >= most:
        raise InputError(f"rank {max(ranks)} is out of range: the point has {most} ranks (0-{most - 1})",
                         field="--ranks")
    trace = chrome_trace([(lab, res, sched.placement_on(cluster.ranks)) for lab, sched, res in runs], cluster,
                         ranks, window)
    write_text_atomic(Path(args.out), json.dumps(trace))
    print(f"wrote {args.out}: {len(trace['traceEvents'])} events ({', '.join(lab for lab, _, _ in runs)})")
    cut = describe_cut(trace["otherData"]["left_out"])
    if cut:
        print(cut)
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
    params = dict(parse_set(s) for s in args.sets)
    cluster = load_topology(args.topology, params, Path.cwd())
    print(summarize(cluster))
    return 0


def _cmd_real(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """validate / calibrate: check the inputs here, then start the local ranks (rank 0 prints and writes)."""
    if args.procs < 1:
        raise InputError(f"must be at least 1, got {args.procs}", field="--procs")
    if args.verb == "validate":
        check_scenario(args)
        if args.topology:
            load_topology(args.topology)
    elif args.procs < 2:
        raise InputError(f"calibrate needs at least 2 ranks, got {args.procs}", field="--procs")
    try:
        spawn(args.procs, list(argv), args.timeout)
    except RankFailure as err:
        print(f"treering: {args.verb} failed: {err}", file=sys.stderr)
        return 1
    return 0


def _leave_now(code: int) -> NoReturn:
    """End the process at once: what a run finished is already on disk (written atomically as points finish), and
    letting the interpreter free a large run's millions of ops on the way out would take seconds."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    from_command_line = argv is None  # (callers that pass argv, tests among them, get the status returned)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    try:
        if args.verb == "run":
            return _cmd_run(args)
        if args.verb in ("validate", "calibrate"):
            return _cmd_real(args, argv)
        if args.verb == "schema":
            print(json.dumps(Scenario.model_json_schema(), indent=2))
            return 0
        if args.verb == "report":
            return _cmd_report(args)
        if args.verb == "plan":
            return _cmd_plan(args)
        if args.verb == "trace":
            return _cmd_trace(args)
        return _cmd_topo(args)
    except InputError as err:
        print(f"treering: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("treering: interrupted", file=sys.stderr)
        if from_command_line:
            _leave_now(130)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
