"""A progress line on stderr while a long command works (``tqdm``), shown only when stderr is a terminal: one
mechanism for every command that searches (both plans), so that each says the same way what it is doing.

:func:`progress_line` yields a function taking a status text (``tree: tp 8, 3 node(s) (12 simulated)``), or None
when no line is shown (stderr is a file or a pipe: a log must not fill with carriage returns); the line is removed
when the command ends, whether it finished or failed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tqdm import tqdm

__all__ = ["Progress", "progress_line"]

Progress = Callable[[str], None]


@contextmanager
def progress_line(label: str, enabled: bool | None = None) -> Iterator[Progress | None]:
    """``label: status [elapsed]`` on stderr while the body runs (``enabled``: default, when stderr is a TTY)."""
    if not (sys.stderr.isatty() if enabled is None else enabled):
        yield None
        return
    bar = tqdm(desc=label, file=sys.stderr, leave=False, bar_format="{desc} [{elapsed}]", dynamic_ncols=True)

    def show(status: str) -> None:
        bar.set_description_str(f"{label}: {status}")

    try:
        yield show
    finally:
        bar.close()
