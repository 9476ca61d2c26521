"""Atomic file output: write to a uniquely named temporary file in the same folder, then rename over the target.

Temporary names are unique (``tempfile.mkstemp``), so two writers never collide on one; the file gets the user's
umask (``mkstemp`` alone would leave it 0600). A disk error (``ENOSPC``, ``EACCES``, ``EIO``) is raised as an
``OSError`` that names the file being written (``err.filename``: the target, not its temporary name), which the CLI
prints on one line.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd

__all__ = ["replace_all", "temp_beside", "write_atomic", "write_csv_atomic", "write_parquet_atomic",
           "write_text_atomic"]


def _umask() -> int:
    try:  # Linux: read it without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temp_beside(path: Path, write: Callable[[Path], object]) -> Path:
    """A new temporary file next to ``path`` (unique name, the user's umask) filled by ``write``; removed on error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise _naming(err, path) from None
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        os.close(fd)
        write(tmp)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise _naming(err, path) from None
        raise
    return tmp


def _naming(err: OSError, path: Path) -> OSError:
    """``err`` as an error of writing ``path`` (a write that filled the disk names no file of its own)."""
    return OSError(err.errno, err.strerror or str(err), str(path))


def replace_all(pairs: list[tuple[Path, Path]]) -> None:
    """Rename each finished temporary file over its target (after all of them were written)."""
    try:
        for tmp, path in pairs:
            try:
                os.replace(tmp, path)
            except OSError as err:
                raise _naming(err, path) from None
    finally:
        for tmp, _ in pairs:
            tmp.unlink(missing_ok=True)


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` on a fresh temporary file beside ``path``, then rename it over ``path``: readers see the
    old file or the whole new one, never a part; the temporary name is unique, so writers never collide."""
    replace_all([(temp_beside(path, write), path)])


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_parquet_atomic(frame: pd.DataFrame, path: Path) -> None:
    """Write ``frame`` as Parquet atomically."""
    write_atomic(path, lambda tmp: frame.to_parquet(tmp, index=False))


def write_csv_atomic(frame: pd.DataFrame, path: Path) -> None:
    """Write ``frame`` as CSV atomically (full float precision)."""
    write_text_atomic(path, frame.to_csv(index=False, float_format="%.17g"))
