"""``treering calibrate --from-nccl-tests LOG... -o topology.yaml [--topology BASE] [--hold-out every-other]``.

Reads the logs, sizes the base topology to their rank count, first checks the model on data it was not fitted on
(fit on part of the sizes, report the error on the rest, :func:`simulator.nccl.fit.split`), then fits on every size
and writes the topology (atomically; nothing is written when the fit is refused). Prints the fit quality per
collective and size, the parameters (start and fitted) and the held-out check.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from simulator.nccl.fit import Fit, base_topology, fit_logs, read_samples
from simulator.nccl.quality import HOLD_OUT, check_fit, quality, scores, split
from simulator.nccl.render import render_fitted
from simulator.support.files import write_text_atomic
from simulator.support.outdir import check_output_file

__all__ = ["calibrate_from_nccl_tests"]


def _value(kind: str, x: float) -> str:
    return f"{x / 1e9:.4g} GB/s" if kind == "bandwidth" else f"{x * 1e6:.4g} us"


def parameter_lines(fit: Fit) -> list[str]:
    """One line per parameter: start -> fitted, or held and why."""
    out = []
    for p in fit.params:
        v = fit.values[p.name]
        what = {"intra_bandwidth": "every link inside a server", "inter_bandwidth": "every link leaving a server"}
        proto, _, hw = p.name.partition(".")
        label = what.get(p.name) or f"{proto} per-hop latency, {hw} (ring; tree alike)"
        if p.name in fit.held:
            out.append(f"{p.name}: {_value(p.kind, v)} held ({label}): {fit.held[p.name]}")
        else:
            out.append(f"{p.name}: {_value(p.kind, p.start)} -> {_value(p.kind, v)} (x{v / p.start:.3g}; {label})")
    return out


def score_line(name: str, sc: dict[str, float]) -> str:
    return (f"{name}: {int(sc['sizes'])} sizes, |error| of the bus bandwidth median {sc['median']:.1f} %, "
            f"max {sc['max']:.1f} %, R^2 of log time {sc['r2']:.4f}")


def calibrate_from_nccl_tests(logs: Sequence[str], out: str, topology: str | None, hold_out: str = HOLD_OUT,
                              argv: Sequence[str] = (), say: Callable[[str], None] = print, force: bool = False
                              ) -> int:
    """The command (module docstring); :class:`simulator.errors.InputError` on bad input or a refused fit."""
    path = Path(out)
    check_output_file(path)
    samples, runs = read_samples(logs)
    base, how = base_topology(logs, runs, topology, force)
    train, test = split(samples, hold_out)
    lines = [f"base topology: {how}"]
    check = ""
    if test:
        trial = fit_logs(base, train)
        frame = pd.concat([quality(trial.cluster, train, "fit"), quality(trial.cluster, test, "held out")])
        check = score_line(f"held-out check ({hold_out}: fitted on {len(train)} sizes, checked on the other "
                           f"{len(test)})", scores(frame[frame["part"] == "held out"]))
    fit = fit_logs(base, samples)
    frame = quality(fit.cluster, samples, "fit")
    shown = frame.drop(columns=["log", "measured_time_s", "fitted_time_s", "part"])
    with pd.option_context("display.width", 250, "display.max_rows", 500, "display.float_format", "{:.4g}".format):
        say(shown.to_string(index=False))
    sc = check_fit(frame, samples[0])
    lines += parameter_lines(fit)
    lines.append(score_line("fit", sc))
    if check:
        lines.append(check)
    say("\n" + "\n".join(lines))
    command = shlex.join(["treering", *argv]) if argv else "treering calibrate --from-nccl-tests"
    comments = [f"Written by `{command}`",
                "from nccl-tests logs: " + ", ".join(f"{r.source}:{r.line} ({r.collective}, {r.ranks} ranks, "
                                                     f"{len(r.rows)} sizes)" for r in runs),
                "Fitted with the simulator's own collective model (auto: NCCL's choice; the engine) by least squares",
                f"on log time ({fit.simulations} collectives simulated). Parameters, start -> fitted:",
                *(f"  {line}" for line in lines),
                "Only bandwidths and the hop latencies above were fitted; everything else is the base topology's."]
    write_text_atomic(path, render_fitted(fit.cluster, comments))
    say(f"wrote {path}")
    return 0
