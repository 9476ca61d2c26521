"""The decode kernels (``Op.fn`` of the decode schedules and the collectives' reductions): what each does to a rank's
named buffers, what its output holds (payload rule), its cost on a decode shape, its shape on its profile's axes and
the call ``treering calibrate`` times at a profile point. :mod:`simulator.kernels.table` gathers them into records.

==================  ======================================================================================
``attend``          ``out = merge(out, partial_attention(q, kv))`` (``out`` absent: the partial itself); args (q, kv)
``merge``           ``out = merge(out, arg)``
``pack-m``          ``out = flat copy of state(arg).m`` (a view inside the communication kernel: no cost)
``rescale``         ``out = flat (o, l) of rescale(state(args[0]), m = args[1])``
``finalize``        ``out = finalize(state(arg))``
``finalize-flat``   ``out = finalize`` of the flat (o, l) ``args[0]`` with flat m ``args[1]``
``reduce-sum`` /    ``out[lo:hi] = out[lo:hi] (+ | max) arg`` (a collective's reduction step)
``reduce-max``
``copy``            ``out = arg``
==================  ======================================================================================

Pure data and array-API code (numpy in numeric mode, torch in real runs and profiles): no simpy, no torch import.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from array_api_compat import array_namespace

from simulator.merge import PartialState, finalize, merge, partial_attention, rescale
from simulator.schedule.core import Op
from simulator.units import DTYPE_BYTES
from simulator.workloads.shape import DecodeShape

__all__ = ["KV_HEADS", "Descriptor", "KVShard", "OutputRule", "RankBuffers", "attend_shape", "state_of"]

Descriptor = tuple[Any, ...]
Rand = Callable[..., Any]  # rand(*shape): an array of that shape, of the profile's dtype and device
KV_HEADS = 4  # the KV heads of a profiled attend shape (its tokens follow from kv_bytes)


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


class RankBuffers(Protocol):
    """What a kernel sees of an executor: every rank's named buffers and the attention inputs' shapes."""

    buf: list[dict[str, Any]]
    xp: Any
    scale: float
    mask: Any | None  # (b, context), True = attend
    o_shape: tuple[int, ...]  # (b, heads, 1, head_dim)
    ml_shape: tuple[int, ...]  # (b, heads, 1)


def state_of(value: Any) -> PartialState:
    """``value`` as a partial state, or a clear error naming what it is."""
    if not isinstance(value, PartialState):
        raise TypeError(f"expected a partial state, got {type(value).__name__}")
    return value


# -- numeric semantics ---------------------------------------------------------------------------------------------

def attend(ex: RankBuffers, op: Op) -> None:
    b = ex.buf[op.rank]
    q, kv = (b[a] for a in op.args)
    mask = None if ex.mask is None else ex.mask[:, None, None, kv.lo:kv.hi]
    part = partial_attention(q, kv.k, kv.v, ex.scale, mask)
    prev = b.get(op.out)
    b[op.out] = part if prev is None else merge(prev, part)


def merge_into(ex: RankBuffers, op: Op) -> None:
    b = ex.buf[op.rank]
    b[op.out] = merge(state_of(b[op.out]), state_of(b[op.args[0]]))


def pack_m(ex: RankBuffers, op: Op) -> None:
    b = ex.buf[op.rank]
    b[op.out] = ex.xp.asarray(ex.xp.reshape(state_of(b[op.args[0]]).m, (-1,)), copy=True)


def rescale_flat(ex: RankBuffers, op: Op) -> None:
    b, xp = ex.buf[op.rank], ex.xp
    st = rescale(state_of(b[op.args[0]]), xp.reshape(b[op.args[1]], ex.ml_shape))
    b[op.out] = xp.concat([xp.reshape(st.o, (-1,)), xp.reshape(st.l, (-1,))])


def finalize_state(ex: RankBuffers, op: Op) -> None:
    b = ex.buf[op.rank]
    b[op.out] = finalize(state_of(b[op.args[0]]))


def finalize_flat(ex: RankBuffers, op: Op) -> None:
    b, xp = ex.buf[op.rank], ex.xp
    flat, m = b[op.args[0]], b[op.args[1]]
    n_o = math.prod(ex.o_shape)
    st = PartialState(xp.reshape(flat[:n_o], ex.o_shape), xp.reshape(flat[n_o:], ex.ml_shape),
                      xp.reshape(m, ex.ml_shape))
    b[op.out] = finalize(st)


def reduce_sum(ex: RankBuffers, op: Op) -> None:
    b = ex.buf[op.rank]
    target = b[op.out]
    target[op.lo:op.hi] = target[op.lo:op.hi] + b[op.args[0]]


def reduce_max(ex: RankBuffers, op: Op) -> None:
    b = ex.buf[op.rank]
    target = b[op.out]
    target[op.lo:op.hi] = ex.xp.maximum(target[op.lo:op.hi], b[op.args[0]])


def copy(ex: RankBuffers, op: Op) -> None:
    b = ex.buf[op.rank]
    src = b[op.args[0]]
    b[op.out] = src.copy() if isinstance(src, KVShard) else ex.xp.asarray(src, copy=True)


# -- payload rules: what the output buffer holds afterwards, from what its inputs held ------------------------------

Rule = Callable[[Sequence[Descriptor | None], Descriptor | None, DecodeShape], Descriptor | None]


def state(args: Sequence[Descriptor | None], prev: Descriptor | None, shape: DecodeShape) -> Descriptor:
    return ("state",)


def output(args: Sequence[Descriptor | None], prev: Descriptor | None, shape: DecodeShape) -> Descriptor:
    return ("out",)


def flat_m(args: Sequence[Descriptor | None], prev: Descriptor | None, shape: DecodeShape) -> Descriptor:
    return ("flat", shape.ml_elems)


def flat_ol(args: Sequence[Descriptor | None], prev: Descriptor | None, shape: DecodeShape) -> Descriptor:
    return ("flat", shape.batch * shape.model_dim + shape.ml_elems)


def in_place(args: Sequence[Descriptor | None], prev: Descriptor | None, shape: DecodeShape) -> Descriptor | None:
    return prev


def same_as_arg(args: Sequence[Descriptor | None], prev: Descriptor | None, shape: DecodeShape) -> Descriptor | None:
    return args[0]


@dataclass(frozen=True)
class OutputRule:
    """A decode kernel's payload rule as the table holds every kernel's (``writes``: op, held descriptors, shape ->
    the descriptors of the buffers it writes): it writes ``out`` only, as ``rule`` says from its args' and ``out``'s
    descriptors."""

    rule: Rule

    def __call__(self, op: Op, held: Mapping[str, Descriptor], shape: Any) -> dict[str, Descriptor | None]:
        return {op.out: self.rule([held.get(a) for a in op.args], held.get(op.out), shape)}


# -- costs (FLOPs, bytes) on the roofline --------------------------------------------------------------------------

def attend_cost(shape: DecodeShape, tokens: int) -> tuple[float, float]:
    return shape.attend_cost(tokens)


def merge_cost(shape: DecodeShape, n: int) -> tuple[float, float]:
    return shape.merge_cost()


def free(shape: DecodeShape, n: int) -> tuple[float, float]:
    return 0.0, 0.0


def elementwise(shape: DecodeShape, elems: int) -> tuple[float, float]:
    return shape.elementwise_cost(elems)


def kv_copy(shape: DecodeShape, tokens: int) -> tuple[float, float]:
    return 0.0, 2 * shape.kv_bytes(tokens)  # read and write the shard


# -- shapes on the profile axes (what ``treering calibrate`` measures: simulator.kernels.profiles) -----------------

def attend_dims(shape: DecodeShape, tokens: int) -> tuple[float, ...]:
    return (shape.kv_bytes(tokens), float(shape.head_dim), float(shape.heads // shape.kv_heads),
            float(shape.batch * shape.kv_heads))


def state_dims(shape: DecodeShape, n: int) -> tuple[float, ...]:
    return (float(shape.batch * shape.model_dim + 2 * shape.ml_elems),)


def elem_dims(shape: DecodeShape, elems: int) -> tuple[float, ...]:
    return (float(elems),)


# -- the calls a profile times, at a point on the kernel's axes ----------------------------------------------------

def attend_shape(kv_bytes: float, head_dim: int, group: int, dtype: str, rows: int = KV_HEADS
                 ) -> tuple[int, int, int, int, int]:
    """(batch, heads, kv_heads, head_dim, tokens) of the profiled attend point: ``rows`` KV heads of batch 1."""
    tokens = max(1, round(kv_bytes / (2 * rows * head_dim * DTYPE_BYTES[dtype])))
    return 1, rows * group, rows, head_dim, tokens


def attend_call(point: tuple[float, ...], dtype: str, rand: Rand) -> Callable[[], object]:
    """One attend of the point's KV shard (kv_bytes, head_dim, group[, rows]) merged into a running state."""
    b, h, kvh, d, t = attend_shape(point[0], int(point[1]), int(point[2]), dtype,
                                   int(point[3]) if len(point) > 3 else KV_HEADS)
    q, k, v = rand(b, h, 1, d), rand(b, kvh, t, d), rand(b, kvh, t, d)
    acc = partial_attention(q, k[:, :, :1], v[:, :, :1], 1 / math.sqrt(d))
    return lambda: merge(acc, partial_attention(q, k, v, 1 / math.sqrt(d)))


def _states(point: tuple[float, ...], rand: Rand) -> tuple[PartialState, PartialState, Any]:
    """Two running states of ``point[0]`` elements (o of 128-wide heads), and the first one's flat (o, l)."""
    elems = int(point[0])
    heads = max(1, elems // 128)
    d = max(1, elems // heads)
    states = []
    for _ in range(2):
        o = rand(1, heads, 1, d)
        xp = array_namespace(o)
        states.append(PartialState(o, xp.abs(rand(1, heads, 1)) + 1, rand(1, heads, 1)))
    a = states[0]
    xp = array_namespace(a.o)
    return a, states[1], xp.concat([xp.reshape(a.o, (-1,)), xp.reshape(a.l, (-1,))])


def merge_call(point: tuple[float, ...], dtype: str, rand: Rand) -> Callable[[], object]:
    a, b, _ = _states(point, rand)
    return lambda: merge(a, b)


def rescale_call(point: tuple[float, ...], dtype: str, rand: Rand) -> Callable[[], object]:
    a, b, _ = _states(point, rand)
    return lambda: rescale(a, b.m)


def finalize_call(point: tuple[float, ...], dtype: str, rand: Rand) -> Callable[[], object]:
    a, _, _ = _states(point, rand)
    return lambda: finalize(a)


def finalize_flat_call(point: tuple[float, ...], dtype: str, rand: Rand) -> Callable[[], object]:
    """The flat (o, l) viewed back as a state, then finalized."""
    a, _, flat_ol_ = _states(point, rand)
    xp = array_namespace(flat_ol_)
    n_o = math.prod(a.o.shape)
    return lambda: finalize(PartialState(xp.reshape(flat_ol_[:n_o], a.o.shape), xp.reshape(flat_ol_[n_o:], a.l.shape),
                                         a.m))
