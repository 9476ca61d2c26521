"""The prefill kernels (``Op.fn`` of :mod:`simulator.algorithms.prefill`): their numeric semantics on row blocks.

Registered in the one kernel table, :data:`simulator.kernels.KERNELS`. Buffers hold :class:`Rows`: rows of a
(b, heads, tokens, ...) tensor with their global positions ``pos`` and first head ``h0`` (K and V, or dK and dV,
travel together: ``arrays`` has two entries); a running state is a :class:`StateRows`. Masks are by global
position. The executor (:class:`PrefillBuffers`) supplies ``scale``, ``causal`` and ``group`` (query heads per KV
head of the whole model).

==============  ===================================================================================================
``attn-fwd``    ``out = merge(out, partial_attention(q, kv))``; args (q, kv)
``attn-final``  ``out = finalize(state)`` and ``lse = log_sum_exp(state)``; args (state,)
``attn-delta``  ``out = rowsum(o * do)``; args (o, do)
``attn-bwd``    ``out (dq) += dq_blk``, ``args[5] (dkv) += (dk_blk, dv_blk)``; args (q, kv, lse, delta, do, dkv)
``concat``      ``out`` = the blocks side by side: along heads when they hold the same rows (equal heads summed),
                else along rows
``slice-heads`` ``out`` = heads [lo, hi) of ``args[0]``;  ``slice-rows``: its rows [lo, hi)
``add``         ``out = args[0] + rows [lo, hi) of args[1]``
==============  ===================================================================================================

Costs come from :class:`~simulator.workloads.prefill_shape.PrefillShape` (a block's unmasked pairs), not from a
decode shape. Array-API generic through the merge core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from simulator.dense import visible
from simulator.merge import (
    PartialState,
    attention_delta,
    block_backward,
    finalize,
    log_sum_exp,
    merge,
    partial_attention,
)
from simulator.schedule import Op

__all__ = ["PREFILL_KERNELS", "PrefillBuffers", "Rows", "StateRows"]

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


@runtime_checkable
class PrefillBuffers(Protocol):
    """What a prefill kernel sees of an executor."""

    buf: list[dict[str, Any]]
    scale: float
    causal: bool
    group: int


def _ctx(ex: Any) -> PrefillBuffers:
    if not isinstance(ex, PrefillBuffers):
        raise TypeError(f"a prefill kernel needs a prefill executor (scale, causal, group), got {type(ex).__name__}")
    return ex


def _mask(ex: PrefillBuffers, q: Rows, kv: Rows) -> Any:
    if q.h0 // ex.group < kv.h0 or (q.h0 + q.heads - 1) // ex.group >= kv.h0 + kv.heads:
        raise ValueError(f"query heads from {q.h0} need KV heads the block does not hold (from {kv.h0})")
    return visible(q.pos, kv.pos, ex.causal)[None, None]


def _kv_for(ex: PrefillBuffers, q: Rows, kv: Rows) -> tuple[Any, Any]:
    """The KV heads ``q``'s heads use, so that partial_attention's GQA grouping lines up."""
    sel = kv.head_slice(q.h0 // ex.group, (q.h0 + q.heads - 1) // ex.group + 1)
    return sel.arrays[0], sel.arrays[1]


def _fwd(ex_: Any, op: Op) -> None:
    ex = _ctx(ex_)
    b = ex.buf[op.rank]
    q, kv = b[op.args[0]], b[op.args[1]]
    k, v = _kv_for(ex, q, kv)
    part = partial_attention(q.arrays[0], k, v, ex.scale, _mask(ex, q, kv))
    prev = b.get(op.out)
    b[op.out] = StateRows(part if prev is None else merge(prev.state, part), q.pos, q.h0)


def _final(ex: Any, op: Op) -> None:
    b = _ctx(ex).buf[op.rank]
    st = b.pop(op.args[0])
    b[op.out] = Rows((finalize(st.state),), st.pos, st.h0)
    b["lse"] = Rows((log_sum_exp(st.state),), st.pos, st.h0)


def _delta(ex: Any, op: Op) -> None:
    b = _ctx(ex).buf[op.rank]
    out, dout = b[op.args[0]], b[op.args[1]]
    b[op.out] = Rows((attention_delta(out.arrays[0], dout.arrays[0]),), out.pos, out.h0)


def _bwd(ex_: Any, op: Op) -> None:
    ex = _ctx(ex_)
    b = ex.buf[op.rank]
    q, kv, lse, delta, dout = (b[a] for a in op.args[:5])
    k, v = _kv_for(ex, q, kv)
    dq, dk, dv = block_backward(q.arrays[0], k, v, ex.scale, _mask(ex, q, kv), lse.arrays[0], delta.arrays[0],
                                dout.arrays[0])
    prev = b.get(op.out)
    b[op.out] = Rows((dq if prev is None else prev.arrays[0] + dq,), q.pos, q.h0)
    prev_kv = b.get(op.args[5])
    grads = (dk, dv) if prev_kv is None else (prev_kv.arrays[0] + dk, prev_kv.arrays[1] + dv)
    b[op.args[5]] = Rows(grads, kv.pos, q.h0 // ex.group)


def _concat_kernel(ex: Any, op: Op) -> None:
    b = _ctx(ex).buf[op.rank]
    b[op.out] = _concat([b[a] for a in op.args])


def _slice_heads(ex: Any, op: Op) -> None:
    b = _ctx(ex).buf[op.rank]
    b[op.out] = b[op.args[0]].head_slice(op.lo, op.hi)


def _slice_rows(ex: Any, op: Op) -> None:
    b = _ctx(ex).buf[op.rank]
    b[op.out] = b[op.args[0]].rows(op.lo, op.hi)


def _add(ex: Any, op: Op) -> None:
    b = _ctx(ex).buf[op.rank]
    got, own = b[op.args[0]], b[op.args[1]].rows(op.lo, op.hi)
    if not np.array_equal(got.pos, own.pos):
        raise ValueError(f"op #{op.id}: adding row blocks of different positions")
    b[op.out] = Rows(tuple(x + y for x, y in zip(got.arrays, own.arrays, strict=True)), own.pos, own.h0)


def _rows(args: Sequence[Any], prev: Any, shape: Any) -> tuple[Any, ...]:
    """Payload rule: a row block (real runs of prefill schedules do not size messages from it yet)."""
    return ("rows",)


PREFILL_KERNELS: dict[str, tuple[Callable[[Any, Op], None], Callable[[Sequence[Any], Any, Any], Any]]] = {
    "attn-fwd": (_fwd, _rows), "attn-final": (_final, _rows), "attn-delta": (_delta, _rows),
    "attn-bwd": (_bwd, _rows), "concat": (_concat_kernel, _rows), "slice-heads": (_slice_heads, _rows),
    "slice-rows": (_slice_rows, _rows), "add": (_add, _rows),
}
"""name -> (numeric semantics, payload rule); :mod:`simulator.kernels` registers them."""
