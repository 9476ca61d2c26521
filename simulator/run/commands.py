"""The run room's verbs: ``treering run`` (a scenario or sweep: a table, results files, a report), ``report`` (a
results file's report, again) and ``trace`` (a Perfetto trace of one point); ``schema`` is
:mod:`simulator.run.schema`'s."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from simulator import __version__
from simulator.cluster.bottleneck import whatif_note
from simulator.cluster.topology import load_topology
from simulator.engine.warmup import load_compiled
from simulator.errors import InputError
from simulator.models.presets import PRESETS
from simulator.report.labels import printed_table
from simulator.report.pages import TIMELINE_FILE, start_report, write_report
from simulator.report.read import read_report_inputs, resumable_rows
from simulator.report.render import Drawer
from simulator.report.timeline import timeline_frame
from simulator.report.trace import chrome_trace, describe_cut, parse_ranks, parse_window
from simulator.run.prepare import check_points, point_runs, prepare_point
from simulator.run.prepared import PreparedPoint
from simulator.run.resolved import header, resolved
from simulator.run.scenario import Point, load_scenario
from simulator.run.sweep import run_sweep
from simulator.support.console import say
from simulator.support.files import write_csv_atomic, write_text_atomic
from simulator.support.outdir import check_output_file, claim_output_dir
from simulator.support.yaml_lines import parse_set

__all__ = ["cmd_report", "cmd_run", "cmd_trace", "format_table", "whatif_notes"]


def _out_dir(arg: str | None, name: str) -> Path:
    out = Path(arg) if arg else Path("out") / name
    if out.exists() and not out.is_dir():
        raise InputError("output path exists and is not a folder", file=str(out), field="-o")
    return out


def cmd_run(args: argparse.Namespace) -> int:
    """The scenario read, then the output folder checked and locked before any preparation (a second run into the
    same folder is refused at once), a resumed results.csv checked, every point prepared, the resolved values said
    (stderr, one line), and the sweep run."""
    points = load_scenario(args.scenario, args.sets, args.force)
    out = _out_dir(args.out, points[0].scenario.name)
    _pick(points, args.timeline_point, "--timeline-point")
    with claim_output_dir(out):
        if args.resume:  # a damaged results.csv is refused before anything is written
            resumable_rows(out / "results.csv", len(points), lambda note: print(f"treering: note: {note}",
                                                                                 file=sys.stderr))
        # the report's figures: a process that loads matplotlib now, on another CPU, and draws them at the end
        drawer = None if args.no_report else Drawer.start()
        try:
            # the compiled code first: preparing a point routes its cluster, which would otherwise compile the
            # router here, alone, before the engine's parallel warm-up (a fresh install's first run: 52 s, not 30)
            load_compiled()
            prepared = check_points(points, args.numeric)
            if args.sets:
                base = load_scenario(args.scenario, force=args.force)[0]
                for note in whatif_notes(base.scenario.topology, args.sets, dict(base.scenario.topology_params),
                                          base.base_dir):
                    print(f"treering: note: {note}", file=sys.stderr)
            values = resolved(prepared)
            print(f"treering: {points[0].scenario.name}: {len(points)} point(s); {header(values)}", file=sys.stderr)
            return _run_locked(args, points, prepared, out, values, drawer)
        finally:
            if drawer is not None:
                drawer.close()


def _run_locked(args: argparse.Namespace, points: list[Point], prepared: list[PreparedPoint], out: Path,
                values: dict[str, Any], drawer: Drawer | None = None) -> int:
    keep = None if args.no_report else args.timeline_point
    outcome = run_sweep(prepared, out, jobs=args.jobs, executor=args.executor, scheduler=args.scheduler,
                        resume=args.resume, progress=sys.stderr.isatty(), timeline_point=keep)
    frame = outcome.frame
    say(format_table(frame))
    resumed = f", {outcome.resumed} resumed" if outcome.resumed else ""
    say(f"\nwrote {out / 'results.csv'} and results.parquet ({len(frame)} rows, {len(points)} points{resumed})")
    if outcome.failed:
        print(f"treering: {outcome.failed} point(s) failed: see the error column of {out / 'results.csv'}",
              file=sys.stderr)
    if not args.no_report and "error" not in frame:
        prep = prepared[args.timeline_point]
        timeline = outcome.timeline  # from the sweep's own simulation; a resumed point is simulated again
        if timeline is None:
            timeline = timeline_frame(point_runs(prep))
        sc = prep.point.scenario
        meta: dict[str, Any] = {"scenario": sc.name, "source": args.scenario, "topology": _topology_label(points),
                "version": __version__, "command": shlex.join(["treering", *args.argv]),
                "timeline_point": prep.point.columns(), "capacity_bytes": _capacity(prepared),
                "baseline": sc.baseline or (prep.algorithms[0].label if prep.algorithms else None),
                "mem_fraction": sc.mem_fraction, "resolved": values,
                **_report_meta(prep.point)}
        finish = start_report(frame, out, meta, timeline, meta["capacity_bytes"], drawer=drawer)
        write_csv_atomic(timeline, out / TIMELINE_FILE)  # while the figures are drawn
        finish()
        say(f"wrote {out / 'report.md'} and {out / 'report.html'}")
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


def cmd_report(args: argparse.Namespace) -> int:
    path = Path(args.results)
    if path.is_dir():
        path = path / "results.csv"
    if not path.is_file():
        raise InputError("no such results file", file=str(path))
    out = Path(args.out) if args.out else path.parent
    with claim_output_dir(out):
        frame, meta, timeline = read_report_inputs(path)
        write_report(frame, out, meta, timeline, meta.get("capacity_bytes"),
                     results=Path(os.path.relpath(path.resolve(), out.resolve())).as_posix())
    say(f"wrote {out / 'report.md'} and {out / 'report.html'}")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    points = load_scenario(args.scenario, args.sets, args.force)
    point = _pick(points, args.point, "--point")
    ranks = parse_ranks(args.ranks) if args.ranks is not None else None
    window = parse_window(args.window) if args.window is not None else None
    check_output_file(Path(args.out))  # before any preparation
    load_compiled()  # in parallel processes on a fresh install (preparing routes the cluster)
    prep = prepare_point(point)
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
    say(f"wrote {args.out}: {len(trace['traceEvents'])} events ({', '.join(lab for lab, _, _ in runs)})")
    cut = describe_cut(trace["otherData"]["left_out"])
    if cut:
        say(cut)
    if note:
        say(f"note: {note}")
    return 0


def format_table(frame: pd.DataFrame) -> str:
    """The results as a terminal table (:func:`simulator.report.labels.printed_table`: times in ms, sizes in GB,
    plain numbers, no column twice)."""
    return printed_table(frame)


def whatif_notes(topology: str, sets: Sequence[str], base_params: dict[str, Any] | None = None,
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
