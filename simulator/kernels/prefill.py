"""The prefill kernels (``Op.fn`` of :mod:`simulator.algorithms.prefill`): their numeric semantics on row blocks.

Registered in the one kernel table, :data:`simulator.kernels.table.KERNELS`. Buffers hold :class:`Rows`: rows of a
(b, heads, tokens, ...) tensor with their global positions ``pos`` and first head ``h0`` (K and V, or dK and dV,
travel together: ``arrays`` has two entries); a running state is a :class:`StateRows`. Masks are by global
position. The executor (:class:`PrefillBuffers`) supplies ``scale``, ``causal`` and ``group`` (query heads per KV
head of the whole model).

==============  ===================================================================================================
``attn-fwd``    ``out = merge(out, partial_attention(q, kv))``; args (q, kv)
``attn-merge``  ``out = merge(out, args[0])``: a partial state (o, l, m) of the same rows folded in (pass-Q); args
                (partial,)
``attn-final``  ``out = finalize(state)`` and ``lse = log_sum_exp(state)``; args (state,)
``attn-delta``  ``out = rowsum(o * do)``; args (o, do)
``attn-bwd``    ``out (dq) += dq_blk``, ``args[5] (dkv) += (dk_blk, dv_blk)``; args (q, kv, lse, delta, do, dkv)
``concat``      ``out`` = the blocks side by side: along heads when they hold the same rows (equal heads summed),
                else along rows
``slice-heads`` ``out`` = heads [lo, hi) of ``args[0]``;  ``slice-rows``: its rows [lo, hi)
``add``         ``out = args[0] + rows [lo, hi) of args[1]``
==============  ===================================================================================================

Costs come from :class:`~simulator.workloads.prefill_shape.PrefillShape` (a block's unmasked pairs), not from a
decode shape. Array-API generic through the merge core (numpy in numeric mode, torch in real runs).

Payload rules (the ``w_*`` functions, each kernel's ``writes`` in the table): what each kernel leaves in every
buffer it writes, as a descriptor, so that a real receiver sizes and unpacks a message without executing anything
(:mod:`simulator.kernels.payload`):

* ``("rows", arrays, batch, heads, h0, runs, last)``: ``arrays`` tensors (b, heads, tokens, last) (``last`` 0:
  (b, heads, tokens), lse and delta) of the positions ``runs`` (a tuple of
  :class:`~simulator.workloads.layouts.Run`, in storage order), heads [h0, h0 + heads);
* ``("state-rows", batch, heads, h0, runs, head_dim)``: a running state, o (b, heads, tokens, head_dim), l and m.

A rule sees the op (slices need its ``lo``/``hi``) and the descriptors the rank holds; it returns
``{buffer: descriptor}`` (``attn-final`` also writes ``lse``, ``attn-bwd`` its dK/dV buffer ``args[5]``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from array_api_compat import array_namespace, device

from simulator.merge import (
    PartialState,
    attention_delta,
    block_backward,
    finalize,
    log_sum_exp,
    merge,
    partial_attention,
)
from simulator.schedule.core import Op, Schedule
from simulator.workloads.layouts import Run, positions, run_tokens
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["PREFILL_HEADS", "PrefillBuffers", "Rows", "StateRows", "add", "attn_bwd_call", "attn_fwd_call", "bwd",
           "concat", "cut_runs", "delta", "final", "fwd", "initial_descriptors", "merge_state", "rows_shapes",
           "slice_heads", "slice_rows", "w_add", "w_bwd", "w_concat", "w_delta", "w_final", "w_fwd", "w_merge",
           "w_slice_heads", "w_slice_rows"]

Descriptor = tuple[Any, ...]

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
    return array_namespace(*xs).concat(xs, axis=axis)


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
    if not ex.causal:
        return None
    xp = array_namespace(q.arrays[0])
    device = getattr(q.arrays[0], "device", None)
    qpos = xp.asarray(q.pos, device=device) if device is not None else xp.asarray(q.pos)
    kpos = xp.asarray(kv.pos, device=device) if device is not None else xp.asarray(kv.pos)
    return (kpos[None, :] <= qpos[:, None])[None, None]  # visible iff key position <= query position


def _kv_for(ex: PrefillBuffers, q: Rows, kv: Rows) -> tuple[Any, Any]:
    """The KV heads ``q``'s heads use, so that partial_attention's GQA grouping lines up."""
    sel = kv.head_slice(q.h0 // ex.group, (q.h0 + q.heads - 1) // ex.group + 1)
    return sel.arrays[0], sel.arrays[1]


def fwd(ex_: Any, op: Op) -> None:
    ex = _ctx(ex_)
    b = ex.buf[op.rank]
    q, kv = b[op.args[0]], b[op.args[1]]
    k, v = _kv_for(ex, q, kv)
    part = partial_attention(q.arrays[0], k, v, ex.scale, _mask(ex, q, kv))
    prev = b.get(op.out)
    b[op.out] = StateRows(part if prev is None else merge(prev.state, part), q.pos, q.h0)


def merge_state(ex: Any, op: Op) -> None:
    b = _ctx(ex).buf[op.rank]
    got = b.pop(op.args[0])
    prev = b.get(op.out)
    if prev is not None and not np.array_equal(prev.pos, got.pos):
        raise ValueError(f"op #{op.id}: merging states of different positions")
    b[op.out] = got if prev is None else StateRows(merge(prev.state, got.state), prev.pos, prev.h0)


def final(ex: Any, op: Op) -> None:
    b = _ctx(ex).buf[op.rank]
    st = b.pop(op.args[0])
    b[op.out] = Rows((finalize(st.state),), st.pos, st.h0)
    b["lse"] = Rows((log_sum_exp(st.state),), st.pos, st.h0)


def delta(ex: Any, op: Op) -> None:
    b = _ctx(ex).buf[op.rank]
    out, dout = b[op.args[0]], b[op.args[1]]
    b[op.out] = Rows((attention_delta(out.arrays[0], dout.arrays[0]),), out.pos, out.h0)


def bwd(ex_: Any, op: Op) -> None:
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


def concat(ex: Any, op: Op) -> None:
    b = _ctx(ex).buf[op.rank]
    b[op.out] = _concat([b[a] for a in op.args])


def slice_heads(ex: Any, op: Op) -> None:
    b = _ctx(ex).buf[op.rank]
    b[op.out] = b[op.args[0]].head_slice(op.lo, op.hi)


def slice_rows(ex: Any, op: Op) -> None:
    b = _ctx(ex).buf[op.rank]
    b[op.out] = b[op.args[0]].rows(op.lo, op.hi)


def add(ex: Any, op: Op) -> None:
    b = _ctx(ex).buf[op.rank]
    got, own = b[op.args[0]], b[op.args[1]].rows(op.lo, op.hi)
    if not np.array_equal(got.pos, own.pos):
        raise ValueError(f"op #{op.id}: adding row blocks of different positions")
    b[op.out] = Rows(tuple(x + y for x, y in zip(got.arrays, own.arrays, strict=True)), own.pos, own.h0)


# -- payload rules: what a kernel leaves in the buffers it writes (descriptors; see the module docstring) ----------

def cut_runs(runs: Sequence[Run], lo: int, hi: int) -> tuple[Run, ...]:
    """Rows [lo, hi) (by storage index) of the positions ``runs``, as runs."""
    out, at = [], 0
    for r in runs:
        a, b = max(lo - at, 0), min(hi - at, r.size)
        if a < b:
            out.append(Run(r.start + a * r.step, r.step, b - a))
        at += r.size
    return tuple(out)


def rows_shapes(desc: Descriptor) -> list[tuple[int, ...]]:
    """The arrays a row-block descriptor stands for, in the order a message packs them."""
    if desc[0] == "rows":
        _, arrays, b, h, _h0, runs, last = desc
        one = (b, h, run_tokens(runs), last) if last else (b, h, run_tokens(runs))
        return [one] * arrays
    if desc[0] == "state-rows":
        _, b, h, _h0, runs, d = desc
        t = run_tokens(runs)
        return [(b, h, t, d), (b, h, t), (b, h, t)]
    raise ValueError(f"not a row-block descriptor: {desc[0]!r}")


def initial_descriptors(sched: Schedule, shape: PrefillShape) -> list[dict[str, Descriptor]]:
    """What every rank starts with: q and dO (its rows, every head), K and V (``kv...``: every KV head)."""
    held: list[dict[str, Descriptor]] = [{} for _ in range(sched.ranks)]
    b, d = shape.batch, shape.head_dim
    keys = sched.meta.get("kv_runs", sched.meta["runs"])  # a cached prefix: the cached then the new positions
    for rank, names in sched.initial.items():
        runs = tuple(sched.meta["runs"][rank])
        for name in names:
            if name in ("q", "dout"):
                held[rank][name] = ("rows", 1, b, shape.heads, 0, runs, d)
            elif name.startswith("kv"):
                held[rank][name] = ("rows", 2, b, shape.kv_heads, 0, tuple(keys[rank]), d)
            else:
                raise ValueError(f"rank {rank}: no descriptor for initial buffer {name!r}")
    return held


Held = Mapping[str, Any]
Writes = dict[str, Descriptor]


def _desc(held: Held, op: Op, i: int) -> Descriptor:
    desc = held.get(op.args[i])
    if desc is None:
        raise ValueError(f"op #{op.id} on rank {op.rank} reads {op.args[i]!r}, which it does not hold")
    return tuple(desc)


def w_fwd(op: Op, held: Held, shape: PrefillShape) -> Writes:
    _, _, b, h, h0, runs, d = _desc(held, op, 0)
    return {op.out: ("state-rows", b, h, h0, runs, d)}


def w_merge(op: Op, held: Held, shape: PrefillShape) -> Writes:
    return {op.out: _desc(held, op, 0)}


def w_final(op: Op, held: Held, shape: PrefillShape) -> Writes:
    _, b, h, h0, runs, d = _desc(held, op, 0)
    return {op.out: ("rows", 1, b, h, h0, runs, d), "lse": ("rows", 1, b, h, h0, runs, 0)}


def w_delta(op: Op, held: Held, shape: PrefillShape) -> Writes:
    _, _, b, h, h0, runs, _d = _desc(held, op, 0)
    return {op.out: ("rows", 1, b, h, h0, runs, 0)}


def w_bwd(op: Op, held: Held, shape: PrefillShape) -> Writes:
    q, kv = _desc(held, op, 0), _desc(held, op, 1)
    _, _, b, h, h0, runs, d = q
    lo, hi = h0 // shape.group, (h0 + h - 1) // shape.group + 1  # the KV heads these query heads use
    return {op.out: ("rows", 1, b, h, h0, runs, d), op.args[5]: ("rows", 2, b, hi - lo, lo, kv[5], d)}


def w_concat(op: Op, held: Held, shape: PrefillShape) -> Writes:
    parts = [_desc(held, op, i) for i in range(len(op.args))]
    _, arrays, b, _h, _h0, _runs, last = parts[0]
    pos = [positions(p[5]) for p in parts]
    if len(parts) == 1 or not all(np.array_equal(x, pos[0]) for x in pos):  # along rows
        runs = tuple(r for p in parts for r in p[5])
        return {op.out: ("rows", arrays, b, parts[0][3], parts[0][4], runs, last)}
    heads = {p[4]: p[3] for p in parts}  # along heads; equal h0 summed
    return {op.out: ("rows", arrays, b, sum(heads.values()), min(heads), parts[0][5], last)}


def w_slice_heads(op: Op, held: Held, shape: PrefillShape) -> Writes:
    tag, arrays, b, _h, _h0, runs, last = _desc(held, op, 0)
    return {op.out: (tag, arrays, b, op.hi - op.lo, op.lo, runs, last)}


def w_slice_rows(op: Op, held: Held, shape: PrefillShape) -> Writes:
    tag, arrays, b, h, h0, runs, last = _desc(held, op, 0)
    return {op.out: (tag, arrays, b, h, h0, cut_runs(runs, op.lo, op.hi), last)}


def w_add(op: Op, held: Held, shape: PrefillShape) -> Writes:
    return {op.out: _desc(held, op, 0)}


# -- the calls a profile times, at a point on the blocks' axes (row_heads, span, head_dim, density) ----------------

PREFILL_HEADS = 4  # the heads of a profiled prefill block (its query rows follow from row_heads)


def _block(point: tuple[float, ...], rand: Callable[..., Any]) -> tuple[Any, ...]:
    """A prefill block of ``PREFILL_HEADS`` heads: full (density 1) or causal (query i sees the keys up to its place
    on the diagonal: about half the pairs, recorded as density 0.5): (q, k, v, dout, scale, mask)."""
    row_heads, span, head_dim, density = point
    nq, t, d = max(1, round(row_heads / PREFILL_HEADS)), round(span), int(head_dim)
    q, k, v, dout = rand(1, PREFILL_HEADS, nq, d), rand(1, PREFILL_HEADS, t, d), rand(1, PREFILL_HEADS, t, d), \
        rand(1, PREFILL_HEADS, nq, d)
    xp = array_namespace(q)
    where = device(q)
    mask = None if density >= 1 else (
        xp.arange(t, device=where)[None, :] * nq <= xp.arange(nq, device=where)[:, None] * t)
    return q, k, v, dout, 1 / math.sqrt(d), mask


def attn_fwd_call(point: tuple[float, ...], dtype: str, rand: Callable[..., Any]) -> Callable[[], object]:
    """One forward block merged into a running state."""
    q, k, v, _, scale, mask = _block(point, rand)
    acc = partial_attention(q, k[:, :, :1], v[:, :, :1], scale)
    return lambda: merge(acc, partial_attention(q, k, v, scale, mask))


def attn_bwd_call(point: tuple[float, ...], dtype: str, rand: Callable[..., Any]) -> Callable[[], object]:
    """One backward block (from the saved log-sum-exp and delta) added into dQ, dK, dV."""
    q, k, v, dout, scale, mask = _block(point, rand)
    xp = array_namespace(q)
    state = partial_attention(q, k, v, scale, mask)
    lse, delta = log_sum_exp(state), attention_delta(finalize(state), dout)
    grads = (xp.zeros_like(q), xp.zeros_like(k), xp.zeros_like(v))

    def bwd() -> None:
        for acc, g in zip(grads, block_backward(q, k, v, scale, mask, lse, delta, dout), strict=True):
            acc += g  # in place (numpy and torch alike)
    return bwd
