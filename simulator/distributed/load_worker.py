"""One process loading a host's other cores while a kernel is profiled
(:class:`simulator.distributed.host_load.HostLoad` starts it as ``python -m simulator.distributed.load_worker FD``):
it builds the call it is asked for, says so, and
runs it back to back until told to stop."""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

import torch

from simulator.distributed.profile_kernels import build_point

__all__: list[str] = []


def _run(conn: Connection) -> None:
    """The loading process: build the call asked for, say so, run it until told to stop."""
    torch.set_num_threads(1)  # one core, as each rank of a local run
    while True:
        msg = conn.recv()
        if msg is None:
            return
        if msg == "stop":  # a stop for a point whose start failed
            conn.send("stopped")
            continue
        try:
            kernel, dtype, point = msg
            fn = build_point(kernel, dtype, point, torch.device("cpu"))
            fn()
        except Exception as err:  # reported to the profiling rank, which raises it
            conn.send(f"{type(err).__name__}: {err}")
            continue
        conn.send("running")
        while not conn.poll():
            fn()
        if conn.recv() is None:
            return
        conn.send("stopped")
        del fn


if __name__ == "__main__":
    _run(Connection(int(sys.argv[1])))
