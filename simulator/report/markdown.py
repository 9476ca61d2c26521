"""Plain Markdown tables from DataFrames (no extra dependency)."""

from __future__ import annotations

import pandas as pd

__all__ = ["markdown_table"]


def _cell(value: object, floatfmt: str) -> str:
    if isinstance(value, float):
        return format(value, floatfmt)
    return str(value)


def markdown_table(frame: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """``frame`` as a GitHub-flavoured Markdown table."""
    head = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(_cell(v, floatfmt) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])
