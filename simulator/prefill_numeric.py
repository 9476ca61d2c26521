"""Numeric mode for prefill schedules: run a prefill :class:`Schedule` on arrays with the merge core, serially in op
id order, and compare its outputs (and, with a backward, dQ, dK, dV) to dense attention
(:mod:`simulator.dense`).

Buffers hold :class:`Rows`: rows of a (b, heads, tokens, ...) tensor with their global ``pos`` and first head
``h0`` (K and V, or dK and dV, travel together: ``arrays`` has two entries); a running state is a
:class:`StateRows`. The kernels are those of :mod:`simulator.algorithms.prefill.base`. Array-API generic through
the merge core (numpy here). These kernels live beside the decode executor's (``simulator.numeric``) until the
kernel registry gathers both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.dense import dense_backward, dense_forward, visible
from simulator.merge import (
    PartialState,
    attention_delta,
    block_backward,
    finalize,
    log_sum_exp,
    merge,
    partial_attention,
)
from simulator.schedule import Op, Schedule
from simulator.workloads.layouts import positions

__all__ = ["PrefillInputs", "PrefillResult", "Rows", "make_prefill_inputs", "run_prefill_numeric"]


@dataclass(frozen=True)
class Rows:
    """``arrays``: each (b, heads, len(pos), ...) for heads [h0, h0 + heads), rows at global positions ``pos``."""

    arrays: tuple[Any, ...]
    pos: np.ndarray
    h0: int

    @property
    def heads(self) -> int:
        return int(self.arrays[0].shape[1])

    def rows(self, lo: int, hi: int) -> Rows:
        return Rows(tuple(a[:, :, lo:hi] for a in self.arrays), self.pos[lo:hi], self.h0)

    def head_slice(self, lo: int, hi: int) -> Rows:
        return Rows(tuple(a[:, lo - self.h0:hi - self.h0] for a in self.arrays), self.pos, lo)


@dataclass(frozen=True)
class StateRows:
    state: PartialState
    pos: np.ndarray
    h0: int


@dataclass(frozen=True)
class PrefillInputs:
    q: np.ndarray  # (b, heads, n, d)
    k: np.ndarray  # (b, kv_heads, n, d)
    v: np.ndarray
    dout: np.ndarray  # (b, heads, n, d)
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


def _cat(xs: list[Any], axis: int) -> Any:
    return np.concatenate(xs, axis=axis)


def _concat(parts: list[Rows]) -> Rows:
    """Along heads when every part has the same rows (parts with equal heads summed: replicated KV heads' gradients);
    else along rows (the parts must then have the same heads)."""
    if len(parts) == 1 or not all(np.array_equal(p.pos, parts[0].pos) for p in parts):
        return Rows(tuple(_cat([p.arrays[i] for p in parts], 2) for i in range(len(parts[0].arrays))),
                    np.concatenate([p.pos for p in parts]), parts[0].h0)
    by_h0: dict[int, Rows] = {}
    for p in parts:
        prev = by_h0.get(p.h0)
        by_h0[p.h0] = p if prev is None else Rows(tuple(a + b for a, b in zip(prev.arrays, p.arrays, strict=True)),
                                                  p.pos, p.h0)
    ordered = [by_h0[h] for h in sorted(by_h0)]
    return Rows(tuple(_cat([p.arrays[i] for p in ordered], 1) for i in range(len(ordered[0].arrays))),
                ordered[0].pos, ordered[0].h0)


class PrefillExecutor:
    """Named per-rank buffers; ``run`` executes a whole schedule in id order."""

    def __init__(self, sched: Schedule, inp: PrefillInputs) -> None:
        self.inp = inp
        self.group = inp.q.shape[1] // inp.k.shape[1]
        self.buf: list[dict[str, Any]] = [{} for _ in range(sched.ranks)]
        self.in_flight: dict[int, tuple[Any, ...]] = {}
        for rank, names in sched.initial.items():
            pos = positions(sched.meta["runs"][rank])
            for name in names:
                if name == "q":
                    self.buf[rank][name] = Rows((inp.q[:, :, pos],), pos, 0)
                elif name == "dout":
                    self.buf[rank][name] = Rows((inp.dout[:, :, pos],), pos, 0)
                elif name.startswith("kv"):
                    self.buf[rank][name] = Rows((inp.k[:, :, pos], inp.v[:, :, pos]), pos, 0)
                else:
                    raise ValueError(f"rank {rank}: no numeric value for initial buffer {name!r}")
        self.kernels: dict[str, Callable[[dict[str, Any], Op], None]] = {
            "attn-fwd": self._fwd, "attn-final": self._final, "attn-delta": self._delta, "attn-bwd": self._bwd,
            "concat": lambda b, op: b.__setitem__(op.out, _concat([b[a] for a in op.args])),
            "slice-heads": lambda b, op: b.__setitem__(op.out, b[op.args[0]].head_slice(op.lo, op.hi)),
            "slice-rows": lambda b, op: b.__setitem__(op.out, b[op.args[0]].rows(op.lo, op.hi)),
            "add": self._add,
        }

    def _mask(self, q: Rows, kv: Rows) -> Any:
        if q.h0 // self.group < kv.h0 or (q.h0 + q.heads - 1) // self.group >= kv.h0 + kv.heads:
            raise ValueError(f"query heads from {q.h0} need KV heads the block does not hold (from {kv.h0})")
        return visible(q.pos, kv.pos, self.inp.causal)[None, None]

    def _kv_for(self, q: Rows, kv: Rows) -> tuple[Any, Any]:
        """The KV heads ``q``'s heads use, so that partial_attention's GQA grouping lines up."""
        lo, hi = q.h0 // self.group, (q.h0 + q.heads - 1) // self.group + 1
        sel = kv.head_slice(lo, hi)
        return sel.arrays[0], sel.arrays[1]

    def _fwd(self, b: dict[str, Any], op: Op) -> None:
        q, kv = b[op.args[0]], b[op.args[1]]
        k, v = self._kv_for(q, kv)
        part = partial_attention(q.arrays[0], k, v, self.inp.scale, self._mask(q, kv))
        prev = b.get(op.out)
        b[op.out] = StateRows(part if prev is None else merge(prev.state, part), q.pos, q.h0)

    def _final(self, b: dict[str, Any], op: Op) -> None:
        st = b.pop(op.args[0])
        b[op.out] = Rows((finalize(st.state),), st.pos, st.h0)
        b["lse"] = Rows((log_sum_exp(st.state),), st.pos, st.h0)

    def _delta(self, b: dict[str, Any], op: Op) -> None:
        out, dout = b[op.args[0]], b[op.args[1]]
        b[op.out] = Rows((attention_delta(out.arrays[0], dout.arrays[0]),), out.pos, out.h0)

    def _bwd(self, b: dict[str, Any], op: Op) -> None:
        q, kv, lse, delta, dout = (b[a] for a in op.args[:5])
        k, v = self._kv_for(q, kv)
        dq, dk, dv = block_backward(q.arrays[0], k, v, self.inp.scale, self._mask(q, kv), lse.arrays[0],
                                    delta.arrays[0], dout.arrays[0])
        prev = b.get(op.out)
        b[op.out] = Rows((dq if prev is None else prev.arrays[0] + dq,), q.pos, q.h0)
        kv_h0 = q.h0 // self.group
        prev_kv = b.get(op.args[5])
        grads = (dk, dv) if prev_kv is None else (prev_kv.arrays[0] + dk, prev_kv.arrays[1] + dv)
        b[op.args[5]] = Rows(grads, kv.pos, kv_h0)

    def _add(self, b: dict[str, Any], op: Op) -> None:
        got, own = b[op.args[0]], b[op.args[1]].rows(op.lo, op.hi)
        if not np.array_equal(got.pos, own.pos):
            raise ValueError(f"op #{op.id}: adding row blocks of different positions")
        b[op.out] = Rows(tuple(x + y for x, y in zip(got.arrays, own.arrays, strict=True)), own.pos, own.h0)

    def execute(self, op: Op) -> None:
        b = self.buf[op.rank]
        if op.kind == "send":
            vals = []
            for name in op.args:
                value = b[name]
                if op.fn == "heads":
                    value = value.head_slice(op.lo, op.hi)
                elif op.fn == "rows":
                    value = value.rows(op.lo, op.hi)
                vals.append(value)
            self.in_flight[op.id] = tuple(vals)
        elif op.kind == "recv":
            assert op.match is not None
            for name, value in zip(op.args, self.in_flight.pop(op.match), strict=True):
                b[name] = value
        elif op.kind != "launch":
            if op.fn not in self.kernels:
                raise ValueError(f"op #{op.id}: unknown prefill kernel {op.fn!r}; valid: {', '.join(self.kernels)}")
            self.kernels[op.fn](b, op)

    def run(self, sched: Schedule) -> None:
        for op in sched.ops:
            self.execute(op)


def _err(got: Rows, ref: np.ndarray, which: int = 0) -> float:
    arr = np.asarray(got.arrays[which], dtype=np.float64)
    want = ref[:, got.h0:got.h0 + got.heads][:, :, got.pos]
    return float(np.abs(arr - want).max()) if arr.size else 0.0


def run_prefill_numeric(sched: Schedule, inp: PrefillInputs) -> PrefillResult:
    """Execute ``sched``; the largest deviation of every output row (and gradient) from dense attention."""
    ex = PrefillExecutor(sched, inp)
    ex.run(sched)
    n = inp.q.shape[2]
    pos = np.arange(n)
    mask = visible(pos, pos, inp.causal)[None, None]
    out_ref, _ = dense_forward(inp.q, inp.k, inp.v, inp.scale, mask)
    err = max(_err(ex.buf[r][name], out_ref) for r, name in sched.meta["outputs"])
    _check_cover([ex.buf[r][name] for r, name in sched.meta["outputs"]], n, inp.q.shape[1])
    grad_err = 0.0
    if sched.meta.get("grads"):
        dq_ref, dk_ref, dv_ref = dense_backward(inp.q, inp.k, inp.v, inp.scale, mask, inp.dout)
        for r, dq_name, dkv_name in sched.meta["grads"]:
            dkv = ex.buf[r][dkv_name]
            grad_err = max(grad_err, _err(ex.buf[r][dq_name], dq_ref), _err(dkv, dk_ref, 0), _err(dkv, dv_ref, 1))
        _check_cover([ex.buf[r][name] for r, _, name in sched.meta["grads"]], n, inp.k.shape[1])
        _check_cover([ex.buf[r][name] for r, name, _ in sched.meta["grads"]], n, inp.q.shape[1])
    return PrefillResult(err, grad_err)


def _check_cover(blocks: list[Rows], n: int, heads: int) -> None:
    """The blocks hold every position once, with every head."""
    if sorted(int(x) for blk in blocks for x in blk.pos) != list(range(n)) or any(
            blk.h0 != 0 or blk.heads != heads for blk in blocks):
        raise ValueError("the outputs do not hold every position and head exactly once")
