"""A report's figures drawn off the run's critical path: by a process that loaded matplotlib while the run was
simulating, two figures at a time.

matplotlib takes about 0.3 s to load and 0.1-0.4 s to draw each figure, in one thread, and a report has four to
six: drawn one after another after the simulation, it was the larger part of a quick run. Here:

* :class:`Drawer`: ``treering run`` forks one at its start (:meth:`Drawer.start`), before it loads the compiled
  engine; the drawer loads matplotlib on another CPU while the run prepares and simulates its points, then waits
  for the report's figures. The run's own process never loads matplotlib.
* :func:`start_render` draws a report's :class:`Job` s (while the run writes its other files): through the drawer
  where there is one, else here; either way in two processes where that is safe and useful (:func:`_split`): the
  one drawing forks once, the child draws a share (its PNG bytes sent back through a pipe) while it draws the rest.

Jobs are plain data (a module-level function, its arguments): they are pickled to the drawer, and only bytes come
back from it and from a split's child. Everything is drawn here, one job after another, where a fork is not safe
or of no use: no ``os.fork`` (Windows), one CPU, or other threads running in this process (a notebook's, a test
runner's: a fork copies the locks they hold). A drawer or a child that fails (raises, dies, sends nothing) leaves
its figures to this process, which draws them as it would have. Each figure's bytes are those its job returns,
whichever process runs it.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import pickle
import signal
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

__all__ = ["Drawer", "Job", "render_all", "start_render"]

_LENGTH = struct.Struct("<Q")  # a message: its length, then its pickle
_PR_SET_PDEATHSIG = 1


class Job(NamedTuple):
    """A figure to draw: ``draw(*args, **kwargs)`` returns its PNG bytes (``draw`` a module-level function, so that
    a job pickles); ``cost``: its relative drawing time (the two shares of a split are dealt by it)."""

    draw: Callable[..., bytes]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = {}
    cost: float = 1.0

    def __call__(self) -> bytes:
        return self.draw(*self.args, **self.kwargs)


def _forkable() -> bool:
    return hasattr(os, "fork") and (os.cpu_count() or 1) > 1 and threading.active_count() == 1


def _send(fd: int, obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    with os.fdopen(fd, "wb", closefd=False) as pipe:
        pipe.write(_LENGTH.pack(len(data)) + data)


def _receive(fd: int) -> object:
    """The next message on ``fd``; ``None`` at the end of the pipe or for a damaged message."""
    with os.fdopen(fd, "rb", closefd=False) as pipe:
        head = pipe.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            return None
        size = _LENGTH.unpack(head)[0]
        data = pipe.read(size)
    if len(data) < size:
        return None
    try:
        return pickle.loads(data)
    except Exception:  # a message cut short, or of an older version: as if nothing came
        return None


def _load_matplotlib() -> None:
    """matplotlib loaded, set up to draw without a display, as every figure draws with it."""
    from simulator.report.figures import agg

    agg()
    import matplotlib.pyplot  # noqa: F401


def _load_matplotlib_frozen() -> None:
    """:func:`_load_matplotlib` in a process that only draws (the drawer): its modules imported without cyclic
    collections, then frozen (as ``treering``'s own are, :func:`simulator.cli.main`): no collection while the figures
    are drawn, here or in a child that draws a share, walks them again."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        _load_matplotlib()
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def _shares(jobs: Mapping[str, Job]) -> tuple[list[str], list[str]]:
    """The jobs split in two shares of about equal cost (the costliest first, each to the lighter share); the
    first is drawn by the process that splits, the second by its child."""
    here: list[str] = []
    there: list[str] = []
    load = [0.0, 0.0]
    for name in sorted(jobs, key=lambda n: -jobs[n].cost):
        side = 0 if load[0] <= load[1] else 1
        (here if side == 0 else there).append(name)
        load[side] += jobs[name].cost
    return here, there


def _draw_and_exit(names: list[str], jobs: Mapping[str, Job], fd: int) -> None:
    """In a forked child: draw ``names``, send their bytes on ``fd``, and end without cleaning up (what the parent
    holds is the parent's: no buffers flushed twice, no exit handlers)."""
    code = 1
    try:
        _send(fd, {name: jobs[name]() for name in names})
        code = 0
    finally:
        os._exit(code)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _split(jobs: Mapping[str, Job]) -> dict[str, bytes]:
    """Every job's bytes: a forked child draws one share while this process draws the other (module docstring);
    one after another here where a fork is not safe or of no use."""
    if len(jobs) < 2 or not _forkable():
        return {name: job() for name, job in jobs.items()}
    _load_matplotlib()  # before the fork: the child has it too, rather than loading it again
    here, there = _shares(jobs)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _draw_and_exit(there, jobs, write)
    os.close(write)
    try:
        done = {name: jobs[name]() for name in here}
        received = _receive(read)
    except BaseException:  # an interrupt, a failing figure: the child goes too
        _kill(pid)
        raise
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    if isinstance(received, dict) and set(received) == set(there):
        done.update(received)
    else:  # the child failed: its share drawn here
        done.update({name: jobs[name]() for name in there})
    return {name: done[name] for name in jobs}


class Drawer:
    """A forked process that loads matplotlib at once, then draws one report's figures (:func:`start_render`) and
    ends. It ignores Ctrl-C (the run handles it); closed before its figures came back (the run failed, was
    interrupted, or writes no report) it is killed, as it writes nothing; and it ends when the run ends, however
    that ends (the kernel kills it, or its pipe closes)."""

    def __init__(self, pid: int, jobs_fd: int, out_fd: int) -> None:
        self.pid, self._jobs, self._out = pid, jobs_fd, out_fd
        self._done = False  # whether its figures came back (it then ends by itself)

    @classmethod
    def start(cls) -> Drawer | None:
        """A drawer, or ``None`` where a fork is not safe or of no use (the figures are then drawn here)."""
        if not _forkable():
            return None
        jobs_read, jobs_write = os.pipe()
        out_read, out_write = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(jobs_write)
            os.close(out_read)
            _serve(parent, jobs_read, out_write)
        os.close(jobs_read)
        os.close(out_write)
        return cls(pid, jobs_write, out_read)

    def submit(self, jobs: Mapping[str, Job]) -> bool:
        """Give the drawer its figures; ``False`` (and closed) if it is gone."""
        try:
            _send(self._jobs, dict(jobs))
        except OSError:  # its pipe broke
            self.close()
            return False
        return True

    def result(self) -> dict[str, bytes] | None:
        """The submitted figures' bytes, once drawn; ``None`` if it failed. It is closed either way."""
        try:
            received = _receive(self._out)
            self._done = received is not None
        except OSError:
            received = None
        finally:
            self.close()
        return received if isinstance(received, dict) else None

    def close(self) -> None:
        """End the drawer (killed, unless its figures came back) and reap it; closing twice does nothing."""
        if self.pid <= 0:
            return
        if not self._done:  # loading matplotlib, waiting, or drawing what is no longer wanted
            _kill(self.pid)
        for fd in (self._jobs, self._out):
            with contextlib.suppress(OSError):
                os.close(fd)
        os.waitpid(self.pid, 0)
        self.pid = 0


def _serve(parent: int, jobs_fd: int, out_fd: int) -> None:
    """The drawer: matplotlib loaded and set up, then one message of jobs drawn (split in two), their bytes sent
    back. The end of the pipe (the run closed it, or ended) ends it without drawing; so does the end of the run's
    process (Linux: the kernel kills it, ``PR_SET_PDEATHSIG``), even while it loads matplotlib."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with contextlib.suppress(OSError, AttributeError):  # (elsewhere: the pipe's end)
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the run ended before the request was made
            return
        _load_matplotlib_frozen()  # while the run simulates
        jobs = _receive(jobs_fd)
        if isinstance(jobs, dict):
            _send(out_fd, _split(jobs))
        code = 0
    finally:
        os._exit(code)


def start_render(jobs: Mapping[str, Job], drawer: Drawer | None = None) -> Callable[[], dict[str, bytes]]:
    """Start drawing the jobs: given to ``drawer`` at once if there is one (it is closed in the end); returns the
    function that waits for each job's PNG bytes, by name (what the drawer failed to draw is drawn then, here). The
    caller may do other work in between. Two figures at a time where a fork is safe and useful (module docstring)."""
    if drawer is not None and jobs and drawer.submit(jobs):
        def collect() -> dict[str, bytes]:
            drawn = drawer.result()
            if drawn is not None and set(drawn) == set(jobs):
                return {name: drawn[name] for name in jobs}
            return _split(jobs)

        return collect
    if drawer is not None:
        drawer.close()
    return lambda: _split(jobs)


def render_all(jobs: Mapping[str, Job], drawer: Drawer | None = None) -> dict[str, bytes]:
    """Each job's PNG bytes, by name (:func:`start_render`, waited for)."""
    return start_render(jobs, drawer)()
