"""Numeric mode: execute a schedule on real arrays with the merge core, in the schedule's own order.

Ops run serially in id order (a valid topological order: deps only name earlier ops). Array-API generic: with
numpy inputs it runs on numpy, with torch tensors on torch (the real runner subclasses :class:`Executor` and
replaces the transfers by ``torch.distributed`` calls). Each rank has named
buffers; a send copies its ``args`` buffers (the ``lo:hi`` slice of flat buffers), its recv stores them. Compute
ops run their kernel from the one table of :mod:`simulator.kernels.table`, which the real runner shares.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_compat import array_namespace

from simulator.kernels.decode import KVShard, state_of
from simulator.merge import PartialState
from simulator.numeric.executor import Executor as BaseExecutor
from simulator.schedule.core import Op, Schedule

__all__ = ["Executor", "Inputs", "KVShard", "NumericResult", "dense_attention", "make_inputs", "max_abs_error",
           "run_numeric"]


@dataclass(frozen=True)
class Inputs:
    """Attention inputs (numpy arrays or torch tensors)."""

    q: Any  # (b, heads, 1, head_dim)
    k: Any  # (b, kv_heads, context, head_dim)
    v: Any
    mask: Any | None  # (b, context), True = attend
    scale: float

    def to(self, convert: Any) -> Inputs:
        """The same inputs with every array passed through ``convert`` (e.g. ``torch.from_numpy``)."""
        mask = None if self.mask is None else convert(self.mask)
        return Inputs(convert(self.q), convert(self.k), convert(self.v), mask, self.scale)


@dataclass(frozen=True)
class NumericResult:
    """The outputs of a numeric execution (rank -> array) and their largest error against dense attention."""

    outputs: dict[int, Any]  # rank -> final output (b, heads, 1, head_dim), numpy or torch
    max_abs_err: float


def make_inputs(rng: np.random.Generator, batch: int, heads: int, kv_heads: int, head_dim: int, context: int,
                dtype: Any = np.float64, mask: np.ndarray | None = None) -> Inputs:
    """Random q, k, v from a seeded generator (scores of order 1, as after a 1/sqrt(d) scale)."""
    q = rng.standard_normal((batch, heads, 1, head_dim)).astype(dtype)
    k = rng.standard_normal((batch, kv_heads, context, head_dim)).astype(dtype)
    v = rng.standard_normal((batch, kv_heads, context, head_dim)).astype(dtype)
    return Inputs(q, k, v, mask, 1.0 / math.sqrt(head_dim))


def _float64(x: Any) -> np.ndarray:
    """An array as numpy float64 (torch tensors of any dtype too: numpy cannot take bf16)."""
    if not isinstance(x, np.ndarray) and hasattr(x, "double") and hasattr(x, "cpu"):
        x = x.double().cpu()
    return np.asarray(x, dtype=np.float64)


def dense_attention(inp: Inputs) -> np.ndarray:
    """Single-device softmax attention in float64, independent of the merge core (the reference)."""
    q, k, v = (_float64(x) for x in (inp.q, inp.k, inp.v))
    b, heads, nq, d = q.shape
    kv_heads = k.shape[1]
    qg = q.reshape(b, kv_heads, heads // kv_heads, nq, d)  # query heads grouped by their KV head (no K/V copies)
    s = np.einsum("bkgqd,bktd->bkgqt", qg, k) * inp.scale
    if inp.mask is not None:
        s = np.where(np.asarray(inp.mask)[:, None, None, None, :], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isinf(m), 0.0, m))
    l = p.sum(axis=-1, keepdims=True)
    out = np.where(l > 0, np.einsum("bkgqt,bktd->bkgqd", p, v) / np.where(l > 0, l, 1.0), 0.0)
    return out.reshape(b, heads, nq, d)


class Executor(BaseExecutor):
    """The decode executor: buffers of a query, KV shards, partial states and flat vectors."""

    def __init__(self, sched: Schedule, inp: Inputs) -> None:
        super().__init__(sched)
        self.inp = inp
        self.xp = array_namespace(inp.q)
        shards = sched.meta.get("shards", [])
        for rank, names in sched.initial.items():
            for name in names:
                if name == "q":
                    self.buf[rank]["q"] = inp.q
                elif name.startswith("kv"):
                    lo, hi = shards[rank]
                    self.buf[rank][name] = KVShard(inp.k[:, :, lo:hi], inp.v[:, :, lo:hi], lo, hi)
                else:
                    raise ValueError(f"rank {rank}: no numeric value for initial buffer {name!r}")
        q = inp.q
        self.scale, self.mask = inp.scale, inp.mask
        self.o_shape, self.ml_shape = tuple(q.shape), tuple(q.shape[:-1])
        self._grown: set[tuple[int, str]] = set()  # (rank, buffer) transport buffers made by :meth:`store`

    def state(self, value: Any) -> PartialState:
        return state_of(value)

    def payload(self, op: Op) -> tuple[Any, ...]:
        """What a send carries: its buffers, flat ones sliced to ``lo:hi`` and copied."""
        vals = []
        for name in op.args:
            value = self.buf[op.rank][name]
            if not isinstance(value, (PartialState, KVShard)):
                value = self.xp.asarray(value[op.lo:op.hi] if op.hi >= 0 else value, copy=True)
            vals.append(value)
        return tuple(vals)

    def store(self, op: Op, vals: tuple[Any, ...]) -> None:
        """What a recv does with the values that arrived. Slices ``into`` a buffer the rank does not hold (an
        NVSwitch reducing in the network, NVLS) land in a transport buffer that grows to hold them."""
        for name, value in zip(op.args, vals, strict=True):
            if op.into:
                held = self.buf[op.rank].get(name)
                if held is None or ((op.rank, name) in self._grown and len(held) < op.hi):
                    grown = self.xp.zeros(op.hi, dtype=value.dtype)
                    if held is not None:
                        grown[:len(held)] = held
                    self.buf[op.rank][name] = grown
                    self._grown.add((op.rank, name))
                self.buf[op.rank][name][op.lo:op.hi] = value
            else:
                self.buf[op.rank][name] = value



def run_numeric(sched: Schedule, inp: Inputs) -> NumericResult:
    """Execute ``sched`` on ``inp``; compare every declared output (``meta['outputs']``) to dense attention."""
    ex = Executor(sched, inp)
    ex.run(sched)
    outputs = {rank: ex.buf[rank][name] for rank, name in sched.meta["outputs"]}
    return NumericResult(outputs, max_abs_error(outputs.values(), dense_attention(inp)))


def max_abs_error(outputs: Iterable[Any], reference: np.ndarray) -> float:
    """Largest absolute difference of any output (numpy or torch, any float dtype) from the float64 reference."""
    err = 0.0
    for out in outputs:
        arr = _float64(out)
        if arr.size:
            err = max(err, float(np.abs(arr - reference).max()))
    return err
