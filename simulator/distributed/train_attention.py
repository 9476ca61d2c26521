"""A training step's attention over its CP group, run by the prefill schedules the simulator builds and times
(``ring``, ``allgather``, ``ulysses``, any layout), wrapped as a ``torch.autograd.Function`` so that the dense parts
around it differentiate by autograd.

Forward: the schedule of the shape without a backward; backward: the schedule with one (its forward then its
backward, as ``recompute: selective`` runs it: the simulator then adds the attention's forward to the backward).
Each runs on this rank through :class:`~simulator.distributed.runner.PrefillRankRunner` (the merge core, sends and
receives between the CP group's process ranks), on the rows of the rank's positions in the layout (handed over as
they are, ``own_rows``: no whole-sequence tensor); the schedules are built once per shape, and each keeps one pool
of receive buffers for the life of the run (as the prefill validation's ``timed_iterations`` does), so that calls
after the first reuse them. On one CP rank the schedule runs alone (no transfers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from simulator.algorithms import Layout
from simulator.algorithms.prefill import build_prefill
from simulator.distributed.runner import PrefillRankRunner
from simulator.kernels.payload import transfer_layouts
from simulator.kernels.prefill import Rows
from simulator.numeric.prefill import PrefillInputs
from simulator.schedule.core import Schedule
from simulator.workloads.layouts import positions
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["CPAttention"]


class CPAttention:
    """Attention of one TP rank's heads over a CP group: ``peers`` are the group's process ranks in CP order,
    ``cp_rank`` this rank's place in it, ``hosts`` the host of each (the schedule's layout)."""

    def __init__(self, algorithm: str, shape: PrefillShape, cp_rank: int, peers: Sequence[int],
                 hosts: Sequence[int], device: torch.device) -> None:
        layout = Layout(tuple(hosts))
        self.forward_sched = build_prefill(algorithm, {}, dataclasses.replace(shape, backward=False), layout)
        self.both_sched = build_prefill(algorithm, {}, dataclasses.replace(shape, backward=True), layout)
        self.layouts = {id(s): transfer_layouts(s, s.meta["shape"]) for s in (self.forward_sched, self.both_sched)}
        # receive buffers kept across calls, one pool per schedule: a call's results are copied out (_rows) before
        # the next call's receives overwrite them
        self.pools: dict[int, dict[Any, torch.Tensor]] = {id(s): {} for s in (self.forward_sched, self.both_sched)}
        self.rank, self.peers, self.device = cp_rank, tuple(peers), device
        self.n, self.scale = shape.sequence, 1.0 / float(shape.head_dim) ** 0.5
        self.pos = np.asarray(positions(self.forward_sched.meta["runs"][cp_rank]), dtype=np.int64)
        self.local = np.full(self.n, -1, dtype=np.int64)  # global position -> row of this rank
        self.local[self.pos] = np.arange(len(self.pos))

    @property
    def positions(self) -> torch.Tensor:
        """The global positions of this rank's rows, in its order."""
        return torch.from_numpy(self.pos)

    def _rows(self, block: Rows, which: int) -> torch.Tensor:
        """Array ``which`` of a block of this rank's positions, in this rank's row order (a copy: the block may be a
        view of a pooled receive buffer)."""
        arr = block.arrays[which]
        if block.h0 != 0:
            raise ValueError("an attention block does not start at head 0")
        out = torch.empty_like(arr)
        out[:, :, torch.from_numpy(self.local[np.asarray(block.pos, dtype=np.int64)])] = arr
        return out

    def _run(self, sched: Schedule, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor
             ) -> dict[str, Any]:
        inp = PrefillInputs(q, k, v, dout, self.scale, True)  # this rank's rows, in the order of self.pos
        return PrefillRankRunner(sched, inp, self.rank, self.layouts[id(sched)], self.device,
                                 pool=self.pools[id(sched)], peers=self.peers, own_rows=True).run_rank()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention output of this rank's rows, (b, heads, rows, d)."""
        bufs = self._run(self.forward_sched, q, k, v, q)  # (no dO in a forward: q stands in, unread)
        (name,) = [n for r, n in self.forward_sched.meta["outputs"] if r == self.rank]
        return self._rows(bufs[name], 0)

    def backward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dQ, dK, dV) of this rank's rows."""
        bufs = self._run(self.both_sched, q, k, v, dout)
        (dq, dkv), = [(a, b) for r, a, b in self.both_sched.meta["grads"] if r == self.rank]
        return self._rows(bufs[dq], 0), self._rows(bufs[dkv], 0), self._rows(bufs[dkv], 1)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Attention.apply(q, k, v, self)
        return out


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn: CPAttention) -> torch.Tensor:
        ctx.save_for_backward(q, k, v)
        ctx.attn = attn
        return attn.forward(q, k, v)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        q, k, v = ctx.saved_tensors
        dq, dk, dv = ctx.attn.backward(q, k, v, dout.contiguous())
        return dq, dk, dv, None
