"""Run the points of a sweep: in this process, a local process pool (``--jobs N``) or a Dask cluster
(``--executor dask [--scheduler ADDRESS]``; without an address a local Dask cluster is started).

Rows carry ``point`` (the sweep index). As points finish, ``results.csv`` and ``results.parquet`` are rewritten
atomically (at most every ``flush_s`` seconds, and no more often than keeps the rewriting to about a twentieth of
the time: a large sweep's files take a while to write; and at the end), so an interruption, ``kill -9`` included,
leaves whole files of finished points; ``resume`` keeps those rows and runs only the missing points. A point that raises
becomes a row with an ``error`` message and the sweep goes on. A progress line (points, rate, ETA) goes to
stderr.

Pool workers are forked from this process, or, where it runs other threads than its main one (a notebook, a test
runner), from a fork server (a fork copies the locks other threads hold). They die with their parent: a forked
worker asks the kernel for SIGKILL when its parent exits (Linux ``PR_SET_PDEATHSIG``; elsewhere a thread watches
the parent's pid), a fork server's watches the sweep's process; each ignores SIGINT, which the parent handles: on
Ctrl-C it writes the finished rows (a folder ``--resume`` continues), stops its workers and re-raises.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import multiprocessing
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.engine.warmup import load_compiled
from simulator.errors import InputError
from simulator.report.read import resumable_rows
from simulator.report.timeline import timeline_frame
from simulator.run.prepare import simulate_point
from simulator.run.prepared import PreparedPoint
from simulator.support.files import replace_all, temp_beside
from simulator.support.gcpause import gc_paused

__all__ = ["SweepOutcome", "run_sweep"]

EXECUTORS = ("process", "dask")


_Done = tuple[list[dict[str, Any]], pd.DataFrame | None]  # a point's rows, and its timeline if it was asked for


def _run_one(index: int, point: PreparedPoint, timeline: bool = False) -> _Done:
    """One prepared point simulated (it is not prepared again: its checks ran in the sweep's process)."""
    frame = None
    try:
        # the collector paused for the whole point: its millions of ops are freed (by reference counting) before it
        # runs again, rather than walked once by the collection that would follow the build's and the run's pauses
        with gc_paused():
            outcome = simulate_point(point, timeline)
            rows = outcome.rows
            frame = timeline_frame(outcome.runs) if outcome.runs is not None else None
    except Exception as err:  # a failing point is a row, and the sweep goes on
        where = traceback.extract_tb(err.__traceback__)[-1]
        rows = [{"error": f"{type(err).__name__}: {err} ({Path(where.filename).name}:{where.lineno})",
                 **point.point.columns()}]
    return [{**row, "point": index} for row in rows], frame


class SweepOutcome:
    """The rows of a sweep and how it went."""

    def __init__(self, frame: pd.DataFrame, ran: int, resumed: int, failed: int,
                 timeline: pd.DataFrame | None = None) -> None:
        self.frame, self.ran, self.resumed, self.failed = frame, ran, resumed, failed
        self.timeline = timeline  # of the timeline point, from the sweep's own simulation (None if it did not run)


class _Progress:
    def __init__(self, total: int, done: int, enabled: bool) -> None:
        self.total, self.done, self.start, self.enabled = total, done, time.monotonic(), enabled
        self.first = done

    def step(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        rate = (self.done - self.first) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else math.inf
        end = "\n" if self.done == self.total else ""
        sys.stderr.write(f"\r[{self.done}/{self.total}] {100 * self.done / self.total:5.1f}%  {rate:7.2f} points/s"
                         f"  ETA {eta:6.1f} s  {end}")
        sys.stderr.flush()


def _write(rows: list[dict[str, Any]], out: Path) -> pd.DataFrame:
    """Both result files, each atomically; neither replaced unless both were written."""
    frame = pd.DataFrame(rows) if rows else pd.DataFrame({"point": pd.Series([], dtype="int64")})
    if len(frame):
        frame = frame.sort_values("point", kind="stable").reset_index(drop=True)
    csv = frame.to_csv(index=False, float_format="%.17g")
    pairs: list[tuple[Path, Path]] = []
    try:
        pairs.append((temp_beside(out / "results.csv", lambda tmp: tmp.write_text(csv, encoding="utf-8")),
                      out / "results.csv"))
        pairs.append((temp_beside(out / "results.parquet", lambda tmp: _parquet_frame(frame).to_parquet(
            tmp, index=False)), out / "results.parquet"))
    except BaseException:
        for tmp, _ in pairs:
            tmp.unlink(missing_ok=True)
        raise
    replace_all(pairs)
    return frame


def _parquet_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns of mixed types (a swept key given as 1e9 and as '1 GB') as text: Parquet columns have one type."""
    mixed = [c for c in frame.columns if frame[c].dtype == object
             and len({type(v) for v in frame[c] if v is not None and v == v}) > 1]
    return frame.astype({c: str for c in mixed}) if mixed else frame


def _pool_context() -> tuple[multiprocessing.context.BaseContext | None, bool]:
    """How pool workers start, and whether this process is their parent.

    ``fork`` where this process runs one thread: a worker starts at once with what is imported. Where other threads
    run (a notebook's, a test runner's, a library's), a fork copies the locks they hold, held, and a worker can wait
    on one forever (Python 3.12 warns of it): workers are then forked by a fork server, a fresh single-threaded
    process that imports this module once. ``spawn`` (the platform's default) where there is no fork.
    """
    if not hasattr(os, "fork"):
        return None, True
    if threading.active_count() == 1:
        return multiprocessing.get_context("fork"), True
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx, False


def _die_with_parent(parent: int, direct: bool = True) -> None:
    """Pool worker initializer: leave SIGINT to the parent; exit when the parent does (even by ``kill -9``).

    ``direct`` false: ``parent`` (the sweep's process) had a fork server fork this worker, and the server lives as
    long as its workers do (they hold its liveness pipe): the worker watches ``parent`` itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not direct:
        _watch_process(parent)
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        armed = False
    if os.getppid() != parent:  # the parent died before the request was made
        os._exit(1)
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _watch_process(pid: int) -> None:
    """Exit this process once process ``pid`` has (a thread waits on a Linux pidfd; elsewhere it polls)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # already gone
        os._exit(1)
    except (OSError, AttributeError):
        threading.Thread(target=_poll_process, args=(pid,), daemon=True).start()
        return
    threading.Thread(target=_wait_readable, args=(fd,), daemon=True).start()


def _wait_readable(fd: int) -> None:
    select.select([fd], [], [])  # a pidfd turns readable when its process exits
    os._exit(1)


def _poll_process(pid: int) -> None:
    while True:
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):  # gone, or its pid reused by another user's process
            os._exit(1)
        time.sleep(1.0)


_PR_SET_PDEATHSIG = 1


def _stop_workers() -> None:
    """Terminate this process's pool workers (they may be in the middle of a point) and reap them."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(timeout=5)


def _process_pool(todo: Sequence[tuple[int, PreparedPoint]], jobs: int, keep: int | None
                  ) -> Iterator[_Done]:
    # the compiled code loaded first: pool workers inherit it (fork) or read numba's cache (fork server), none
    # compiles it; on a fresh install it is compiled in parallel processes, this one waiting (an interrupt lands)
    load_compiled()
    if jobs <= 1 or len(todo) <= 1:
        for index, point in todo:
            yield _run_one(index, point, index == keep)
        return
    ctx, direct = _pool_context()
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=ctx, initializer=_die_with_parent,
                               initargs=(os.getpid(), direct))
    finished = False
    try:
        pending = {pool.submit(_run_one, index, point, index == keep) for index, point in todo}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                yield fut.result()
        finished = True
    finally:
        if not finished:  # interrupted (Ctrl-C, an error, the consumer gone): do not wait for running points
            pool.shutdown(wait=False, cancel_futures=True)
            _stop_workers()
        pool.shutdown(wait=True)


def _dask(todo: Sequence[tuple[int, PreparedPoint]], jobs: int, keep: int | None, scheduler: str | None
          ) -> Iterator[_Done]:
    from dask.distributed import Client, LocalCluster, as_completed  # optional dependency: imported when used

    if scheduler is None:
        load_compiled()  # numba's cache written once here (on a fresh install), read by the local workers
    cluster = None if scheduler else LocalCluster(n_workers=max(1, jobs), threads_per_worker=1, processes=True,
                                                  dashboard_address=None)
    try:
        with Client(scheduler or cluster) as client:
            futures = [client.submit(_run_many, chunk, keep, pure=False) for chunk in _chunks(todo, jobs)]
            for fut in as_completed(futures):
                yield from fut.result()
    finally:
        if cluster is not None:
            cluster.close()


_CHUNK = 16  # at most this many points per Dask task


def _chunks(todo: Sequence[tuple[int, PreparedPoint]], jobs: int) -> list[list[tuple[int, PreparedPoint]]]:
    """The points in tasks of a few each, in order: a Dask task costs its scheduler, client and worker about a
    millisecond each, as much as a light point; at least eight tasks per worker, so that the last ones balance."""
    size = max(1, min(_CHUNK, len(todo) // (8 * max(1, jobs))))
    return [list(todo[i:i + size]) for i in range(0, len(todo), size)]


def _run_many(chunk: Sequence[tuple[int, PreparedPoint]], keep: int | None) -> list[_Done]:
    """The points of one Dask task, one after the other (:func:`_run_one`)."""
    return [_run_one(index, point, index == keep) for index, point in chunk]


_FLUSH_SHARE = 20  # the results are rewritten at most once per this many times the last rewrite's duration


def run_sweep(points: Sequence[PreparedPoint], out: Path, *, jobs: int = 1, executor: str = "process",
              scheduler: str | None = None, resume: bool = False, progress: bool = True,
              flush_s: float = 1.0, on_rows: Callable[[int], None] | None = None,
              timeline_point: int | None = None) -> SweepOutcome:
    """Run every point not already in ``out/results.csv`` (with ``resume``), writing results as they come;
    the timeline of point ``timeline_point`` is kept from its simulation."""
    if executor not in EXECUTORS:
        raise InputError(f"must be one of {', '.join(EXECUTORS)}, got {executor!r}", field="--executor")
    out.mkdir(parents=True, exist_ok=True)
    rows = resumable_rows(out / "results.csv", len(points)) if resume else []
    finished = {int(r["point"]) for r in rows}
    todo = [(i, p) for i, p in enumerate(points) if i not in finished]
    bar = _Progress(len(points), len(finished), progress)
    source = (_dask(todo, jobs, timeline_point, scheduler) if executor == "dask"
              else _process_pool(todo, jobs, timeline_point))
    timeline = None
    last_flush = time.monotonic()
    interval = flush_s  # between rewrites: flush_s, or more where a rewrite takes over a twentieth of it
    failed = 0
    try:
        for point_rows, kept in source:
            rows.extend(point_rows)
            timeline = kept if kept is not None else timeline
            failed += any("error" in r for r in point_rows)
            bar.step()
            if on_rows is not None:
                on_rows(len(rows))
            if time.monotonic() - last_flush >= interval:
                started = time.monotonic()
                _write(rows, out)
                last_flush = time.monotonic()
                interval = max(flush_s, _FLUSH_SHARE * (last_flush - started))
    except KeyboardInterrupt:
        close = getattr(source, "close", None)
        if close is not None:
            close()  # stops the workers
        _write(rows, out)  # what finished, for --resume
        raise
    frame = _write(rows, out)
    return SweepOutcome(frame, ran=len(todo), resumed=len(finished), failed=failed, timeline=timeline)
