"""A training step's attention over its CP group, run by the prefill schedules the simulator builds and times
(``ring``, ``allgather``, ``ulysses``, any layout), wrapped as a ``torch.autograd.Function`` so that the dense parts
around it differentiate by autograd.

Forward: the schedule of the shape without a backward; backward: the schedule with one (its forward then its
backward, as ``recompute: selective`` runs it: the simulator then adds the attention's forward to the backward).
Each runs on this rank through :class:`~simulator.distributed.runner.PrefillRankRunner` (the merge core, sends and
receives between the CP group's process ranks), on the rows of the rank's positions in the layout; the
schedules are built once per shape. On one CP rank the schedule runs alone (no transfers).
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
        self.rank, self.peers, self.device = cp_rank, tuple(peers), device
        self.n, self.scale = shape.sequence, 1.0 / float(shape.head_dim) ** 0.5
        self.pos = np.asarray(positions(self.forward_sched.meta["runs"][cp_rank]), dtype=np.int64)
        self.local = np.full(self.n, -1, dtype=np.int64)  # global position -> row of this rank
        self.local[self.pos] = np.arange(len(self.pos))

    @property
    def positions(self) -> torch.Tensor:
        """The global positions of this rank's rows, in its order."""
        return torch.from_numpy(self.pos)

    def _whole(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows placed at their positions of the whole sequence (the runner takes them from there)."""
        full = torch.zeros(*x.shape[:2], self.n, x.shape[3], dtype=x.dtype, device=x.device)
        full[:, :, torch.from_numpy(self.pos)] = x
        return full

    def _rows(self, block: Rows, which: int) -> torch.Tensor:
        """Array ``which`` of a block of this rank's positions, in this rank's row order."""
        arr = block.arrays[which]
        if block.h0 != 0:
            raise ValueError("an attention block does not start at head 0")
        out = torch.empty_like(arr)
        out[:, :, torch.from_numpy(self.local[np.asarray(block.pos, dtype=np.int64)])] = arr
        return out

    def _run(self, sched: Schedule, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor
             ) -> dict[str, Any]:
        inp = PrefillInputs(self._whole(q), self._whole(k), self._whole(v), self._whole(dout), self.scale, True)
        return PrefillRankRunner(sched, inp, self.rank, self.layouts[id(sched)], self.device,
                                 peers=self.peers).run_rank()

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
