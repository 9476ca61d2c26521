"""``treering sensitivity``: one input varied at a time around a scenario's point, and what moves the answer.

``--vary KEY=V1,V2,...`` names an input and its values. ``KEY`` is a dotted key of the scenario
(``workload.context``, ``topology_params.nic_bandwidth``, ``devices.h100-sxm.eff_mem``) or a short name: a
parameter of the scenario's parametric topology (``nic_bandwidth`` -> ``topology_params.nic_bandwidth``), a
device efficiency (``eff_mem``, ``eff_flops`` -> ``devices.SPEC.KEY`` for every GPU spec of the cluster), or a
workload key (``context`` -> ``workload.context``). A value is written as in the scenario (``0.8``, ``800 GB/s``,
``128K``) or relative to the base value, ``0.5x`` (a quantity keeps its unit: ``400 Gb/s`` x 0.5 is ``25 GB/s``; a
count is rounded to an integer). The base value of a key the scenario does not set is its default: the preset's
parameter, the device spec's efficiency.

Every variation is one point (the base with that one key changed), checked before any runs; each point's rows
give the outcome (``--metric``, default ``latency_s``, ``time_s`` for collectives) per algorithm. The report room
draws the tornado chart and says whether the ranking of the algorithms ever flips
(:mod:`simulator.report.sensitivity`).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.errors import InputError, excerpt
from simulator.run.prepare import check_points, simulate_point
from simulator.run.prepared import cluster_for
from simulator.run.scenario import Point, load_scenario
from simulator.support.console import say
from simulator.support.outdir import claim_output_dir
from simulator.support.paths import TOPOLOGY_DIR
from simulator.support.yaml_lines import load_yaml, load_yaml_text
from simulator.units import format_quantity, parse_quantity, parse_tokens

__all__ = ["MAX_VARIATIONS", "Variation", "cmd_sensitivity", "parse_vary", "run_sensitivity"]

MAX_VARIATIONS = 200  # points one sensitivity run simulates (the base included)
_FACTOR = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*x\s*$")
_KINDS = ("bandwidth", "time", "bytes", "flops")


@dataclass(frozen=True)
class Variation:
    """One point of the analysis: which input (its key as given, and its dotted paths), the value as written."""

    key: str
    paths: tuple[str, ...]
    label: str
    value: Any


def parse_vary(item: str) -> tuple[str, list[str]]:
    """``KEY=V1,V2`` -> (KEY, [V1, V2])."""
    key, sep, values = item.partition("=")
    parts = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not key.strip() or not parts:
        raise InputError(f"expected KEY=V1,V2,... (e.g. nic_bandwidth=0.5x,2x), got {excerpt(item)}", field="--vary")
    return key.strip(), parts


def _lookup(tree: Any, dotted: str) -> Any:
    cur = tree
    for part in dotted.split("."):
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        else:
            return None
    return cur


def _paths(key: str, base: Point) -> tuple[str, ...]:
    """The dotted scenario keys a ``--vary`` key names (module docstring)."""
    if "." in key:
        return (key,)
    sc = base.scenario
    if key in ("eff_mem", "eff_flops"):
        cluster = cluster_for(base)
        return tuple(f"devices.{name}.{key}" for name in sorted({cluster.specs[r].name for r in cluster.ranks}))
    preset = _preset_params(base)
    if key in preset or key in sc.topology_params:
        return (f"topology_params.{key}",)
    if key in type(sc.workload).model_fields:
        return (f"workload.{key}",)
    valid = sorted({*preset, "eff_mem", "eff_flops", *type(sc.workload).model_fields} - {"kind"})
    raise InputError(f"unknown input {excerpt(key)}: give a dotted scenario key or one of {', '.join(valid)}",
                     field="--vary")


def _preset_params(base: Point) -> dict[str, Any]:
    """The parameters (with their defaults) of the base's parametric topology; {} for an explicit one (or a file
    that cannot be read: loading the base point has said why)."""
    ref = base.scenario.topology
    path = Path(ref) if ref.endswith((".yaml", ".yml")) or "/" in ref else TOPOLOGY_DIR / f"{ref}.yaml"
    if not path.is_absolute() and not path.exists():
        path = base.base_dir / path
    try:
        raw = load_yaml(path)
    except InputError:
        return {}
    params = raw.get("params") if isinstance(raw, Mapping) else None
    return dict(params) if isinstance(params, Mapping) and "builder" in raw else {}


def _base_value(path: str, base: Point) -> Any:
    value = _lookup(base.tree, path)
    if value is not None:
        return value
    parts = path.split(".")
    if parts[0] == "topology_params":
        return _preset_params(base).get(parts[1])
    if parts[0] == "devices" and len(parts) == 3:
        cluster = cluster_for(base)
        spec = next(s for s in cluster.specs.values() if s.name == parts[1])
        return getattr(spec, parts[2], None)
    if parts[0] == "workload":
        return getattr(base.scenario.workload, parts[1], None)
    return None


def _scaled(base: Any, factor: float, key: str) -> Any:
    """``base`` times ``factor``, written as ``base`` was: a count stays an integer, a quantity keeps its unit kind,
    a token count (``128K``) becomes an integer."""
    if isinstance(base, bool) or base is None:
        raise InputError(f"{key} has no numeric base value ({excerpt(base)}) to scale; give values", field="--vary")
    if isinstance(base, int):
        return max(1, round(base * factor))
    if isinstance(base, float):
        return base * factor
    if isinstance(base, str):
        for kind in _KINDS:
            try:
                return format_quantity(parse_quantity(base, kind) * factor, kind)
            except (InputError, ValueError):
                continue
        try:
            return max(1, round(parse_tokens(base) * factor))
        except (InputError, ValueError):
            pass
    raise InputError(f"cannot scale {key}'s base value {excerpt(base)}; give values", field="--vary")


def variations(specs: Sequence[tuple[str, list[str]]], base: Point) -> list[Variation]:
    """Every variation of ``specs`` around ``base`` (refused past :data:`MAX_VARIATIONS`)."""
    out = []
    for key, values in specs:
        paths = _paths(key, base)
        for text in values:
            m = _FACTOR.match(text)
            if m:
                factor = float(m.group(1))
                if not 0 < factor < math.inf:
                    raise InputError(f"a factor must be positive, got {excerpt(text)}", field="--vary")
                value = [_scaled(_base_value(p, base), factor, key) for p in paths]
            else:
                value = [load_yaml_text(text, "--vary")] * len(paths)
            out.append(Variation(key, paths, text, value))
    if len(out) + 1 > MAX_VARIATIONS:
        raise InputError(f"{len(out) + 1} points (limit {MAX_VARIATIONS})", field="--vary")
    return out


def run_sensitivity(scenario: str | Path, vary: Sequence[str], sets: Sequence[str] = (), metric: str | None = None,
                    force: bool = False) -> tuple[list[dict[str, Any]], str]:
    """The base point's rows and each variation's, as records ``{key, value, algorithm, METRIC}`` (key ``base`` for
    the base), and the metric's name."""
    (base, *more) = load_scenario(scenario, sets, force)
    if more or base.swept:
        raise InputError("sensitivity varies one point: give a scenario without a sweep (or --set 'sweep={}')",
                         field="sweep")
    runs = variations([parse_vary(v) for v in vary], base)
    points = [base]
    for var in runs:
        overrides = [*sets, *(f"{p}={_yaml(v)}" for p, v in zip(var.paths, var.value, strict=True))]
        try:
            (point,) = load_scenario(scenario, overrides, force)
        except InputError as err:
            raise InputError(f"{var.key}={var.label}: {err}", field="--vary") from None
        points.append(point)
    prepared = check_points(points)
    records: list[dict[str, Any]] = []
    for i, prep in enumerate(prepared):
        rows = simulate_point(prep).rows
        name = metric or ("time_s" if prep.kind == "collective" else "latency_s")
        for row in rows:
            if name not in row:
                raise InputError(f"the rows have no column {name!r}", field="--metric")
            key, label = ("base", "base") if i == 0 else (runs[i - 1].key, runs[i - 1].label)
            records.append({"key": key, "value": label, "algorithm": row["algorithm"], "metric": name,
                            "outcome": float(row[name])})
    return records, metric or ("time_s" if prepared[0].kind == "collective" else "latency_s")


def _yaml(value: Any) -> str:
    return value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)


def cmd_sensitivity(args: argparse.Namespace) -> int:
    """``treering sensitivity SCENARIO --vary KEY=V1,V2 ...``: the records, the tornado chart and the conclusions
    written to the output folder (``sensitivity.csv``, ``sensitivity.md``, ``tornado.png``)."""
    import pandas as pd

    from simulator.report.sensitivity import write_sensitivity

    name = load_scenario(args.scenario, args.sets, args.force)[0].scenario.name
    out = Path(args.out) if args.out else Path("out") / f"{name}-sensitivity"
    with claim_output_dir(out):  # checked and locked before anything runs
        records, metric = run_sensitivity(args.scenario, args.vary, args.sets, args.metric, args.force)
        frame = pd.DataFrame.from_records(records)
        text = write_sensitivity(frame, metric, out, name)
    say(text)
    print(f"treering: wrote {out / 'sensitivity.csv'}, {out / 'sensitivity.md'} and {out / 'tornado.png'}",
          file=sys.stderr)
    return 0
