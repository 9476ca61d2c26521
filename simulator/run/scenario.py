"""Scenario YAML -> validated pydantic models -> sweep points (one cell of the sweep each).

Validation happens once, here, with located errors (``file:line: field: message``). A sweep is the cartesian
product of ``sweep:`` axes, whose keys are dotted paths into the scenario (``topology_params.nodes``,
``workload.context``); ``zip:`` lists groups of axes that vary together (equal lengths), each group one axis of
the product. ``--set key=value`` overrides apply before the sweep expands.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import json
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, ValidationError, field_validator

from simulator.errors import InputError, excerpt
from simulator.run.whatif_models import Cost, FaultEntry, Variability
from simulator.support.limits import check_sweep
from simulator.support.yaml_lines import LineDict, LineList, line_of, load_yaml, parse_set
from simulator.units import parse_time
from simulator.workloads.base import ModelShape, Scalar, Strict, scalar, unit_value
from simulator.workloads.collective import CollectiveWorkload
from simulator.workloads.decode import DecodeWorkload
from simulator.workloads.flows import FlowSpec, FlowsWorkload
from simulator.workloads.generate import GenerateWorkload
from simulator.workloads.prefill import PrefillWorkload
from simulator.workloads.train import TrainWorkload

__all__ = ["DecodeWorkload", "DeviceOverride", "FlowSpec", "FlowsWorkload", "ModelShape", "Point", "Scenario",
           "Targets", "Workload", "expand", "load_scenario", "parse_set", "scenario_points"]

# the workload kinds' models, told apart by ``kind`` (a new kind: one member more here, and one in run.kinds.KINDS)
Workload = Annotated[DecodeWorkload | FlowsWorkload | CollectiveWorkload | PrefillWorkload | GenerateWorkload
                     | TrainWorkload,
                     Field(discriminator="kind")]


class DeviceOverride(Strict):
    """What a scenario changes in a named device spec: its roofline efficiencies (fractions in (0, 1])."""

    eff_mem: float | None = Field(None, gt=0, le=1, description="achievable fraction of the memory bandwidth")
    eff_flops: float | None = Field(None, gt=0, le=1, description="achievable fraction of the peak FLOP/s")
    attention_eff: dict[Literal["forward", "backward"], Annotated[float, Field(gt=0, le=1)]] | None = Field(
        None, alias="attention_efficiency", description=(
            "fraction of peak FLOP/s the prefill attention kernels reach, {forward: f, backward: b} (measured on "
            "your kernels, e.g. with benchmarks/gpu_kernels.py)"))


class Targets(Strict):
    """What the scenario must meet; reports draw it and say where it is met. Times need a unit (``50 ms``)."""

    latency: float | None = Field(None, description="decode step latency target, e.g. '50 ms'")

    @field_validator("latency", mode="before")
    @classmethod
    def _time(cls, v: Any) -> float | None:
        if v is None:
            return None
        if not isinstance(v, str):
            raise ValueError(f"give a unit, e.g. '{v} ms', got {v!r}")
        x = unit_value(parse_time, v)
        if x <= 0:
            raise ValueError(f"must be positive, got {v!r}")
        return x


def _algorithm(v: Any) -> str | dict[str, Any]:
    """An algorithm entry: a name, or ``{name: NAME, param: value, ...}`` with plain values."""
    if isinstance(v, str) and 0 < len(v) <= 100:
        return v
    if isinstance(v, Mapping) and all(isinstance(k, str) for k in v):
        return {k: scalar(x) for k, x in v.items()}
    raise ValueError(f"must be an algorithm name or {{name: NAME, parameter: value}}, got {excerpt(v)}")


AlgorithmEntry = Annotated[Any, AfterValidator(_algorithm)]


class Scenario(Strict):
    """A scenario file (docs/scenarios.md; docs/architecture.md for where it goes)."""

    name: str = Field(description="a plain name: the default output folder is out/NAME")
    topology: str = Field(max_length=4096, description="preset name in topologies/ or a path to a topology YAML")
    topology_params: dict[str, Scalar] = Field(default_factory=dict, max_length=100)
    devices: dict[str, DeviceOverride] = Field(default_factory=dict, max_length=100, description=(
        "device spec name -> efficiencies that replace the spec's, e.g. {h100-sxm: {eff_mem: 0.8}}"))
    mem_fraction: float = Field(0.9, gt=0, le=1, description=(
        "fraction of each device's memory a point may use before it is out of memory (the rest is the runtime's,"
        " activations', fragmentation's; vLLM's gpu_memory_utilization defaults to 0.9)"))
    workload: Workload
    algorithms: list[AlgorithmEntry] = Field(default_factory=lambda: ["ring", "tree"], min_length=1, max_length=100)
    baseline: str | None = Field(None, max_length=200, description=(
        "the algorithm (its result label, e.g. ring or ring[overlap=False]) that reports measure speedups against; "
        "default: the first of algorithms"))
    sweep: dict[str, Any] = Field(default_factory=dict, max_length=100, description=(
        "dotted key -> list of values (cartesian product); zip: [{key: [...], key2: [...]}] varies keys together"))
    targets: Targets = Field(default_factory=lambda: Targets(latency=None),
                             description="optional targets, e.g. {latency: 50 ms}")
    faults: list[FaultEntry] | None = Field(None, max_length=100, description=(
        "what is wrong with the cluster (docs/whatifs.md): [{device: n3.gpu5, slowdown: 1.1}, {link: n2.nic0-*, "
        "bandwidth_factor: 0.5}, {link: spine0-*, down: true}, {node: n7, down: true}]"))
    variability: Variability | None = Field(None, description=(
        "run-to-run variability (docs/whatifs.md): {kernel_cv: 0.03, link_cv: 0.05, seed: 1, trials: 100}"))
    cost: Cost | None = Field(None, description=(
        "what the GPUs cost (docs/whatifs.md): {offer: aws-p5-on-demand} (topologies/prices.yaml), "
        "{usd_per_gpu_hour: 2.5} or {owned: {usd_per_gpu, years, tdp_watts, pue, usd_per_kwh}}"))

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        """The name becomes a folder under out/: no path separators, no '.' or '..', no control characters."""
        if (not v or len(v) > 100 or v in (".", "..") or v.startswith(".")
                or any(c in "/\\" or not c.isprintable() for c in v)):
            raise ValueError(f"must be a plain name (1-100 printable characters, no / or \\, not starting with "
                             f"'.'), got {excerpt(v)}")
        return v


_Origin = tuple[str, "int | None"]


@dataclass(frozen=True, eq=False)
class Point:
    """One cell of a sweep: the validated scenario with that cell's values, and the swept values."""

    scenario: Scenario
    swept: tuple[tuple[str, Any], ...]
    source: str
    base_dir: Path
    tree: Any = None  # the cell's YAML tree (with lines), to locate errors found after validation
    origins: Mapping[str, _Origin] | None = None
    force: bool = False  # build it even over the size limits of simulator.support.limits (--force)

    def columns(self) -> dict[str, Any]:
        """The swept values as result columns: scalars as they are, lists and mappings as compact JSON."""
        return {k: v if scalar_or_none(v) else json.dumps(v, separators=(",", ":"), default=str)
                for k, v in self.swept}

    def locate(self, err: InputError) -> InputError:
        """Locate an error whose ``field`` is a dotted path of this scenario (file and line of that key)."""
        if self.swept:
            where = ", ".join(f"{k}={v if isinstance(v, str) and len(v) <= 60 else excerpt(v)}" for k, v in self.swept)
            err = InputError(f"{err.message} (sweep point {where})", file=err.file, line=err.line, field=err.field)
        if err.file is not None or not err.field:
            return err
        for dotted, (file, line) in (self.origins or {}).items():
            if err.field == dotted or err.field.startswith(dotted + "."):
                return err.located(file=file, line=line)
        parts = tuple(int(p) if p.isdigit() else p for p in err.field.split("."))
        return err.located(file=self.source, line=line_of(self.tree, parts))


# -- loading ------------------------------------------------------------------------------------------------------

def scalar_or_none(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _set_path(tree: Any, dotted: str, value: Any, origin: _Origin, origins: dict[str, _Origin]) -> None:
    parts = dotted.split(".")
    cur = tree
    for i, part in enumerate(parts[:-1]):
        key: Any = int(part) if isinstance(cur, list) and part.isdigit() else part
        try:
            nxt = cur[key]
        except (KeyError, IndexError, TypeError):
            nxt = None
        if not isinstance(nxt, (dict, list)):
            if not isinstance(cur, dict):
                raise InputError(f"cannot set {dotted!r}: {'.'.join(parts[: i + 1])} is not a mapping",
                                 file=origin[0], line=origin[1], field=dotted)
            nxt = LineDict()
            nxt.lines = {}
            cur[key] = nxt
        cur = nxt
    last: Any = int(parts[-1]) if isinstance(cur, list) and parts[-1].isdigit() else parts[-1]
    if isinstance(cur, list) and not (isinstance(last, int) and last < len(cur)):
        raise InputError(f"index {parts[-1]} out of range", file=origin[0], line=origin[1], field=dotted)
    if not isinstance(cur, (dict, list)):
        raise InputError(f"cannot set {dotted!r}", file=origin[0], line=origin[1], field=dotted)
    cur[last] = value
    origins[dotted] = origin


def _model_at(loc: Sequence[Any]) -> type[BaseModel] | None:
    """The scenario model that holds the key at ``loc`` (pydantic's location: union tags and mapping keys
    included), or None when it is not a model's key."""
    model: type[BaseModel] = Scenario
    parts = list(loc[:-1])
    while parts:
        field = model.model_fields.get(parts.pop(0))
        if field is None:
            return None
        annotation = field.annotation
        if typing.get_origin(annotation) is dict and parts:  # a mapping's key (devices: {NAME: ...})
            annotation = typing.get_args(annotation)[1]
            parts.pop(0)
        members = [t for t in _flat_args(annotation) if isinstance(t, type) and issubclass(t, BaseModel)]
        if len(members) > 1 and parts:  # a tagged union: the next part is the tag (workload kinds)
            tagged = [m for m in members if parts[0] in typing.get_args(m.model_fields["kind"].annotation)]
            if tagged:
                members = tagged
                parts.pop(0)
        if len(members) != 1:
            return None
        model = members[0]
        if parts and isinstance(parts[0], str) and ("[" in parts[0] or parts[0] == model.__name__):
            parts.pop(0)  # the name pydantic gives a union's member (ModelShape, function-after[...])
        if parts and isinstance(parts[0], int):
            parts.pop(0)  # a list's item (faults: [...])
    return model


def _flat_args(annotation: Any) -> list[Any]:
    args = typing.get_args(annotation)
    if not args:
        return [annotation]
    return [t for a in args for t in _flat_args(a)]


def _unknown_key(loc: Sequence[Any]) -> str:
    """``unknown key; did you mean context?`` (the closest valid key, by difflib), or the valid keys."""
    model = _model_at(loc)
    if model is None:
        return "unknown key"
    valid = [f.alias or name for name, f in model.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
    return f"unknown key; did you mean {close[0]}?" if close else f"unknown key; valid keys: {', '.join(valid)}"


def _validate(tree: Any, source: str, origins: Mapping[str, _Origin]) -> Scenario:
    try:
        return Scenario.model_validate(tree)
    except ValidationError as exc:
        errors = exc.errors()
        # an unknown key first: a misspelt key also makes the key it meant missing ("contxt" -> context missing)
        err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc = tuple(err["loc"])
        if loc[:1] == ("workload",) and len(loc) > 1 and loc[1] in ("decode", "flows", "collective", "prefill",
                                                                    "generate", "train"):
            loc = (loc[0], *loc[2:])  # drop pydantic's discriminator tag
        # and the names of union members (``ModelShape``, ``str``, ``function-after[...]``), which are not keys
        loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in ("ModelShape", "str", "int"))))
        field = ".".join(str(p) for p in loc)
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "union_tag_invalid":
            loc = (*loc, "kind")
            field = ".".join(str(p) for p in loc)
            msg = f"must be one of {err['ctx']['expected_tags']}, got {excerpt(err['ctx']['tag'])}"
        elif err["type"] == "extra_forbidden":
            msg = _unknown_key(tuple(err["loc"]))
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "too_short":
            msg = "must not be empty"
        elif err["type"] == "too_long":
            msg = f"too many items (at most {err.get('ctx', {}).get('max_length')})"
        elif ((err["type"] == "greater_than" and err.get("ctx", {}).get("gt") == 0)
              or (err["type"] == "greater_than_equal" and err.get("ctx", {}).get("ge") == 1)):
            msg = f"must be a positive integer, got {excerpt(err['input'])}"
        elif err["type"] in ("greater_than_equal", "less_than_equal") and isinstance(err["input"], int):
            bound = err.get("ctx", {}).get("ge", err.get("ctx", {}).get("le"))
            msg = f"must be {'at least' if err['type'] == 'greater_than_equal' else 'at most'} {bound}, got " \
                  f"{excerpt(err['input'])}"
        elif err["type"] in ("int_parsing", "int_type", "int_from_float"):
            msg = f"must be an integer, got {excerpt(err['input'])}"
        elif err["type"] == "literal_error":
            msg = f"must be one of {err['ctx']['expected']}, got {excerpt(err['input'])}"
        elif "input" in err and not isinstance(err["input"], (dict, list)) and excerpt(err["input"]) not in msg:
            msg = f"{msg}, got {excerpt(err['input'])}"
        for dotted, (file, line) in origins.items():
            if field == dotted or field.startswith(dotted + "."):
                raise InputError(msg, file=file, line=line, field=field) from None
        raise InputError(msg, file=source, line=line_of(tree, loc), field=field) from None


def load_scenario(path: str | Path, overrides: Sequence[str] = (), force: bool = False) -> list[Point]:
    """Load, override, validate and expand a scenario file into sweep points (``force``: past the size limits)."""
    source = str(path)
    tree = load_yaml(path)
    if not isinstance(tree, dict):
        raise InputError("a scenario file must be a mapping", file=source, line=1)
    return scenario_points(tree, source, Path(source).resolve().parent, overrides, force)


def scenario_points(tree: dict[str, Any], source: str, base_dir: Path, overrides: Sequence[str] = (),
                    force: bool = False) -> list[Point]:
    """Override, validate and expand a scenario given as a mapping (from a file, or built by a command)."""
    origins: dict[str, _Origin] = {}
    for item in overrides:
        key, value = parse_set(item)
        _set_path(tree, key, value, ("--set", None), origins)
    base = _validate(tree, source, origins)
    return expand(tree, base, source, base_dir, origins, force)


_Axis = list[tuple[str, list[Any], tuple[Any, ...]]]  # keys varying together: (key, values, YAML path)


def _axes(sweep: Mapping[str, Any], tree: Any, source: str, origins: Mapping[str, _Origin]) -> list[_Axis]:
    """The sweep's axes: one per plain key, one per ``zip`` group (its keys vary together)."""
    def fail(path: tuple[Any, ...], msg: str) -> InputError:
        file, line = origins.get("sweep", (source, line_of(tree, path)))
        return InputError(msg, file=file, line=line, field=".".join(str(p) for p in path))

    axes: list[_Axis] = []
    for key, values in sweep.items():
        if key == "zip":
            if not isinstance(values, list) or not values:
                raise fail(("sweep", "zip"), "must be a list of groups {key: [values], ...}")
            for i, group in enumerate(values):
                if not isinstance(group, Mapping) or not group:
                    raise fail(("sweep", "zip", i), "a zip group must map keys to lists of values")
                axis = [(k, v, ("sweep", "zip", i, k)) for k, v in group.items()]
                lengths = {len(v) if isinstance(v, list) else -1 for _, v, _ in axis}
                if -1 in lengths or len(lengths) != 1 or 0 in lengths:
                    sizes = ", ".join(f"{k}: {len(v) if isinstance(v, list) else 'not a list'}" for k, v, _ in axis)
                    raise fail(("sweep", "zip", i), f"keys that vary together need non-empty lists of one length "
                                                     f"({sizes})")
                axes.append(axis)
            continue
        if not isinstance(values, list) or not values:
            raise fail(("sweep", key), "a sweep axis needs a non-empty list of values")
        axes.append([(key, values, ("sweep", key))])
    seen: dict[str, tuple[Any, ...]] = {}
    for axis in axes:
        for key, _, path in axis:
            if not isinstance(key, str) or not key or len(key) > 200:
                raise fail(path, f"a swept key must be a dotted path such as workload.context, got {excerpt(key)}")
            if key in ("sweep", "name") or key.startswith("sweep."):
                raise fail(path, "this key cannot be swept")
            if key in seen:
                raise fail(path, f"swept twice (also at {'.'.join(map(str, seen[key]))})")
            seen[key] = path
    return axes


def expand(tree: Any, base: Scenario, source: str, base_dir: Path,
           origins: Mapping[str, _Origin] | None = None, force: bool = False) -> list[Point]:
    """The product of ``base.sweep``'s axes; each cell re-validated with its values and their YAML lines."""
    origins = dict(origins or {})
    if not base.sweep:
        return [Point(base, (), source, base_dir, tree, origins, force)]
    axes = _axes(base.sweep, tree, source, origins)
    try:
        check_sweep(math.prod(len(axis[0][1]) for axis in axes), force)
    except InputError as err:
        file, line = origins.get("sweep", (source, line_of(tree, ("sweep",))))
        raise err.located(file=file, line=line) from None
    # each cell is copied from the tree without its sweep (a long axis copied into every cell, only to be dropped)
    template = copy.copy(tree)
    template["sweep"] = {}
    points = []
    for combo in itertools.product(*(range(len(axis[0][1])) for axis in axes)):
        cell = copy.deepcopy(template)
        cell_origins = dict(origins)
        swept = []
        for axis, idx in zip(axes, combo, strict=True):
            for key, values, path in axis:
                node = _node(tree, path)
                line = node.lines.get(idx) if isinstance(node, LineList) else None
                _set_path(cell, key, copy.deepcopy(values[idx]), (source, line or line_of(tree, path)), cell_origins)
                swept.append((key, values[idx]))
        cell["sweep"] = {}
        scenario = _validate(cell, source, cell_origins)
        points.append(Point(scenario, tuple(swept), source, base_dir, cell, cell_origins, force))
    return points


def _node(tree: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        try:
            tree = tree[key]
        except (KeyError, IndexError, TypeError):
            return None
    return tree
