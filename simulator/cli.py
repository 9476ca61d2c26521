"""``treering``: the command line. Errors in user input print one line and exit with status 2.

This module only parses: each verb's implementation lives in the room it belongs to (:data:`VERBS`) and is
imported when that verb runs, so that ``treering --help`` starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from simulator import __version__
from simulator.cluster.hostgraph import FABRICS
from simulator.distributed.cli_args import add_calibrate_args, add_validate_args
from simulator.errors import InputError, excerpt
from simulator.models.presets import PRESETS
from simulator.support.paths import DEFAULT_SCENARIO

__all__ = ["VERBS", "main"]


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


_FORCE_HELP = ("run work that is over the size limits (sweep points, topology, schedule ops) anyway, and take "
               "implausible values (a bandwidth or time far outside what hardware has) as written")


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
    run.add_argument("--executor", default="process", choices=("process", "dask"),
                     help="process (a local pool) or dask")
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
                        help="print the result columns (name, unit, meaning) of one workload kind (decode, prefill, "
                             "generate, collective, flows, train), or of all")
    pl = sub.add_parser("plan", help="smallest cluster whose decode step meets a time-between-tokens target, or "
                                     "whose prefill (generate) meets a time-to-first-token target (SCENARIO --ttft)")
    pl.add_argument("scenario", nargs="?", default=None,
                    help="with --ttft: a prefill or generate scenario (its topology family, model, prompt)")
    pl.add_argument("--ttft", default=None, help="time-to-first-token target with its unit, e.g. 2s (needs SCENARIO)")
    pl.add_argument("--model", default=None, help=f"model preset: {', '.join(PRESETS)} (decode plan)")
    pl.add_argument("--context", default=None, help="tokens of context: 1048576, 128K, 1M (K = 1024) (decode plan)")
    pl.add_argument("--tbt", default=None, help="time-between-tokens target with its unit, e.g. 50ms")
    pl.add_argument("--topology", default="dgx-h100", help="parametric preset or topology file (default dgx-h100); "
                                                           "with --objective cost, several, comma-separated")
    pl.add_argument("--objective", default="gpus", choices=("gpus", "cost"),
                    help="gpus: the fewest GPUs meeting the target (default); cost: the cheapest across --topology's "
                         "presets, each priced at an offer of topologies/prices.yaml (docs/whatifs.md)")
    pl.add_argument("--offers", default=None, metavar="NAME,...",
                    help="--objective cost: the offers pricing the topologies' GPUs (default: the cheapest listed "
                         "for each device)")
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
    pl.add_argument("--train", action="store_true", help="plan a training step: the fastest TP x CP x PP x DP layout "
                                                         "(--model --sequence --global-batch --gpus; docs/training.md)")
    pl.add_argument("--sequence", default=None, help="--train: tokens per sequence, e.g. 128K")
    pl.add_argument("--global-batch", default=None, help="--train: tokens per step, e.g. 16M")
    pl.add_argument("--gpus", type=_count(1), default=None, help="--train: the GPUs, whole servers")
    pl.add_argument("--max-gpus", type=_count(1), default=None,
                    help="--train: search whole servers doubling up to this many GPUs (instead of --gpus)")
    pl.add_argument("--step-time", default=None, help="--train with --max-gpus: the fewest GPUs meeting this step "
                                                      "time, e.g. 30s")
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
    sens = sub.add_parser("sensitivity", help="vary one input at a time around a scenario's point: a tornado chart "
                                              "and whether the ranking of the algorithms flips (docs/whatifs.md)")
    sens.add_argument("scenario", help="scenario YAML (one point: no sweep)")
    sens.add_argument("--vary", action="append", required=True, metavar="KEY=V1,V2",
                      help="an input and its values, e.g. nic_bandwidth=0.5x,2x or eff_mem=0.8,1.0 (repeatable)")
    sens.add_argument("--metric", default=None, help="the outcome column (default: latency_s; collectives: time_s)")
    sens.add_argument("-o", "--out", default=None, help="output folder (default: out/<scenario name>-sensitivity)")
    sens.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                      help="override a dotted key of the scenario first")
    sens.add_argument("--force", action="store_true", help=_FORCE_HELP)
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
    p.add_argument("--force", action="store_true",
                   help="take implausible bandwidths (given or read from the files) as written, and import past the "
                        "size limits")


VERBS: dict[str, str] = {
    "run": "simulator.run.commands:cmd_run", "report": "simulator.run.commands:cmd_report",
    "trace": "simulator.run.commands:cmd_trace", "schema": "simulator.run.schema:cmd_schema",
    "plan": "simulator.plan.cli:cmd_plan", "overlap": "simulator.plan.cli:cmd_overlap",
    "topo": "simulator.cluster.commands:cmd_topo", "validate": "simulator.distributed.commands:cmd_real",
    "calibrate": "simulator.distributed.commands:cmd_real",
    "sensitivity": "simulator.run.sensitivity:cmd_sensitivity",
}  # every verb of the parser, and the function that runs it (returns the exit status), imported when it runs


def verb(name: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs verb ``name``."""
    module, _, function = VERBS[name].partition(":")
    run: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), function)
    return run


def _leave_now(code: int) -> NoReturn:
    """End the process at once: what a run finished is already on disk (written atomically as points finish), and
    letting the interpreter free a large run's millions of ops on the way out would take seconds."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone (``| head``), a stream closed
            stream.flush()
    os._exit(code)


_QUICK_EXIT = frozenset({"run", "report", "trace", "schema", "topo"})  # verbs that end by _leave when done


def _leave(code: int) -> NoReturn:
    """End a finished verb: its exit handlers run (a pool's, a library's), then :func:`_leave_now`, without the
    interpreter's teardown (a last full collection and every module freed: 0.3-0.5 s after a run, for nothing)."""
    atexit._run_exitfuncs()
    _leave_now(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``treering`` with ``argv`` (default: the process's); returns the exit status (0, 1 failed points, 2 bad
    input, 130 interrupted).

    From the command line (``argv`` None), the verb's modules are imported with the cyclic collector paused and
    then frozen (they live as long as the process: no collection walks them again), and a verb of
    :data:`_QUICK_EXIT` that returns with no other thread running ends the process at once (:func:`_leave`)."""
    from_command_line = argv is None  # (callers that pass argv, tests among them, get the status returned)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    code = _dispatch(args, from_command_line)
    if from_command_line and args.verb in _QUICK_EXIT:
        import threading  # (not loaded for --help)

        if threading.active_count() == 1:
            _leave(code)
    return code


def _dispatch(args: argparse.Namespace, from_command_line: bool) -> int:
    try:
        if from_command_line:
            gc.disable()  # the verb's modules: imported without collections, then out of every later one's way
            try:
                run = verb(args.verb)
            finally:
                gc.freeze()
                gc.enable()
        else:
            run = verb(args.verb)
        return run(args)
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
