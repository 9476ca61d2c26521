"""Where a command writes: checked before any simulation, and held by one writer at a time.

:func:`check_output_dir` refuses, before the work starts, an output folder that is a file, sits under a file, is a
dangling symlink, holds a folder where a result file goes, or cannot be written (read-only, full, no permission).
:func:`output_lock` holds ``DIR/.treering.lock`` (``filelock``: an OS lock, released when the process ends, even
by ``kill -9``) for the whole run, so a second ``treering run`` into the same folder is refused with one line
instead of the two mixing their results. :func:`claim_output_dir` does both, and a command takes it before any
preparation: a second command into a busy folder is refused at once, before it has simulated or read anything,
and a folder the command created is removed again when it is refused with nothing written.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from simulator.errors import InputError
from simulator.support.files import temp_beside

__all__ = ["LOCK_FILE", "OUTPUT_FILES", "check_output_dir", "check_output_file", "claim_output_dir", "output_lock"]

LOCK_FILE = ".treering.lock"
OUTPUT_FILES = ("results.csv", "results.parquet", "report.md", "report.html", "meta.json", "timeline.csv")


def _fail(path: Path, message: str, field: str) -> InputError:
    return InputError(message, file=str(path), field=field)


def check_output_dir(out: Path, field: str = "-o") -> None:
    """Create ``out`` if needed and prove that files can be written in it; an :class:`InputError` otherwise."""
    if out.is_symlink() and not out.exists():
        raise _fail(out, "is a dangling symbolic link", field)
    if out.exists() and not out.is_dir():
        raise _fail(out, "output path exists and is not a folder", field)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _fail(out, f"cannot create the output folder: {err.strerror or err}", field) from None
    for name in OUTPUT_FILES:
        if (out / name).is_dir():
            raise _fail(out / name, "is a folder where treering writes a file", field)
    _probe(out / OUTPUT_FILES[0], field)


def check_output_file(path: Path, field: str = "-o") -> None:
    """``path`` can be written (its folder created if needed); it must not be a folder."""
    if path.is_dir():
        raise _fail(path, "is a folder; give a file name", field)
    if path.parent.exists() and not path.parent.is_dir():
        raise _fail(path.parent, "is not a folder", field)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _fail(path.parent, f"cannot create the folder: {err.strerror or err}", field) from None
    _probe(path, field)


def _probe(path: Path, field: str) -> None:
    try:
        temp_beside(path, lambda tmp: tmp.write_bytes(b"probe")).unlink()
    except OSError as err:
        raise _fail(path.parent, f"cannot write here: {err.strerror or err}", field) from None


@contextmanager
def output_lock(out: Path, field: str = "-o") -> Iterator[None]:
    """Hold ``out/.treering.lock`` while the body runs; refuse at once if another process holds it. A lock file
    this call created is removed again (while still held) when the body fails: a refused command leaves the folder
    as it found it."""
    path = out / LOCK_FILE
    existed = path.exists()
    lock = FileLock(path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise InputError("another treering command is writing to this folder (it holds .treering.lock); wait for "
                         "it to finish or choose another -o", file=str(out), field=field) from None
    except OSError as err:
        raise InputError(f"cannot lock the output folder: {err.strerror or err}", file=str(out), field=field) \
            from None
    try:
        yield
    except BaseException:
        if not existed:
            path.unlink(missing_ok=True)
        raise
    finally:
        lock.release()


@contextmanager
def claim_output_dir(out: Path, field: str = "-o") -> Iterator[None]:
    """Check ``out`` (:func:`check_output_dir`) and hold its lock while the body runs; a folder this call created
    is removed when the body fails and left nothing but the lock in it."""
    created = not out.exists()
    try:
        check_output_dir(out, field)
        with output_lock(out, field):
            yield
    except BaseException:
        if created:
            _remove_if_empty(out)
        raise


def _remove_if_empty(out: Path) -> None:
    try:
        if {p.name for p in out.iterdir()} <= {LOCK_FILE}:
            (out / LOCK_FILE).unlink(missing_ok=True)
            out.rmdir()
    except OSError:
        pass  # another process wrote there meanwhile, or it is gone: leave it
