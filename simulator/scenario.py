"""Scenario YAML -> validated pydantic models -> sweep points (one cell of the sweep each).

Validation happens once, here, with located errors (``file:line: field: message``). A sweep is the cartesian
product of ``sweep:`` axes, whose keys are dotted paths into the scenario (``topology_params.nodes``,
``workload.context``); ``--set key=value`` overrides apply before the sweep expands.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from simulator.errors import InputError
from simulator.units import parse_bytes, parse_time
from simulator.yamlio import LineDict, LineList, line_of, load_yaml

__all__ = ["DecodeWorkload", "FlowSpec", "FlowsWorkload", "ModelShape", "Point", "Scenario", "expand", "load_scenario",
           "parse_set"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FlowSpec(_Strict):
    """One transfer of the ``flows`` workload: ``bytes`` from ``src`` to ``dst`` starting at ``start``."""

    src: str
    dst: str
    bytes: float = Field(description="payload, e.g. 1e9 or '1 GB'")
    start: float = Field(0.0, description="start time, e.g. 0 or '2 us'")

    @field_validator("bytes", mode="before")
    @classmethod
    def _bytes(cls, v: Any) -> float:
        return _unit(parse_bytes, v)

    @field_validator("start", mode="before")
    @classmethod
    def _start(cls, v: Any) -> float:
        return _unit(parse_time, v)


class FlowsWorkload(_Strict):
    """The network model on its own: one result row per flow."""

    kind: Literal["flows"]
    flows: list[FlowSpec] = Field(min_length=1)


class ModelShape(_Strict):
    """Attention shape: ``heads`` query heads of ``head_dim``; ``kv_heads`` (GQA) defaults to ``heads``."""

    heads: PositiveInt
    head_dim: PositiveInt
    kv_heads: PositiveInt | None = None

    @model_validator(mode="after")
    def _gqa(self) -> ModelShape:
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return self


class DecodeWorkload(_Strict):
    """One decode step: ``batch`` query tokens attend to ``context`` cached tokens sharded over every GPU."""

    kind: Literal["decode"]
    model: ModelShape
    batch: PositiveInt = 1
    context: PositiveInt
    dtype: Literal["fp64", "fp32", "bf16", "fp16", "fp8"] = "bf16"


Workload = Annotated[DecodeWorkload | FlowsWorkload, Field(discriminator="kind")]


class Scenario(_Strict):
    """A scenario file (design.md, "Scenario YAML")."""

    name: str
    topology: str = Field(description="preset name in topologies/ or a path to a topology YAML")
    topology_params: dict[str, Any] = Field(default_factory=dict)
    workload: Workload
    algorithms: list[str | dict[str, Any]] = Field(default_factory=lambda: list[str | dict[str, Any]](["ring", "tree"]))
    sweep: dict[str, list[Any]] = Field(default_factory=dict)


def _unit(parse: Any, v: Any) -> float:
    """A non-negative quantity; unit errors become pydantic's ValueError (located by the caller)."""
    try:
        x = float(parse(v))
    except InputError as err:
        raise ValueError(err.message) from None
    if x < 0:
        raise ValueError(f"must not be negative, got {v!r}")
    return x


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

    def locate(self, err: InputError) -> InputError:
        """Locate an error whose ``field`` is a dotted path of this scenario (file and line of that key)."""
        if self.swept:
            where = ", ".join(f"{k}={v}" for k, v in self.swept)
            err = InputError(f"{err.message} (sweep point {where})", file=err.file, line=err.line, field=err.field)
        if err.file is not None or not err.field:
            return err
        for dotted, (file, line) in (self.origins or {}).items():
            if err.field == dotted or err.field.startswith(dotted + "."):
                return err.located(file=file, line=line)
        parts = tuple(int(p) if p.isdigit() else p for p in err.field.split("."))
        return err.located(file=self.source, line=line_of(self.tree, parts))


# -- loading ------------------------------------------------------------------------------------------------------

def parse_set(item: str) -> tuple[str, Any]:
    """``key=value`` from the command line; the value is parsed as YAML (``4``, ``[1, 2]``, ``450 GB/s``)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise InputError(f"expected key=value, got {item!r}", file="--set")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return key.strip(), parsed


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


def _validate(tree: Any, source: str, origins: Mapping[str, _Origin]) -> Scenario:
    try:
        return Scenario.model_validate(tree)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        if loc[:1] == ("workload",) and len(loc) > 1 and loc[1] in ("decode", "flows"):
            loc = (loc[0], *loc[2:])  # drop pydantic's discriminator tag
        field = ".".join(str(p) for p in loc)
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "union_tag_invalid":
            loc = (*loc, "kind")
            field = ".".join(str(p) for p in loc)
            msg = f"must be one of {err['ctx']['expected_tags']}, got {err['ctx']['tag']!r}"
        elif err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif "input" in err and not isinstance(err["input"], (dict, list)) and repr(err["input"]) not in msg:
            msg = f"{msg}, got {err['input']!r}"
        for dotted, (file, line) in origins.items():
            if field == dotted or field.startswith(dotted + "."):
                raise InputError(msg, file=file, line=line, field=field) from None
        raise InputError(msg, file=source, line=line_of(tree, loc), field=field) from None


def load_scenario(path: str | Path, overrides: Sequence[str] = ()) -> list[Point]:
    """Load, override, validate and expand a scenario file into sweep points."""
    source = str(path)
    tree = load_yaml(path)
    if not isinstance(tree, dict):
        raise InputError("a scenario file must be a mapping", file=source, line=1)
    origins: dict[str, _Origin] = {}
    for item in overrides:
        key, value = parse_set(item)
        _set_path(tree, key, value, ("--set", None), origins)
    base = _validate(tree, source, origins)
    return expand(tree, base, source, Path(source).resolve().parent, origins)


def expand(tree: Any, base: Scenario, source: str, base_dir: Path,
           origins: Mapping[str, _Origin] | None = None) -> list[Point]:
    """Cartesian product of ``base.sweep``; each cell re-validated with its values and their YAML lines."""
    origins = dict(origins or {})
    if not base.sweep:
        return [Point(base, (), source, base_dir, tree, origins)]
    sweep_node = tree.get("sweep", {})
    axes = list(base.sweep.items())
    for key, values in axes:
        if not values:
            raise InputError("a sweep axis needs at least one value", file=source,
                             line=line_of(tree, ("sweep", key)), field=f"sweep.{key}")
        if key in ("sweep", "name") or key.startswith("sweep."):
            raise InputError("this key cannot be swept", file=source, line=line_of(tree, ("sweep", key)),
                             field=f"sweep.{key}")
    points = []
    for combo in itertools.product(*(range(len(v)) for _, v in axes)):
        cell = copy.deepcopy(tree)
        cell_origins = dict(origins)
        for (key, values), idx in zip(axes, combo, strict=True):
            lines = getattr(sweep_node.get(key), "lines", {}) if isinstance(sweep_node, dict) else {}
            line = lines.get(idx) if isinstance(sweep_node.get(key), LineList) else None
            origin = (source, line or line_of(tree, ("sweep", key)))
            _set_path(cell, key, copy.deepcopy(values[idx]), origin, cell_origins)
        cell["sweep"] = {}
        scenario = _validate(cell, source, cell_origins)
        swept = tuple((key, values[idx]) for (key, values), idx in zip(axes, combo, strict=True))
        points.append(Point(scenario, swept, source, base_dir, cell, cell_origins))
    return points
