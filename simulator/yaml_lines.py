"""YAML loading that remembers the line of every mapping key and sequence item.

``load_yaml(path)`` returns plain ``dict``/``list`` subclasses (:class:`LineDict`, :class:`LineList`) that
carry ``.line`` (1-based line of the node) and ``.lines`` (line of each key or item), so validation errors
can say ``file:line: field: message``. Only the safe YAML subset is accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from simulator.errors import InputError

__all__ = ["LineDict", "LineList", "line_of", "load_yaml", "load_yaml_text"]


class LineDict(dict[str, Any]):
    """A dict with the YAML line of itself (``line``) and of each key (``lines``)."""

    line: int | None = None
    lines: dict[Any, int]


class LineList(list[Any]):
    """A list with the YAML line of itself (``line``) and of each item (``lines``)."""

    line: int | None = None
    lines: dict[int, int]


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in out:
            raise InputError(f"duplicate key {key!r}", line=key_node.start_mark.line + 1, field=str(key))
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.lines = {i: child.start_mark.line + 1 for i, child in enumerate(node.value)}
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_yaml_text(text: str, source: str = "<string>") -> Any:
    """Parse YAML text; syntax errors become a located :class:`InputError`."""
    try:
        return yaml.load(text, Loader=_Loader)
    except InputError as err:
        raise err.located(file=source) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(err, "problem", None) or str(err)
        raise InputError(f"invalid YAML: {problem}", file=source, line=line) from None


def load_yaml(path: str | Path) -> Any:
    """Read and parse a YAML file; a missing or unreadable file is an :class:`InputError`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"cannot read file: {err.strerror or err}", file=str(path)) from None
    return load_yaml_text(text, str(path))


def line_of(node: Any, path: tuple[Any, ...]) -> int | None:
    """Best line for the dotted ``path`` inside a loaded YAML tree (deepest known ancestor)."""
    best = getattr(node, "line", None)
    cur = node
    for key in path:
        lines = getattr(cur, "lines", None)
        if lines is None:
            break
        if key in lines:
            best = lines[key]
        try:
            cur = cur[key]
        except (KeyError, IndexError, TypeError):
            break
    return best
