"""The kernels a schedule's compute ops name (``Op.fn``): one record per kernel, which every executor, the schedule
builders, the engine's device model and the profiler read.

Each :class:`Kernel` says, in one place,

* ``run``: what it does to a rank's named buffers (the numeric executor and the real ``torch.distributed`` runner
  both call it, on numpy arrays or torch tensors, through the merge core);
* ``writes``: its payload rule, i.e. what every buffer it writes holds afterwards, as a buffer descriptor
  (:mod:`simulator.kernels.payload`), so that a real receiver can size and unpack a message without executing
  anything;
* ``cost``: its (FLOPs, bytes) on the roofline for a decode shape and the op's size ``n`` (tokens for ``attend`` and
  ``copy`` of a KV shard, elements for elementwise kernels; :func:`kernel_cost`). The prefill kernels have none
  here: their cost is their block's, from its unmasked pairs (:class:`~simulator.workloads.prefill_shape.PrefillShape`),
  which the prefill builders compute per block;
* ``axes``, ``dims``, ``optional_axes``: the axes ``treering calibrate`` profiles it over
  (:mod:`simulator.kernels.profiles`), a decode shape's point on them, and how many trailing axes a profile may
  leave out (its time then taken as not depending on them);
* ``profile``: the call a profile times at a point on its axes, built from a ``rand(*shape)`` of the profile's dtype
  and device (the profiler and the processes loading the host's other cores build the same call);
* ``efficiency``: for attention blocks, which of a device's ``attention_efficiency`` entries its roofline uses.

The decode kernels are in :mod:`simulator.kernels.decode`, the prefill ones (forward and backward attention blocks,
row-block concat, slices, add) in :mod:`simulator.kernels.prefill`. Pure data and array-API code: no simpy, no torch
import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from simulator.kernels import decode as dk
from simulator.kernels import prefill as pk
from simulator.kernels.decode import OutputRule
from simulator.schedule.core import Op
from simulator.workloads.shape import DecodeShape

__all__ = ["ATTENTION_KERNELS", "KERNELS", "OPTIONAL_AXES", "PROFILE_AXES", "Kernel", "kernel", "kernel_cost",
           "kernel_dims"]

Writes = Callable[[Op, Any, Any], Mapping[str, Any]]  # (op, the descriptors its rank holds, shape) -> written
ProfileCall = Callable[[tuple[float, ...], str, Callable[..., Any]], Callable[[], object]]

_ATTEND_AXES = ("kv_bytes", "head_dim", "group", "rows")  # KV bytes read, head dimension, query heads per KV head,
# (batch, KV head) rows: the independent problems
_STATE_AXES = ("elems",)  # elements of one state (o, l, m), or of a flat buffer
_BLOCK_AXES = ("row_heads", "span", "head_dim", "density")  # a prefill block: query rows x heads, keys spanned, head
# dimension, the share of the pairs its mask keeps


@dataclass(frozen=True)
class Kernel:
    """One kernel: its numeric semantics, payload rule, cost, profile axes and profiled call (see the module)."""

    name: str
    run: Callable[[Any, Op], None]
    writes: Writes
    cost: Callable[[DecodeShape, int], tuple[float, float]] | None = None
    dims: Callable[[DecodeShape, int], tuple[float, ...]] | None = None
    axes: tuple[str, ...] = ()
    optional_axes: int = 0
    profile: ProfileCall | None = None
    efficiency: str | None = None


def _decode(name: str, run: Callable[[Any, Op], None], rule: dk.Rule, cost: Callable[[DecodeShape, int],
            tuple[float, float]], dims: Callable[[DecodeShape, int], tuple[float, ...]] | None = None,
            axes: tuple[str, ...] = (), profile: ProfileCall | None = None, optional_axes: int = 0) -> Kernel:
    return Kernel(name, run, OutputRule(rule), cost, dims, axes, optional_axes, profile)


KERNELS: dict[str, Kernel] = {k.name: k for k in (
    # attend's rows (the last axis) are profiled where calibrate is asked to (``--attend-rows``; emulated bf16 on a
    # CPU took 0.45-3.85x its 4-row time between 1 and 256 rows of the same bytes at 8 and 64 MiB, fp32 and fp64
    # 0.6-1.45x in no consistent direction: docs/validation.md)
    _decode("attend", dk.attend, dk.state, dk.attend_cost, dk.attend_dims, _ATTEND_AXES, dk.attend_call, 1),
    _decode("merge", dk.merge_into, dk.state, dk.merge_cost, dk.state_dims, _STATE_AXES, dk.merge_call),
    _decode("pack-m", dk.pack_m, dk.flat_m, dk.free),
    _decode("rescale", dk.rescale_flat, dk.flat_ol, dk.elementwise, dk.elem_dims, _STATE_AXES, dk.rescale_call),
    _decode("finalize", dk.finalize_state, dk.output, dk.elementwise, dk.elem_dims, _STATE_AXES, dk.finalize_call),
    _decode("finalize-flat", dk.finalize_flat, dk.output, dk.elementwise, dk.elem_dims, _STATE_AXES,
            dk.finalize_flat_call),
    _decode("reduce-sum", dk.reduce_sum, dk.in_place, dk.elementwise),
    _decode("reduce-max", dk.reduce_max, dk.in_place, dk.elementwise),
    _decode("copy", dk.copy, dk.same_as_arg, dk.kv_copy),
    Kernel("attn-fwd", pk.fwd, pk.w_fwd, axes=_BLOCK_AXES, profile=pk.attn_fwd_call, efficiency="forward"),
    Kernel("attn-merge", pk.merge_state, pk.w_merge),
    Kernel("attn-final", pk.final, pk.w_final),
    Kernel("attn-delta", pk.delta, pk.w_delta),
    Kernel("attn-bwd", pk.bwd, pk.w_bwd, axes=_BLOCK_AXES, profile=pk.attn_bwd_call, efficiency="backward"),
    Kernel("concat", pk.concat, pk.w_concat),
    Kernel("slice-heads", pk.slice_heads, pk.w_slice_heads),
    Kernel("slice-rows", pk.slice_rows, pk.w_slice_rows),
    Kernel("add", pk.add, pk.w_add),
)}

# read off the records: the kernels ``treering calibrate`` profiles and their axes; the trailing axes a profile may
# leave out; the attention blocks and the efficiency entry their roofline takes
PROFILE_AXES: dict[str, tuple[str, ...]] = {k.name: k.axes for k in KERNELS.values() if k.axes}
OPTIONAL_AXES: dict[str, int] = {k.name: k.optional_axes for k in KERNELS.values() if k.optional_axes}
ATTENTION_KERNELS: dict[str, str] = {k.name: k.efficiency for k in KERNELS.values() if k.efficiency}


def kernel(name: str) -> Kernel:
    """The kernel called ``name``; an unknown name is an error that lists the known ones."""
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; kernels: {', '.join(KERNELS)}") from None


def kernel_cost(name: str, shape: DecodeShape, n: int) -> tuple[float, float]:
    """(FLOPs, bytes) of kernel ``name`` for ``shape`` and size ``n``."""
    k = kernel(name)
    if k.cost is None:
        raise ValueError(f"kernel {name!r} is costed per block by PrefillShape, not by a decode shape")
    return k.cost(shape, n)


def kernel_dims(name: str, shape: DecodeShape, n: int) -> tuple[float, ...]:
    """The shape of kernel ``name`` on its profile's axes (empty for kernels that are never profiled)."""
    k = kernel(name)
    return k.dims(shape, n) if k.dims is not None else ()
