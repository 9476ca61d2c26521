"""The one executor of schedules on arrays: named per-rank buffers, ops run serially in id order (a valid
topological order: deps only name earlier ops), transfers as hand-overs of values, compute ops through the kernel
table (:data:`simulator.kernels.table.KERNELS`).

Decode (:class:`simulator.numeric.decode.Executor`) and prefill (:class:`simulator.numeric.prefill.PrefillExecutor`)
executors differ only in how a rank's buffers start and in what a send carries and a receive stores
(:meth:`Executor.payload`, :meth:`Executor.store`); the real runner (:mod:`simulator.distributed.runner`) replaces
:meth:`send` and :meth:`recv` by ``torch.distributed`` calls and keeps the rest.
"""

from __future__ import annotations

from typing import Any

from simulator.kernels.table import kernel
from simulator.schedule.core import Op, Schedule

__all__ = ["Executor"]


class Executor:
    """Runs ops on named per-rank buffers (``buf[rank][name]``); ``run`` executes a whole schedule in id order."""

    def __init__(self, sched: Schedule) -> None:
        self.buf: list[dict[str, Any]] = [{} for _ in range(sched.ranks)]
        self.in_flight: dict[int, tuple[Any, ...]] = {}  # send op id -> the values it carries, until received

    def payload(self, op: Op) -> tuple[Any, ...]:
        """What send ``op`` carries."""
        raise NotImplementedError

    def store(self, op: Op, vals: tuple[Any, ...]) -> None:
        """What receive ``op`` does with the values that arrived."""
        raise NotImplementedError

    def compute(self, op: Op) -> None:
        """Run the op's kernel (a compute op without one, a placeholder, does nothing)."""
        if op.fn:
            kernel(op.fn).run(self, op)

    def send(self, op: Op) -> None:
        self.in_flight[op.id] = self.payload(op)

    def recv(self, op: Op) -> None:
        assert op.match is not None
        self.store(op, self.in_flight.pop(op.match))

    def execute(self, op: Op) -> None:
        """Run one op (a launch only marks the start of a communication operation: nothing to compute)."""
        if op.kind == "send":
            self.send(op)
        elif op.kind == "recv":
            self.recv(op)
        elif op.kind != "launch":
            self.compute(op)

    def run(self, sched: Schedule) -> None:
        for op in sched.ops:
            self.execute(op)
