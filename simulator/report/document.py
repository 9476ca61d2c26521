"""A report as a list of blocks, rendered twice: GitHub Markdown (``report.md``) and self-contained HTML.

Writing the blocks once and rendering each format directly avoids a Markdown parser: inline ``code`` and links
(``[results.csv](results.csv)``, to files beside the report) are the only markup in text, tables are plain header +
rows (no index column; a swept key by its last name, ``workload.layout`` as ``layout``; numbers as
:func:`plain_number` writes them: no exponent for ordinary values), images are embedded in the HTML as base64.
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pandas as pd

__all__ = ["Block", "Code", "Heading", "Image", "Items", "Para", "Table", "plain_number", "short_names", "to_html",
           "to_markdown"]


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Para:
    text: str  # `backticks` mark inline code


@dataclass(frozen=True)
class Items:
    items: tuple[str, ...]  # a bullet list; `backticks` mark inline code


@dataclass(frozen=True)
class Code:
    text: str  # a preformatted block (a command)


@dataclass(frozen=True)
class Table:
    frame: pd.DataFrame  # rendered without its index; floats by :func:`plain_number`, or with ``floatfmt``
    floatfmt: str | None = None


@dataclass(frozen=True)
class Image:
    name: str  # the PNG's file name beside the report
    data: bytes
    caption: str = ""


Block = Heading | Para | Items | Code | Table | Image


def plain_number(value: float) -> str:
    """Four significant digits without an exponent and without trailing zeros (``0.07595``, ``101.8``, ``1``,
    ``1031094``, ``0.00006192``); an exponent only for what is not an ordinary magnitude (under 1e-6, as an error,
    or from 1e15); NaN as ``-``."""
    if value != value:
        return "-"
    if value == 0 or math.isinf(value):
        return str(value) if value else "0"
    rounded = float(f"{value:.4g}")  # 0.99996 -> 1 (then printed as one digit, not 1.0000)
    size = abs(rounded)
    if size < 1e-6 or size >= 1e15:
        return f"{value:.3e}"
    if size >= 1000:
        return f"{value:.0f}"
    text = f"{rounded:.{3 - math.floor(math.log10(size))}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def short_names(columns: Iterable[object]) -> dict[str, str]:
    """Swept keys by their last name (``workload.layout`` -> ``layout``) where no other column has that name; a
    key into a list keeps its whole name (``workload.flows.1.bytes`` is not the flows' ``bytes``)."""
    names = [str(c) for c in columns]
    out = {}
    for name in names:
        short = name.split(".")[-1]
        indexed = any(part.isdigit() for part in name.split("."))
        if short != name and not indexed and short not in names and \
                sum(n.split(".")[-1] == short for n in names) == 1:
            out[name] = short
    return out


_CODE = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def _cell(value: object, floatfmt: str | None) -> str:
    if isinstance(value, float):
        if value != value:
            return ""  # NaN: an empty cell
        return plain_number(value) if floatfmt is None else format(value, floatfmt)
    return str(value)


def _rows(frame: pd.DataFrame, floatfmt: str | None) -> list[list[str]]:
    return [[_cell(v, floatfmt) for v in row] for row in frame.itertuples(index=False)]


def _header(frame: pd.DataFrame) -> list[str]:
    names = short_names(frame.columns)
    return [names.get(str(c), str(c)) for c in frame.columns]


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(blocks: Sequence[Block]) -> str:
    """GitHub-flavoured Markdown; images are links to the PNG files beside it."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, Para):
            out.append(b.text)
        elif isinstance(b, Items):
            out.append("\n".join(f"- {item}" for item in b.items))
        elif isinstance(b, Code):
            out.append(f"```\n{b.text}\n```")
        elif isinstance(b, Table):
            head = "| " + " | ".join(_md_escape(c) for c in _header(b.frame)) + " |"
            rule = "|" + "|".join("---" for _ in b.frame.columns) + "|"
            body = ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in _rows(b.frame, b.floatfmt)]
            out.append("\n".join([head, rule, *body]))
        else:
            out.append(f"![{b.name}]({b.name})" + (f"\n\n{b.caption}" if b.caption else ""))
    return "\n\n".join(out) + "\n"


def _links(text: str) -> str:
    parts = _LINK.split(text)  # text, (label, href, text)*
    out = [html.escape(parts[0])]
    for k in range(1, len(parts), 3):
        out.append(f'<a href="{html.escape(parts[k + 1])}">{html.escape(parts[k])}</a>{html.escape(parts[k + 2])}')
    return "".join(out)


def _inline(text: str) -> str:
    """HTML of a line of text whose `backticks` mark code and ``[label](href)`` a link."""
    parts = _CODE.split(text)
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else _links(p) for i, p in enumerate(parts))


_NUMBER = re.compile(r"^\(?[-+]?[\d.,]+(e[-+]?\d+)?(x| OOM)?\)?$")  # right-aligned: 1.358, 4,519x, 649.4 OOM


def _html_table(t: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in _header(t.frame))
    body = "".join("<tr>" + "".join(f'<td{" class=num" if _NUMBER.match(v) else ""}>{html.escape(v)}</td>'
                                    for v in row) + "</tr>"
                   for row in _rows(t.frame, t.floatfmt))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;line-height:1.4}"
          "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px}"
          "th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}"
          "code,pre{background:#f6f6f6;font-size:90%}pre{padding:0.6em;overflow-x:auto}"
          "img{max-width:100%;height:auto}figure{margin:1em 0}figcaption{font-size:90%;color:#444}")


def to_html(blocks: Sequence[Block], title: str) -> str:
    """A self-contained HTML page (images inline as base64, no script, no external resource)."""
    body: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{_inline(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            body.append(f"<p>{_inline(b.text)}</p>")
        elif isinstance(b, Items):
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Code):
            body.append(f"<pre><code>{html.escape(b.text)}</code></pre>")
        elif isinstance(b, Table):
            body.append(_html_table(b))
        else:
            b64 = base64.b64encode(b.data).decode()
            cap = f"<figcaption>{_inline(b.caption)}</figcaption>" if b.caption else ""
            body.append(f'<figure><img alt="{html.escape(b.name)}" src="data:image/png;base64,{b64}">{cap}</figure>')
    return (f"<!doctype html>\n<html lang=en><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
