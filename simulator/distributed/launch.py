"""Start P local ranks (as ``torchrun`` would), watch them, and tear them all down when one fails.

Every rank is ``python -m simulator.distributed VERB ARGS`` with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and a free ``MASTER_PORT`` in its environment, in its own process group. If
any rank exits non-zero, or the timeout passes, every rank's process group is killed and :class:`RankFailure`
names the rank and the last line of its error output; no process is left behind. A run may start with a local
phase that takes what it takes (calibrate's kernel profiles on rank 0, which report their progress): given a
marker file, the timeout counts from the moment the marker appears, and the phase before it has a limit of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["FAILED_AT", "RankFailure", "free_port", "spawn"]

FAILED_AT = "treering-rank-failed-at"  # a failing rank prints this and the time; the earliest is the cause


class RankFailure(RuntimeError):
    """A rank failed (or the run timed out); ``rank`` is None for a timeout."""

    def __init__(self, message: str, rank: int | None) -> None:
        super().__init__(message)
        self.rank = rank


def free_port() -> int:
    """A TCP port that was free a moment ago on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _last_line(path: Path) -> str:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "(no error output)"


def _failed_at(path: Path) -> float:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(FAILED_AT):
            return float(line.split()[1])
    return float("inf")  # killed without reporting: not the first to fail, unless no rank reported


def _kill_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()


def spawn(procs: int, argv: Sequence[str], timeout_s: float, threads_per_rank: int = 1,
          marker: Path | None = None, before_marker_s: float | None = None) -> None:
    """Run ``procs`` local ranks of ``python -m simulator.distributed *argv`` to completion within ``timeout_s``;
    with a ``marker`` file, within ``timeout_s`` of the marker's appearance and, before it, ``before_marker_s``
    (default 12 x ``timeout_s``)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="treering-ranks-") as tmp:
        logs = [Path(tmp) / f"rank{r}.err" for r in range(procs)]
        children: list[subprocess.Popen[bytes]] = []
        try:
            for r in range(procs):
                env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(procs), "LOCAL_RANK": str(r),
                       "LOCAL_WORLD_SIZE": str(procs), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "OMP_NUM_THREADS": str(threads_per_rank)}
                with open(logs[r], "wb") as err:
                    children.append(subprocess.Popen([sys.executable, "-m", "simulator.distributed", *argv],
                                                     env=env, stderr=err, start_new_session=True))
            limit = timeout_s if marker is None else (12 * timeout_s if before_marker_s is None else before_marker_s)
            deadline = time.monotonic() + limit
            while True:
                if marker is not None and marker.exists():  # the local phase is over: the run's own limit starts
                    marker, limit = None, timeout_s
                    deadline = time.monotonic() + timeout_s
                codes = [p.poll() for p in children]
                failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    time.sleep(0.2)  # let the ranks that fail because of it report too, then blame the first
                    _kill_all(children)
                    codes = [p.poll() for p in children]
                    failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
                    r = min(failed, key=lambda k: (_failed_at(logs[k]), k))
                    raise RankFailure(f"rank {r} failed (exit {codes[r]}): {_last_line(logs[r])}", r)
                if all(c == 0 for c in codes):
                    return
                if time.monotonic() > deadline:
                    _kill_all(children)
                    phase = "" if marker is None else " before the ranks' local phase was done"
                    raise RankFailure(f"timed out after {limit:g} s{phase}; ranks still running: "
                                      f"{[r for r, c in enumerate(codes) if c is None]}", None)
                time.sleep(0.02)
        finally:
            _kill_all(children)
