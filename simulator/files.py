"""Atomic file output: write to a temporary file in the same folder, then rename over the target."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd

__all__ = ["write_atomic", "write_csv_atomic", "write_parquet_atomic", "write_text_atomic"]


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` on a fresh temporary file beside ``path``, then rename it over ``path``: readers see the
    old file or the whole new one, never a part; the temporary name is unique, so writers never collide."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_parquet_atomic(frame: pd.DataFrame, path: Path) -> None:
    """Write ``frame`` as Parquet atomically."""
    write_atomic(path, lambda tmp: frame.to_parquet(tmp, index=False))


def write_csv_atomic(frame: pd.DataFrame, path: Path) -> None:
    """Write ``frame`` as CSV atomically (full float precision)."""
    write_text_atomic(path, frame.to_csv(index=False, float_format="%.17g"))
