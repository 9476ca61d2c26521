"""What a first run says while numba compiles: a notice on stderr, then each part as it is done.

A fresh install's first run compiles the package's numba code (half a minute of CPU, once: it is cached), and said
nothing meanwhile. :func:`listen` (called by :mod:`simulator.support.jitcache`, which every compiled module imports)
watches numba's compile events: the first compile of a function of this package prints :data:`NOTICE`, and each
top-level compile that took half a second or more prints its part and seconds. A process that loads everything from
the cache says nothing. :mod:`simulator.engine.warmup` adds the parts other processes compile (:func:`say_progress`)
and keeps its helper processes quiet (:func:`announce`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

from numba.core import event

__all__ = ["NOTICE", "announce", "label", "listen", "say_progress"]

NOTICE = ("treering: compiling the simulator's engine (numba): the first run after an install does this once, later "
          "runs load it")
_PACKAGE = "simulator."
_LABELS = {"routecore": "the router", "eventcore": "the event loop", "netstate": "the flow network",
           "flowcore": "the flow network", "colpass": "the schedule passes"}


def label(disp: Any) -> str:
    """What a compiled function is part of, for the progress lines (``the router``)."""
    module = (getattr(disp.py_func, "__module__", None) or "").rpartition(".")[2]
    return _LABELS.get(module, module or "?")


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no stderr (closed, None): nowhere to say it
        print(line, file=sys.stderr, flush=True)


class _Announcer(event.Listener):
    """The notice at this process's first compile of a package function, then a line per top-level compile."""

    def __init__(self) -> None:
        self.on = True
        self.listening = False
        self.said = False
        self.depth = 0
        self.top: Any = None
        self.t0 = 0.0

    def on_start(self, ev: event.Event) -> None:
        disp = ev.data.get("dispatcher")
        ours = (getattr(getattr(disp, "py_func", None), "__module__", None) or "").startswith(_PACKAGE)
        if self.depth == 0 and self.on and ours:
            if not self.said:
                _say(NOTICE)
                self.said = True
            self.top, self.t0 = disp, time.perf_counter()
        self.depth += 1

    def on_end(self, ev: event.Event) -> None:
        self.depth -= 1
        if self.depth == 0 and self.top is not None:
            top, self.top = self.top, None
            seconds = time.perf_counter() - self.t0
            if seconds >= 0.5 and not ev.is_failed:  # (an interrupted compile: nothing done to say)
                _say(f"treering:   {label(top)} ({top.py_func.__name__}): {seconds:.0f} s")


_ANNOUNCER = _Announcer()


def listen() -> None:
    """Watch numba's compile events (from the first call on; later calls change nothing)."""
    if not _ANNOUNCER.listening:
        event.register("numba:compile", _ANNOUNCER)
        _ANNOUNCER.listening = True


def announce(on: bool) -> None:
    """Whether this process says what it compiles (on by default; a helper process compiling for another is quiet:
    the other one speaks)."""
    _ANNOUNCER.on = on


def say_progress(line: str) -> None:
    """A line of a first run's progress on stderr (the notice first, if this process has not said it yet)."""
    if not _ANNOUNCER.said:
        _say(NOTICE)
        _ANNOUNCER.said = True
    _say(f"treering:   {line}")
