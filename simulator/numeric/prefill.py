"""Numeric mode for prefill schedules: run a prefill :class:`Schedule` on arrays with the merge core, serially in op
id order, and compare its outputs (and, with a backward, dQ, dK, dV) to dense attention
(:mod:`simulator.kernels.dense`).

Buffers hold row blocks (:class:`simulator.kernels.prefill.Rows`); compute ops run their kernel from the one table,
:data:`simulator.kernels.table.KERNELS` (the prefill ones are in :mod:`simulator.kernels.prefill`); a send carries its
buffers whole (pieces are cut by ``slice-heads`` / ``slice-rows`` kernels first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.kernels.dense import dense_backward, dense_forward, visible
from simulator.kernels.prefill import Rows
from simulator.numeric.executor import Executor
from simulator.schedule.core import Op, Schedule
from simulator.workloads.layouts import positions

__all__ = ["PrefillExecutor", "PrefillInputs", "PrefillResult", "block_error", "check_cover", "make_prefill_inputs",
           "run_prefill_numeric"]


@dataclass(frozen=True)
class PrefillInputs:
    """Inputs of a prefill (numpy arrays; torch tensors in real runs)."""

    q: Any  # (b, heads, n, d)
    k: Any  # (b, kv_heads, n, d)
    v: Any
    dout: Any  # (b, heads, n, d)
    scale: float
    causal: bool


@dataclass(frozen=True)
class PrefillResult:
    max_abs_err: float  # output
    max_grad_err: float  # dq, dk, dv (0 without a backward)


def make_prefill_inputs(rng: np.random.Generator, batch: int, heads: int, kv_heads: int, head_dim: int, n: int,
                        causal: bool, dtype: Any = np.float64) -> PrefillInputs:
    def draw(h: int) -> np.ndarray:
        return rng.standard_normal((batch, h, n, head_dim)).astype(dtype)
    return PrefillInputs(draw(heads), draw(kv_heads), draw(kv_heads), draw(heads), 1.0 / float(np.sqrt(head_dim)),
                         causal)


class PrefillExecutor(Executor):
    """The prefill executor: buffers of row blocks (:class:`~simulator.kernels.prefill.Rows`) and running states."""

    def __init__(self, sched: Schedule, inp: PrefillInputs, only: int | None = None) -> None:
        """``inp``: numpy arrays or torch tensors; ``only``: set up only this rank's buffers (a real run's rank)."""
        super().__init__(sched)
        self.inp = inp
        self.scale, self.causal = inp.scale, inp.causal
        self.group = inp.q.shape[1] // inp.k.shape[1]
        keys = sched.meta.get("kv_runs", sched.meta["runs"])  # a cached prefix: the cached then the new positions
        for rank, names in sched.initial.items():
            if only is not None and rank != only:
                continue
            pos = positions(sched.meta["runs"][rank])
            kpos = positions(keys[rank])
            for name in names:
                if name == "q":
                    self.buf[rank][name] = Rows((inp.q[:, :, pos],), pos, 0)
                elif name == "dout":
                    self.buf[rank][name] = Rows((inp.dout[:, :, pos],), pos, 0)
                elif name.startswith("kv"):
                    self.buf[rank][name] = Rows((inp.k[:, :, kpos], inp.v[:, :, kpos]), kpos, 0)
                else:
                    raise ValueError(f"rank {rank}: no numeric value for initial buffer {name!r}")

    def payload(self, op: Op) -> tuple[Any, ...]:
        """What a send carries: its buffers, whole."""
        if op.hi >= 0:
            raise ValueError(f"op #{op.id}: prefill sends carry whole buffers, not slices")
        return tuple(self.buf[op.rank][name] for name in op.args)

    def store(self, op: Op, vals: tuple[Any, ...]) -> None:
        """What a recv does with the values that arrived: they become its buffers."""
        if op.into:
            raise ValueError(f"op #{op.id}: prefill receives replace whole buffers")
        for name, value in zip(op.args, vals, strict=True):
            self.buf[op.rank][name] = value



def block_error(got: Rows, ref: np.ndarray, which: int = 0) -> float:
    """Largest |difference| of array ``which`` of a row block from the same rows and heads of ``ref``."""
    arr = np.asarray(got.arrays[which], dtype=np.float64)
    want = ref[:, got.h0:got.h0 + got.heads][:, :, got.pos]
    return float(np.abs(arr - want).max()) if arr.size else 0.0


def run_prefill_numeric(sched: Schedule, inp: PrefillInputs) -> PrefillResult:
    """Execute ``sched``; the largest deviation of every output row (and gradient) from dense attention.

    On a cached prefix (``meta['shape'].cached`` C) the inputs hold every position, cached ones first (the queries
    of the cached positions are not used), and the outputs are the rows of the new positions C.."""
    ex = PrefillExecutor(sched, inp)
    ex.run(sched)
    n = inp.q.shape[2]
    shape = sched.meta.get("shape")
    cached = int(getattr(shape, "cached", 0) or 0)
    pos = np.arange(n)
    mask = visible(pos, pos, inp.causal)[None, None]
    out_ref, _ = dense_forward(inp.q, inp.k, inp.v, inp.scale, mask)
    err = max(block_error(ex.buf[r][name], out_ref) for r, name in sched.meta["outputs"])
    check_cover([ex.buf[r][name] for r, name in sched.meta["outputs"]], n, inp.q.shape[1], start=cached)
    grad_err = 0.0
    if sched.meta.get("grads"):
        dq_ref, dk_ref, dv_ref = dense_backward(inp.q, inp.k, inp.v, inp.scale, mask, inp.dout)
        for r, dq_name, dkv_name in sched.meta["grads"]:
            dkv = ex.buf[r][dkv_name]
            grad_err = max(grad_err, block_error(ex.buf[r][dq_name], dq_ref), block_error(dkv, dk_ref, 0),
                           block_error(dkv, dv_ref, 1))
        check_cover([ex.buf[r][name] for r, _, name in sched.meta["grads"]], n, inp.k.shape[1])
        check_cover([ex.buf[r][name] for r, name, _ in sched.meta["grads"]], n, inp.q.shape[1])
    return PrefillResult(err, grad_err)


def check_cover(blocks: list[Rows], n: int, heads: int, start: int = 0) -> None:
    """The blocks hold every position from ``start`` to ``n`` once, with every head."""
    if sorted(int(x) for blk in blocks for x in blk.pos) != list(range(start, n)) or any(
            blk.h0 != 0 or blk.heads != heads for blk in blocks):
        raise ValueError("the outputs do not hold every position and head exactly once")
