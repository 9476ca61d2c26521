"""Numeric mode: execute a schedule on real arrays with the merge core, in the schedule's own order.

Ops run serially in id order (a valid topological order: deps only name earlier ops). Array-API generic: with
numpy inputs it runs on numpy, with torch tensors on torch (the real runner subclasses :class:`Executor` and
replaces the transfers by ``torch.distributed`` calls). Each rank has named
buffers; a send copies its ``args`` buffers (the ``lo:hi`` slice of flat buffers), its recv stores them. Compute
ops apply ``fn``:

============  =====================================================================================
``attend``    ``out = merge(out, partial_attention(q, kv))`` (``out`` absent: the partial itself); args (q, kv)
``merge``     ``out = merge(out, arg)``
``pack-m``    ``out = flat copy of state(arg).m``
``rescale``   ``out = flat (o, l) of rescale(state(args[0]), m = args[1])``
``finalize``  ``out = finalize(state(arg))``
``finalize-flat``  ``out = finalize`` of the flat (o, l) ``args[0]`` with flat m ``args[1]``
``reduce-sum`` / ``reduce-max``  ``out[lo:hi] = out[lo:hi] (+ | max) arg``
``copy``      ``out = arg``
============  =====================================================================================
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_compat import array_namespace

from simulator.merge import PartialState, finalize, merge, partial_attention, rescale
from simulator.schedule import Op, Schedule

__all__ = ["Executor", "Inputs", "KVShard", "NumericResult", "dense_attention", "make_inputs", "max_abs_error",
           "run_numeric"]


@dataclass(frozen=True)
class KVShard:
    """Keys and values of context positions ``[lo, hi)``: ``k``, ``v`` (b, kv_heads, hi - lo, head_dim).

    ``packed``, when set, is one contiguous array (2, b, kv_heads, hi - lo, head_dim) of which ``k`` and ``v`` are
    views: how a rank holds its KV cache, and what a real transfer sends without copying.
    """

    k: Any
    v: Any
    lo: int
    hi: int
    packed: Any = None

    @classmethod
    def from_packed(cls, packed: Any, lo: int, hi: int) -> KVShard:
        return cls(packed[0], packed[1], lo, hi, packed)

    def copy(self) -> KVShard:
        xp = array_namespace(self.k)
        if self.packed is not None:
            return KVShard.from_packed(xp.asarray(self.packed, copy=True), self.lo, self.hi)
        return KVShard(xp.asarray(self.k, copy=True), xp.asarray(self.v, copy=True), self.lo, self.hi)


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
    outputs: dict[int, Any]  # rank -> final output (b, heads, 1, head_dim), numpy or torch
    max_abs_err: float


def make_inputs(rng: np.random.Generator, batch: int, heads: int, kv_heads: int, head_dim: int, context: int,
                dtype: Any = np.float64, mask: np.ndarray | None = None) -> Inputs:
    """Random q, k, v from a seeded generator (scores of order 1, as after a 1/sqrt(d) scale)."""
    q = rng.standard_normal((batch, heads, 1, head_dim)).astype(dtype)
    k = rng.standard_normal((batch, kv_heads, context, head_dim)).astype(dtype)
    v = rng.standard_normal((batch, kv_heads, context, head_dim)).astype(dtype)
    return Inputs(q, k, v, mask, 1.0 / math.sqrt(head_dim))


def dense_attention(inp: Inputs) -> np.ndarray:
    """Single-device softmax attention in float64, independent of the merge core (the reference)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (inp.q, inp.k, inp.v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("bhqd,bhtd->bhqt", q, k) * inp.scale
    if inp.mask is not None:
        s = np.where(np.asarray(inp.mask)[:, None, None, :], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isinf(m), 0.0, m))
    l = p.sum(axis=-1, keepdims=True)
    return np.where(l > 0, (p @ v) / np.where(l > 0, l, 1.0), 0.0)


class Executor:
    """Runs ops on named per-rank buffers; ``run`` executes a whole schedule serially in id order."""

    def __init__(self, sched: Schedule, inp: Inputs) -> None:
        self.inp = inp
        self.xp = array_namespace(inp.q)
        self.buf: list[dict[str, Any]] = [{} for _ in range(sched.ranks)]
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
        self.o_shape, self.ml_shape = tuple(q.shape), tuple(q.shape[:-1])
        self.in_flight: dict[int, tuple[Any, ...]] = {}

    def state(self, value: Any) -> PartialState:
        if not isinstance(value, PartialState):
            raise TypeError(f"expected a partial state, got {type(value).__name__}")
        return value

    def attend(self, rank: int, op: Op) -> None:
        q, kv = (self.buf[rank][a] for a in op.args)
        mask = None if self.inp.mask is None else self.inp.mask[:, None, None, kv.lo:kv.hi]
        part = partial_attention(q, kv.k, kv.v, self.inp.scale, mask)
        prev = self.buf[rank].get(op.out)
        self.buf[rank][op.out] = part if prev is None else merge(prev, part)

    def compute(self, op: Op) -> None:
        b = self.buf[op.rank]
        fn = op.fn
        xp = self.xp
        if fn == "attend":
            self.attend(op.rank, op)
        elif fn == "merge":
            b[op.out] = merge(self.state(b[op.out]), self.state(b[op.args[0]]))
        elif fn == "pack-m":
            b[op.out] = xp.asarray(xp.reshape(self.state(b[op.args[0]]).m, (-1,)), copy=True)
        elif fn == "rescale":
            st = rescale(self.state(b[op.args[0]]), xp.reshape(b[op.args[1]], self.ml_shape))
            b[op.out] = xp.concat([xp.reshape(st.o, (-1,)), xp.reshape(st.l, (-1,))])
        elif fn == "finalize":
            b[op.out] = finalize(self.state(b[op.args[0]]))
        elif fn == "finalize-flat":
            flat, m = b[op.args[0]], b[op.args[1]]
            n_o = math.prod(self.o_shape)
            st = PartialState(xp.reshape(flat[:n_o], self.o_shape), xp.reshape(flat[n_o:], self.ml_shape),
                              xp.reshape(m, self.ml_shape))
            b[op.out] = finalize(st)
        elif fn in ("reduce-sum", "reduce-max"):
            target, operand = b[op.out], b[op.args[0]]
            if fn == "reduce-sum":
                target[op.lo:op.hi] = target[op.lo:op.hi] + operand
            else:
                target[op.lo:op.hi] = xp.maximum(target[op.lo:op.hi], operand)
        elif fn == "copy":
            src = b[op.args[0]]
            b[op.out] = src.copy() if isinstance(src, KVShard) else xp.asarray(src, copy=True)
        elif fn:
            raise ValueError(f"op #{op.id}: unknown numeric function {fn!r}")

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
        """What a recv does with the values that arrived."""
        for name, value in zip(op.args, vals, strict=True):
            if op.fn == "into":
                self.buf[op.rank][name][op.lo:op.hi] = value
            else:
                self.buf[op.rank][name] = value

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
        arr = np.asarray(out, dtype=np.float64)
        if arr.size:
            err = max(err, float(np.abs(arr - reference).max()))
    return err
