"""Arguments of ``treering validate`` / ``treering calibrate``, shared with ``python -m simulator.distributed``."""

from __future__ import annotations

import argparse

from simulator.distributed.measure import VISITS

__all__ = ["add_calibrate_args", "add_validate_args", "parser"]


def _common(p: argparse.ArgumentParser,
            timeout_help: str = "seconds: each rank's collective timeout, and the limit on the whole run") -> None:
    p.add_argument("--procs", type=int, default=2, help="local ranks to start (ignored under torchrun)")
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo",
                   help="gloo (CPU tensors) or nccl (one CUDA device per rank)")
    p.add_argument("--timeout", type=float, default=300.0, help=timeout_help)
    p.add_argument("--force", action="store_true",
                   help="take implausible values of a topology (a bandwidth or time far outside what hardware has) "
                        "as written, and run past the size limits")


def add_validate_args(p: argparse.ArgumentParser) -> None:
    """The options of ``treering validate``."""
    p.add_argument("scenario", nargs="?", default=None,
                   help="a decode, prefill or train scenario YAML (its schedules, or its training step, run for real); "
                        "omit with --nccl-tests")
    p.add_argument("--nccl-tests", dest="nccl_tests", action="append", default=[], metavar="LOG",
                   help="an nccl-tests output log (all_reduce_perf, ...): compare its bus bandwidth per size with the "
                        "simulator on --topology; no ranks are started (repeat for several logs)")
    _common(p)
    p.add_argument("--topology", default=None,
                   help="topology the prediction runs on (e.g. one written by treering calibrate); "
                        "default: the scenario's")
    p.add_argument("-o", "--out", default=None, help="output folder (default: out/<scenario name>-validation)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key of the scenario, as for run")
    p.add_argument("--iters", type=int, default=10, help="timed iterations per point (median is reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first")
    p.add_argument("--collectives", choices=["native", "decomposed"], default="native",
                   help="native: one dist.all_reduce per collective; decomposed: the schedule's own sends "
                        "(prefill schedules always run decomposed)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random q, K, V and of --random's shapes (default 0)")
    p.add_argument("--random", type=int, default=None, metavar="N",
                   help="validate N random shapes instead of the scenario's workload (decode: batch 1-8, heads "
                        "1-32, head_dim off the calibration grid, contexts 1k-200k, fp32/fp64/bf16; prefill: batch "
                        "1-2, heads 2-16, sequences 1k-8k, any layout, forward or training); the scenario gives the "
                        "topology and algorithms")
    p.add_argument("--max-kv-bytes", dest="max_kv_bytes", default="512 MiB",
                   help="--random: a draw whose KV cache (all ranks; prefill: a rank's largest score block) exceeds "
                        "this gets a shorter context (default 512 MiB)")
    p.add_argument("--no-drift", dest="no_drift", action="store_true",
                   help="do not time a profiled kernel point before each algorithm's runs (the 'drift' column: the "
                        "machine's speed now against the topology's calibration; each probe takes up to a few "
                        "seconds, within --timeout)")
    p.add_argument("--inject-fault", type=int, default=None, metavar="RANK",
                   help="testing aid: this rank raises an error at its first op")


def add_calibrate_args(p: argparse.ArgumentParser) -> None:
    """The options of ``treering calibrate``."""
    _common(p, "seconds: each rank's collective timeout, and the limit on the run once rank 0's kernel profiles are "
               "done (they take what they take, up to 12 times this: minutes on a CPU, more where bf16 is emulated)")
    p.set_defaults(timeout=600.0)
    p.add_argument("-o", "--out", required=True, help="topology YAML to write")
    p.add_argument("--heads", type=int, default=16, help="attention shape of the compute measurement")
    p.add_argument("--head-dim", type=int, default=128, help="head dimension of the compute measurement")
    p.add_argument("--reps", type=int, default=15, help="repetitions per measured size (median)")
    p.add_argument("--kernel-dtypes", dest="kernel_dtypes", default="fp32,fp64,bf16",
                   help="dtypes whose kernels are profiled over shapes (comma-separated; empty: none, the kernels "
                        "stay on the roofline)")
    p.add_argument("--attend-rows", dest="attend_rows", default=None,
                   help="dtypes (of --kernel-dtypes) whose attend kernel is profiled over rows too (batch x KV "
                        "heads: 1, 4, 16, 64; kv_bytes up to 64 MiB, group 1, 2, 4, ..., 32): where the time of the "
                        "same bytes depends on how they split into rows (bf16 emulated on a CPU: up to 4x); the "
                        "others are timed at 4 rows and taken as not depending on them. Its groups are powers of "
                        "two: a dtype whose time steps with the group in tiles (fp32, fp64 on a CPU BLAS) loses the "
                        "tile pricing that its every-group grid gives (comma-separated, of --kernel-dtypes; empty: "
                        "none, the default)")
    p.add_argument("--kernels-from", dest="kernels_from", default=None, metavar="TOPOLOGY",
                   help="take the kernel profiles of this earlier calibration of the same machine instead of "
                        "measuring them again (timed on one rank, with min(its --procs, CPUs) copies of each kernel "
                        "running at once)")
    p.add_argument("--kernel-grid", dest="kernel_grid", choices=["full", "quick"], default="full",
                   help="full: kv_bytes 32 KiB-256 MiB x head_dim 32-256 x group 1-8, 16, 32 (a few minutes per "
                        "dtype on two cores), bf16 on CPU ranks (emulated: no tile in its group, slow) kv_bytes up "
                        "to 64 MiB x head_dim 32-256 x group 1, 2, 4, ..., 32; quick: kv_bytes up to 2 MiB, "
                        "head_dim 32 and 128, group 1 and 4 (a smoke test); the dtypes of --attend-rows add rows to "
                        "theirs (--attend-rows)")
    p.add_argument("--max-ci", dest="max_ci", type=float, default=0.5,
                   help="refuse to write the profiles if any point's median is known less precisely than this "
                        "(half-width of its 95 %% confidence interval over the median; default 0.5)")
    p.add_argument("--visits", type=_positive_int, default=VISITS,
                   help="visits of every profiled point, spread over the profiling in new random orders, their runs "
                        "pooled (a shared machine's speed moves for seconds to minutes: more visits, steadier "
                        f"profiles, longer calibrations; 1: each point timed once, to its full budget; default "
                        f"{VISITS})")
    p.add_argument("--min-r2", dest="min_r2", type=float, default=0.9,
                   help="refuse to write the topology if the ping-pong fit's R^2 is below this (default 0.9)")
    p.add_argument("--from-nccl-tests", dest="from_nccl_tests", action="append", default=[], metavar="LOG",
                   help="fit the topology's bandwidths and NCCL's protocol latencies to nccl-tests logs instead of "
                        "measuring (no ranks are started; repeat for several logs)")
    p.add_argument("--topology", default=None,
                   help="with --from-nccl-tests: the base topology (preset or file; default: inferred from the log)")
    p.add_argument("--hold-out", dest="hold_out", default="every-other",
                   help="with --from-nccl-tests: what the held-out check leaves out of its fit: every-other (size), "
                        "a collective's name, or none")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    """The parser the ranks use to read the launcher's command line."""
    p = argparse.ArgumentParser(prog="python -m simulator.distributed")
    sub = p.add_subparsers(dest="verb", required=True)
    add_validate_args(sub.add_parser("validate"))
    add_calibrate_args(sub.add_parser("calibrate"))
    return p
