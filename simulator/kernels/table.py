"""The kernels a schedule's compute ops name (``Op.fn``): one table that every executor shares.

Each :class:`Kernel` says, in one place,

* ``run``: what it does to a rank's named buffers (the numeric executor and the real ``torch.distributed`` runner
  both call it, on numpy arrays or torch tensors, through the merge core);
* ``result``: the payload rule, i.e. what its output buffer holds afterwards, as a buffer descriptor
  (:mod:`simulator.kernels.payload`), so that a real receiver can size and unpack a message without executing anything
  (the prefill kernels give ``writes`` instead: the descriptor of every buffer they write, from the op);
* ``cost``: its (FLOPs, bytes) for a decode shape and the op's size ``n`` (tokens for ``attend`` and ``copy`` of
  a KV shard, elements for elementwise kernels), on the roofline. Builders take op costs from here
  (:func:`kernel_cost`).

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
``attn-fwd`` ...    the prefill kernels (forward and backward attention blocks, row-block concat, slices, add):
                    :mod:`simulator.kernels.prefill`, costed by ``PrefillShape`` (a block's unmasked pairs)
==================  ======================================================================================

Pure data and array-API code: no simpy, no torch import.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from array_api_compat import array_namespace

from simulator.kernels.prefill import PREFILL_KERNELS
from simulator.merge import PartialState, finalize, merge, partial_attention, rescale
from simulator.schedule.core import Op
from simulator.workloads.shape import DecodeShape

__all__ = ["KERNELS", "OPTIONAL_AXES", "PROFILE_AXES", "Descriptor", "KVShard", "Kernel", "RankBuffers", "kernel_cost",
           "kernel_dims", "state_of"]

Descriptor = tuple[Any, ...]


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


@dataclass(frozen=True)
class Kernel:
    """One kernel: its numeric semantics, its payload rule and its cost (see the module docstring)."""

    name: str
    run: Callable[[RankBuffers, Op], None]
    result: Callable[[Sequence[Descriptor | None], Descriptor | None, DecodeShape], Descriptor | None]
    cost: Callable[[DecodeShape, int], tuple[float, float]]
    dims: Callable[[DecodeShape, int], tuple[float, ...]] | None = None  # its shape on its profile's axes
    writes: Callable[[Op, Any, Any], dict[str, Descriptor]] | None = None  # (op, held descriptors, shape)


# -- numeric semantics ---------------------------------------------------------------------------------------------

def _attend(ex: RankBuffers, op: Op) -> None:
    b = ex.buf[op.rank]
    q, kv = (b[a] for a in op.args)
    mask = None if ex.mask is None else ex.mask[:, None, None, kv.lo:kv.hi]
    part = partial_attention(q, kv.k, kv.v, ex.scale, mask)
    prev = b.get(op.out)
    b[op.out] = part if prev is None else merge(prev, part)


def _merge(ex: RankBuffers, op: Op) -> None:
    b = ex.buf[op.rank]
    b[op.out] = merge(state_of(b[op.out]), state_of(b[op.args[0]]))


def _pack_m(ex: RankBuffers, op: Op) -> None:
    b = ex.buf[op.rank]
    b[op.out] = ex.xp.asarray(ex.xp.reshape(state_of(b[op.args[0]]).m, (-1,)), copy=True)


def _rescale(ex: RankBuffers, op: Op) -> None:
    b, xp = ex.buf[op.rank], ex.xp
    st = rescale(state_of(b[op.args[0]]), xp.reshape(b[op.args[1]], ex.ml_shape))
    b[op.out] = xp.concat([xp.reshape(st.o, (-1,)), xp.reshape(st.l, (-1,))])


def _finalize(ex: RankBuffers, op: Op) -> None:
    b = ex.buf[op.rank]
    b[op.out] = finalize(state_of(b[op.args[0]]))


def _finalize_flat(ex: RankBuffers, op: Op) -> None:
    b, xp = ex.buf[op.rank], ex.xp
    flat, m = b[op.args[0]], b[op.args[1]]
    n_o = math.prod(ex.o_shape)
    st = PartialState(xp.reshape(flat[:n_o], ex.o_shape), xp.reshape(flat[n_o:], ex.ml_shape),
                      xp.reshape(m, ex.ml_shape))
    b[op.out] = finalize(st)


def _reduce_sum(ex: RankBuffers, op: Op) -> None:
    b = ex.buf[op.rank]
    target = b[op.out]
    target[op.lo:op.hi] = target[op.lo:op.hi] + b[op.args[0]]


def _reduce_max(ex: RankBuffers, op: Op) -> None:
    b = ex.buf[op.rank]
    target = b[op.out]
    target[op.lo:op.hi] = ex.xp.maximum(target[op.lo:op.hi], b[op.args[0]])


def _copy(ex: RankBuffers, op: Op) -> None:
    b = ex.buf[op.rank]
    src = b[op.args[0]]
    b[op.out] = src.copy() if isinstance(src, KVShard) else ex.xp.asarray(src, copy=True)


# -- payload rules (what the output buffer holds afterwards) --------------------------------------------------------

def _state(args: Sequence[Descriptor | None], prev: Descriptor | None, shape: DecodeShape) -> Descriptor:
    return ("state",)


def _output(args: Sequence[Descriptor | None], prev: Descriptor | None, shape: DecodeShape) -> Descriptor:
    return ("out",)


def _flat_m(args: Sequence[Descriptor | None], prev: Descriptor | None, shape: DecodeShape) -> Descriptor:
    return ("flat", shape.ml_elems)


def _flat_ol(args: Sequence[Descriptor | None], prev: Descriptor | None, shape: DecodeShape) -> Descriptor:
    return ("flat", shape.batch * shape.model_dim + shape.ml_elems)


def _in_place(args: Sequence[Descriptor | None], prev: Descriptor | None, shape: DecodeShape) -> Descriptor | None:
    return prev


def _same_as_arg(args: Sequence[Descriptor | None], prev: Descriptor | None, shape: DecodeShape
                 ) -> Descriptor | None:
    return args[0]


# -- costs (FLOPs, bytes) -------------------------------------------------------------------------------------------

def _attend_cost(shape: DecodeShape, tokens: int) -> tuple[float, float]:
    return shape.attend_cost(tokens)


def _merge_cost(shape: DecodeShape, n: int) -> tuple[float, float]:
    return shape.merge_cost()


def _free(shape: DecodeShape, n: int) -> tuple[float, float]:
    return 0.0, 0.0


# -- shapes on the profile axes (:mod:`simulator.kernels.profiles`: what ``treering calibrate`` measures) --------------

def _attend_dims(shape: DecodeShape, tokens: int) -> tuple[float, ...]:
    return (shape.kv_bytes(tokens), float(shape.head_dim), float(shape.heads // shape.kv_heads),
            float(shape.batch * shape.kv_heads))


def _state_dims(shape: DecodeShape, n: int) -> tuple[float, ...]:
    return (float(shape.batch * shape.model_dim + 2 * shape.ml_elems),)


def _elem_dims(shape: DecodeShape, elems: int) -> tuple[float, ...]:
    return (float(elems),)


def _elementwise(shape: DecodeShape, elems: int) -> tuple[float, float]:
    return shape.elementwise_cost(elems)


def _kv_copy(shape: DecodeShape, tokens: int) -> tuple[float, float]:
    return 0.0, 2 * shape.kv_bytes(tokens)  # read and write the shard


KERNELS: dict[str, Kernel] = {k.name: k for k in (
    Kernel("attend", _attend, _state, _attend_cost, _attend_dims),
    Kernel("merge", _merge, _state, _merge_cost, _state_dims),
    Kernel("pack-m", _pack_m, _flat_m, _free),
    Kernel("rescale", _rescale, _flat_ol, _elementwise, _elem_dims),
    Kernel("finalize", _finalize, _output, _elementwise, _elem_dims),
    Kernel("finalize-flat", _finalize_flat, _output, _elementwise, _elem_dims),
    Kernel("reduce-sum", _reduce_sum, _in_place, _elementwise),
    Kernel("reduce-max", _reduce_max, _in_place, _elementwise),
    Kernel("copy", _copy, _same_as_arg, _kv_copy),
)}


def _prefill_cost(shape: DecodeShape, n: int) -> tuple[float, float]:
    raise ValueError("prefill kernels are costed by PrefillShape from a block's unmasked pairs, not by a decode shape")


def _by_writes(args: Sequence[Descriptor | None], prev: Descriptor | None, shape: DecodeShape) -> Descriptor:
    raise ValueError("a prefill kernel's payload rule needs the op: use Kernel.writes")


KERNELS.update({name: Kernel(name, run, _by_writes, _prefill_cost, writes=writes)
                for name, (run, writes) in PREFILL_KERNELS.items()})


PROFILE_AXES: dict[str, tuple[str, ...]] = {
    # KV bytes read, head dimension, query heads per KV head, (batch, KV head) rows: the independent problems
    "attend": ("kv_bytes", "head_dim", "group", "rows"),
    "merge": ("elems",),  # elements of one state (o, l, m)
    "rescale": ("elems",),
    "finalize": ("elems",),
    "finalize-flat": ("elems",),
    # prefill blocks: query rows x heads, keys spanned, head dimension, share of the pairs the mask keeps
    "attn-fwd": ("row_heads", "span", "head_dim", "density"),
    "attn-bwd": ("row_heads", "span", "head_dim", "density"),
}  # the kernels ``treering calibrate`` profiles over shapes, and their axes
# trailing axes a profile may leave out (its time then taken as not depending on them): attend's rows, profiled
# where calibrate is asked to (``--attend-rows``; emulated bf16 on a CPU took 0.45-3.85x its 4-row time between 1
# and 256 rows of the same bytes at 8 and 64 MiB, fp32 and fp64 0.6-1.45x in no consistent direction:
# docs/validation.md)
OPTIONAL_AXES: dict[str, int] = {"attend": 1}


def kernel_dims(name: str, shape: DecodeShape, n: int) -> tuple[float, ...]:
    """The shape of kernel ``name`` on its profile's axes (empty for kernels that are never profiled)."""
    k = kernel(name)
    return k.dims(shape, n) if k.dims is not None else ()


def kernel(name: str) -> Kernel:
    """The kernel called ``name``; an unknown name is an error that lists the known ones."""
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; kernels: {', '.join(KERNELS)}") from None


def kernel_cost(name: str, shape: DecodeShape, n: int) -> tuple[float, float]:
    """(FLOPs, bytes) of kernel ``name`` for ``shape`` and size ``n``."""
    return kernel(name).cost(shape, n)
