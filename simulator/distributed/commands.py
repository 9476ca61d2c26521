"""``treering validate`` and ``treering calibrate``: the inputs checked in this process, then the local ranks started
(rank 0 prints and writes); ``validate --nccl-tests`` and ``calibrate --from-nccl-tests`` compare with or fit to
nccl-tests logs without starting ranks. (No torch here: the ranks import it.)"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from pathlib import Path

import pandas as pd

from simulator.cluster.topology import load_topology
from simulator.distributed.checks import check_scenario
from simulator.distributed.launch import RankFailure, spawn
from simulator.errors import InputError
from simulator.nccl.calibrate import calibrate_from_nccl_tests
from simulator.nccl.validate import summarize as nccl_summary
from simulator.nccl.validate import summary_lines as nccl_summary_lines
from simulator.nccl.validate import validate_nccl_tests
from simulator.support.console import say
from simulator.support.files import write_csv_atomic, write_text_atomic
from simulator.support.outdir import claim_output_dir

__all__ = ["cmd_real"]


def cmd_real(args: argparse.Namespace) -> int:
    """validate / calibrate: check the inputs here, then start the local ranks (rank 0 prints and writes)."""
    if args.verb == "validate" and args.nccl_tests:
        return _cmd_validate_nccl_tests(args)
    if args.verb == "calibrate" and args.from_nccl_tests:
        return calibrate_from_nccl_tests(args.from_nccl_tests, args.out, args.topology, args.hold_out, args.argv, say,
                                         force=args.force)
    if args.procs < 1:
        raise InputError(f"must be at least 1, got {args.procs}", field="--procs")
    if args.verb == "validate":
        if not args.scenario:
            raise InputError("needs a scenario (real runs of its schedules) or --nccl-tests LOG (nccl-tests logs "
                             "against --topology)", field="validate")
        check_scenario(args)
        if args.topology:
            load_topology(args.topology, force=args.force)
    elif args.procs < 2:
        raise InputError(f"calibrate needs at least 2 ranks, got {args.procs}", field="--procs")
    else:
        if args.kernels_from:
            cluster = load_topology(args.kernels_from, force=args.force)
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
    with claim_output_dir(out):  # a folder this command creates is removed again when it is refused
        frame = validate_nccl_tests(args.nccl_tests, args.topology, args.sets, force=args.force)
        if not len(frame):
            raise InputError("no sizes to compare in the logs", file=args.nccl_tests[0], field="--nccl-tests")
        command = shlex.join(["treering", *args.argv])
        write_csv_atomic(frame, out / "nccl_validation.csv")
        write_text_atomic(out / "summary.md", nccl_summary(frame, command))
    shown = frame.drop(columns=["log", "measured_time_s", "predicted_time_s"])
    with pd.option_context("display.width", 250, "display.max_rows", 500, "display.float_format", "{:.4g}".format):
        say(shown.to_string(index=False))
    say("\n" + "\n".join(nccl_summary_lines(frame)))
    say(f"wrote {out / 'nccl_validation.csv'} and {out / 'summary.md'}")
    return 0
