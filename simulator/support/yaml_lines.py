"""YAML loading that remembers the line of every mapping key and sequence item.

``load_yaml(path)`` returns plain ``dict``/``list`` subclasses (:class:`LineDict`, :class:`LineList`) that
carry ``.line`` (1-based line of the node) and ``.lines`` (line of each key or item), so validation errors
can say ``file:line: field: message``. Only the safe YAML subset is accepted.

Untrusted text stops here: a file must be a regular file of at most :data:`MAX_YAML_BYTES` of UTF-8; any failure
of the parser or of a constructor (``!!int x``, an unhashable key, nesting deeper than Python's stack) is a
located :class:`InputError`; integers are at most :data:`MAX_INT_DIGITS` digits; and a tree whose expansion
through aliases (``*a``) exceeds :data:`MAX_YAML_NODES` values is refused (an "alias bomb" is cheap to load but
not to validate, copy or print).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from simulator.errors import InputError, excerpt

__all__ = ["MAX_INT_DIGITS", "MAX_YAML_BYTES", "MAX_YAML_NODES", "LineDict", "LineList", "line_of", "load_yaml",
           "load_yaml_text", "parse_set", "read_text_file"]

MAX_YAML_BYTES = 4 * 2**20
MAX_YAML_NODES = 1_000_000
MAX_INT_DIGITS = 40


class LineDict(dict[Any, Any]):
    """A dict with the YAML line of itself (``line``) and of each key (``lines``)."""

    line: int | None = None
    lines: dict[Any, int]


class LineList(list[Any]):
    """A list with the YAML line of itself (``line``) and of each item (``lines``)."""

    line: int | None = None
    lines: dict[int, int]


class _Loader(yaml.SafeLoader):
    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """Any constructor failure becomes an :class:`InputError` at the line of the node that failed."""
        try:
            return super().construct_object(node, deep=deep)
        except (InputError, yaml.YAMLError, RecursionError):
            raise
        except Exception as err:  # ValueError (!!int x), TypeError, OverflowError...: one located line
            tag = str(node.tag).rsplit(":", 1)[-1]
            raise InputError(f"invalid YAML value {excerpt(getattr(node, 'value', ''))} for tag !!{tag} "
                             f"({type(err).__name__})", line=node.start_mark.line + 1) from None


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    digits = sum(c.isdigit() for c in str(node.value))
    if digits > MAX_INT_DIGITS:
        raise InputError(f"integer of {digits} digits (at most {MAX_INT_DIGITS})", line=node.start_mark.line + 1)
    value: int = loader.construct_yaml_int(node)
    return value


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise InputError(f"a mapping key must be a plain value, got a {type(key).__name__}",
                             line=key_node.start_mark.line + 1)
        if key in out:
            raise InputError(f"duplicate key {excerpt(key)}", line=key_node.start_mark.line + 1, field=str(key))
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
_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _expanded_size(tree: Any) -> int:
    """Values in ``tree`` counting every alias again (memoised by identity: linear in the distinct nodes)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(tree, False)]
    while stack:
        node, children_done = stack.pop()
        if not isinstance(node, (dict, list)) or (id(node) in sizes and not children_done):
            continue
        kids = list(node.values()) if isinstance(node, dict) else node
        if children_done:
            total = 1 + sum(sizes.get(id(k), 1) if isinstance(k, (dict, list)) else 1 for k in kids)
            sizes[id(node)] = min(total, MAX_YAML_NODES + 1)
            continue
        sizes[id(node)] = 1  # in progress (a recursive alias counts once)
        stack.append((node, True))
        stack.extend((k, False) for k in kids if isinstance(k, (dict, list)) and id(k) not in sizes)
    return sizes.get(id(tree), 1)


def load_yaml_text(text: str, source: str = "<string>") -> Any:
    """Parse YAML text; syntax errors become a located :class:`InputError`."""
    if len(text) > MAX_YAML_BYTES:
        raise InputError(f"YAML of {len(text):,} characters (at most {MAX_YAML_BYTES:,})", file=source)
    try:
        tree = yaml.load(text, Loader=_Loader)
    except InputError as err:
        raise err.located(file=source) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(err, "problem", None) or str(err)
        problem = " ".join(str(problem).split())
        problem = problem if len(problem) <= 100 else problem[:97] + "..."
        raise InputError(f"invalid YAML: {problem}", file=source, line=line) from None
    except RecursionError:
        raise InputError("invalid YAML: nested too deeply", file=source) from None
    if _expanded_size(tree) > MAX_YAML_NODES:
        raise InputError(f"YAML expands (through aliases) to over {MAX_YAML_NODES:,} values", file=source)
    return tree


def load_yaml(path: str | Path) -> Any:
    """Read and parse a YAML file; a missing or unreadable file is an :class:`InputError`."""
    return load_yaml_text(read_text_file(path, MAX_YAML_BYTES), str(path))


def read_text_file(path: str | Path, max_bytes: int) -> str:
    """A regular file of at most ``max_bytes`` bytes of UTF-8 (not a folder, device or FIFO: they never end)."""
    p = Path(path)
    try:
        if not p.is_file():
            what = "a folder" if p.is_dir() else "not a regular file" if p.exists() else "no such file"
            raise InputError(f"cannot read file: {what}", file=str(path))
        with p.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as err:
        raise InputError(f"cannot read file: {err.strerror or err}", file=str(path)) from None
    if len(data) > max_bytes:
        raise InputError(f"file over {max_bytes:,} bytes", file=str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise InputError(f"not UTF-8 text (byte {data[err.start]:#04x})", file=str(path), line=line) from None


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


def parse_set(item: str) -> tuple[str, Any]:
    """``key=value`` from the command line; the value is parsed as YAML (``4``, ``[1, 2]``, ``450 GB/s``)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise InputError(f"expected key=value, got {excerpt(item)}", file="--set")
    try:
        parsed = load_yaml_text(value, "--set") if value.strip() else ""
    except InputError as err:
        raise InputError(err.message, file="--set", field=key.strip()) from None
    return key.strip(), parsed
