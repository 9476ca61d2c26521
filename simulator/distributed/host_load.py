"""Load on a host's other cores while a kernel is profiled: the same call, run by as many processes as will share
the host with the timed rank.

Ranks that share a host's cores (the CPU processes of a local validation) run the schedules in lockstep: when one
attends its KV shard, the others attend theirs at the same moment, and the kernels slow each other through the
memory system they share (caches, memory bandwidth, the bf16 conversions' traffic). Timed alone, a kernel misses
that: on this project's 2-CPU VM, attend ran up to 1.44x slower with a second copy on the other core, by a factor
that depends on the shape and the dtype (1.0-1.2 in fp32 and fp64, 1.0-1.44 in bf16), which no one host-wide
memory bandwidth reproduces. :class:`HostLoad` starts ``copies - 1`` processes; before each profiled point they
build the same call (:func:`simulator.distributed.profile_kernels.build_point`, in
:mod:`simulator.distributed.load_worker`) and run it back to back until the
point is timed. The profile records how many copies ran (``loaded``), and the engine then does not also share the
host's memory bandwidth among those kernels (:mod:`simulator.engine.host`).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from types import TracebackType

__all__ = ["HostLoad"]

_TIMEOUT_S = 300.0  # a loading process that does not answer within this is dead or stuck


class HostLoad:
    """``copies - 1`` processes that run the call being profiled on the host's other cores (a context manager)."""

    def __init__(self, copies: int) -> None:
        if copies < 1:
            raise ValueError(f"copies must be >= 1, got {copies}")
        self.copies = copies
        self._conns: list[Connection] = []
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> HostLoad:
        for _ in range(self.copies - 1):  # processes of their own (not multiprocessing's: no __main__ re-import)
            ours, theirs = socket.socketpair()
            proc = subprocess.Popen([sys.executable, "-m", "simulator.distributed.load_worker", str(theirs.fileno())],
                                    pass_fds=(theirs.fileno(),))
            theirs.close()
            self._conns.append(Connection(ours.detach()))
            self._procs.append(proc)
        return self

    def start(self, kernel: str, dtype: str, point: tuple[float, ...]) -> None:
        """Every loading process builds ``kernel`` at ``point`` and runs it; returns once all are running."""
        self.request(kernel, dtype, point)
        self.wait_running()

    def request(self, kernel: str, dtype: str, point: tuple[float, ...]) -> None:
        """Every loading process starts building ``kernel`` at ``point`` (then runs it); returns at once, so that
        the caller builds its own copy meanwhile. :meth:`wait_running` waits for them."""
        for conn in self._conns:
            conn.send((kernel, dtype, tuple(float(x) for x in point)))

    def wait_running(self) -> None:
        """Returns once every loading process runs the call last requested."""
        self._answers("running")

    def stop(self) -> None:
        """Every loading process stops after its current call; returns once all have."""
        for conn in self._conns:
            conn.send("stop")
        self._answers("stopped")

    def _answers(self, expected: str) -> None:
        for conn in self._conns:
            if not conn.poll(_TIMEOUT_S):
                raise RuntimeError(f"a process loading the host did not answer within {_TIMEOUT_S:.0f} s")
            got = conn.recv()
            if got != expected:
                raise RuntimeError(f"a process loading the host failed: {got}")

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self._procs:
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
