"""Profile the schedules' kernels over a grid of shapes (what ``treering calibrate`` writes as ``kernels:``).

Each kernel runs through the same merge core the schedules run (:mod:`simulator.merge`), on torch tensors of the
device and dtype asked for, timed by :func:`~simulator.distributed.measure.robust_time`:

* ``attend`` (partial attention of one decode query against a KV shard, merged into a running state) over its
  axes ``kv_bytes`` (the K and V bytes it reads), ``head_dim`` and ``group`` (query heads per KV head);
* ``merge``, ``rescale``, ``finalize``, ``finalize-flat`` over ``elems`` (a state's elements);
* the prefill blocks ``attn-fwd`` and ``attn-bwd`` over ``row_heads``, ``keys`` and ``head_dim`` (fp32 and fp64:
  the dtypes CPU real runs of prefill use).

The grid is small on purpose (calibrate stays within a few minutes on two CPU cores); workloads between grid points
are interpolated in log space by :class:`~simulator.kernel_model.KernelProfile`, and beyond them extrapolated, which
the simulator reports. A profiled point whose median is not stable (confidence interval above ``max_ci`` after the
repetitions allowed) makes the whole profile refuse: :class:`UnstableMeasurement` names it.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from simulator.cluster.devices import DTYPE_BYTES
from simulator.distributed.measure import Timing, robust_time
from simulator.kernel_model import KernelProfile
from simulator.kernels import PROFILE_AXES
from simulator.merge import (
    PartialState,
    attention_delta,
    block_backward,
    finalize,
    log_sum_exp,
    merge,
    partial_attention,
    rescale,
)

__all__ = ["ATTEND_GRID", "ELEMS_GRID", "PREFILL_GRID", "QUICK_ATTEND_GRID", "QUICK_ELEMS_GRID", "QUICK_PREFILL_GRID",
           "TORCH_DTYPES", "ProfileOptions", "UnstableMeasurement", "profile_attend", "profile_prefill",
           "profile_small"]

TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16,
                                        "fp16": torch.float16}
# kv_bytes 32 KiB .. 128 MiB (x 8), head_dim 32 .. 256 (x 2), group 1, 4, 16
ATTEND_GRID: tuple[tuple[float, ...], ...] = (tuple(float(2**k) for k in (15, 18, 21, 24, 27)),
                                              (32.0, 64.0, 128.0, 256.0), (1.0, 4.0, 16.0))
ELEMS_GRID: tuple[float, ...] = tuple(float(2**k) for k in (8, 12, 16, 20))
QUICK_ATTEND_GRID: tuple[tuple[float, ...], ...] = ((2.0**15, 2.0**18, 2.0**21), (32.0, 128.0), (1.0, 4.0))
QUICK_ELEMS_GRID: tuple[float, ...] = (2.0**8, 2.0**14)
# prefill blocks: row_heads 256 .. 4096 (x 4), span 64 .. 1024 keys (x 4), head_dim 32 and 128, density: a causal
# (diagonal) block and a full one
PREFILL_GRID: tuple[tuple[float, ...], ...] = ((2.0**8, 2.0**10, 2.0**12), (2.0**6, 2.0**8, 2.0**10), (32.0, 128.0),
                                               (0.5, 1.0))
QUICK_PREFILL_GRID: tuple[tuple[float, ...], ...] = ((2.0**8, 2.0**10), (2.0**6, 2.0**8), (32.0, 64.0), (0.5, 1.0))
PREFILL_HEADS = 4  # the heads of a profiled prefill block (its query rows follow from row_heads)
KV_HEADS = 4  # the KV heads of a profiled attend shape (its tokens follow from kv_bytes)


class UnstableMeasurement(RuntimeError):
    """A profiled point whose median did not settle within the repetitions allowed."""


@dataclass(frozen=True)
class ProfileOptions:
    """How hard to try: the confidence interval of the median aimed at (``rel_ci``) and the worst accepted
    (``max_ci``), time per point (``budget_s`` once at least ``min_reps`` ran; ``cap_s`` at most)."""

    rel_ci: float = 0.03
    max_ci: float = 0.5
    budget_s: float = 0.8
    cap_s: float = 4.0
    min_reps: int = 11
    max_reps: int = 41


def _check(kernel: str, dtype: str, where: str, t: Timing, opts: ProfileOptions) -> Timing:
    """Refuse a point whose median is not known well enough after the repetitions allowed."""
    if t.ci > opts.max_ci:
        raise UnstableMeasurement(
            f"{kernel} {dtype} at {where}: the median of {t.n} runs is known only to +-{t.ci:.0%} (95 % confidence; "
            f"accepted: +-{opts.max_ci:.0%}; the runs spread by {t.spread:.0%} of it); the machine is too busy for a "
            "calibration: rerun when it is quiet")
    return t


def _time(fn: Callable[[], object], device: torch.device, opts: ProfileOptions, budget_s: float) -> Timing:
    """Time ``fn`` on ``device``: a CUDA kernel by wall time after synchronizing; a CPU kernel (one thread) by its
    thread's CPU time, which other processes' preemptions do not inflate."""
    common = {"rel_ci": opts.rel_ci, "budget_s": budget_s, "max_reps": opts.max_reps, "min_reps": opts.min_reps,
              "cap_s": opts.cap_s}
    if device.type == "cuda":
        return robust_time(fn, torch.cuda.synchronize, **common)  # type: ignore[arg-type]
    return robust_time(fn, clock=time.thread_time, **common)  # type: ignore[arg-type]


def attend_shape(kv_bytes: float, head_dim: int, group: int, dtype: str) -> tuple[int, int, int, int, int]:
    """(batch, heads, kv_heads, head_dim, tokens) of the profiled attend point."""
    tokens = max(1, round(kv_bytes / (2 * KV_HEADS * head_dim * DTYPE_BYTES[dtype])))
    return 1, KV_HEADS * group, KV_HEADS, head_dim, tokens


def profile_attend(dtype: str, device: torch.device, opts: ProfileOptions = ProfileOptions(),
                   grid: Sequence[Sequence[float]] = ATTEND_GRID) -> KernelProfile:
    """The ``attend`` kernel's profile in ``dtype`` over ``grid`` (kv_bytes, head_dim, group)."""
    tdt = TORCH_DTYPES[dtype]
    seconds, spread = [], []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for kv_bytes, head_dim, group in itertools.product(*grid):
        b, h, kvh, d, t = attend_shape(kv_bytes, int(head_dim), int(group), dtype)
        q = torch.randn(b, h, 1, d, generator=gen).to(device=device, dtype=tdt)
        k = torch.randn(b, kvh, t, d, generator=gen).to(device=device, dtype=tdt)
        v = torch.randn(b, kvh, t, d, generator=gen).to(device=device, dtype=tdt)
        acc = partial_attention(q, k[:, :, :1], v[:, :, :1], 1 / math.sqrt(d))

        def once(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, acc: PartialState = acc,
                 d: int = d) -> None:
            merge(acc, partial_attention(q, k, v, 1 / math.sqrt(d)))

        timing = _check("attend", dtype, f"kv_bytes {kv_bytes:g}, head_dim {d}, group {int(group)}",
                        _time(once, device, opts, opts.budget_s), opts)
        seconds.append(timing.median)
        spread.append(timing.spread)
        del q, k, v, acc
    return KernelProfile("attend", dtype, PROFILE_AXES["attend"], tuple(tuple(g) for g in grid), tuple(seconds),
                         tuple(spread))


def _state(elems: int, device: torch.device, tdt: torch.dtype, gen: torch.Generator) -> PartialState:
    heads = max(1, elems // 128)
    d = max(1, elems // heads)
    o = torch.randn(1, heads, 1, d, generator=gen).to(device=device, dtype=tdt)
    l = torch.rand(1, heads, 1, generator=gen).to(device=device, dtype=tdt) + 1
    m = torch.randn(1, heads, 1, generator=gen).to(device=device, dtype=tdt)
    return PartialState(o, l, m)


def _small_kernels(a: PartialState, b: PartialState, flat_ol: torch.Tensor) -> dict[str, Callable[[], object]]:
    n_o = a.o.numel()
    return {
        "merge": lambda: merge(a, b),
        "rescale": lambda: rescale(a, b.m),
        "finalize": lambda: finalize(a),
        # finalize-flat: the flat (o, l) viewed back as a state, then finalized
        "finalize-flat": lambda: finalize(PartialState(flat_ol[:n_o].reshape(a.o.shape),
                                                       flat_ol[n_o:].reshape(a.l.shape), a.m)),
    }


def profile_small(kernel: str, dtype: str, device: torch.device, opts: ProfileOptions = ProfileOptions(),
                  grid: Sequence[float] = ELEMS_GRID) -> KernelProfile:
    """A small kernel's profile (``merge``, ``rescale``, ``finalize`` or ``finalize-flat``) over ``elems``."""
    tdt = TORCH_DTYPES[dtype]
    gen = torch.Generator(device="cpu").manual_seed(1)
    seconds, spread = [], []
    for elems in grid:
        a, b = _state(int(elems), device, tdt, gen), _state(int(elems), device, tdt, gen)
        flat_ol = torch.cat([a.o.reshape(-1), a.l.reshape(-1)])
        fns = _small_kernels(a, b, flat_ol)
        timing = _check(kernel, dtype, f"elems {elems:g}",
                        _time(fns[kernel], device, opts, opts.budget_s / 3), opts)
        seconds.append(timing.median)
        spread.append(timing.spread)
    return KernelProfile(kernel, dtype, PROFILE_AXES[kernel], (tuple(grid),), tuple(seconds), tuple(spread))


def profile_prefill(dtype: str, device: torch.device, opts: ProfileOptions = ProfileOptions(),
                    grid: Sequence[Sequence[float]] = PREFILL_GRID) -> list[KernelProfile]:
    """The prefill block kernels' profiles (``attn-fwd``: a block's partial attention merged into the running state;
    ``attn-bwd``: its gradients, accumulated into dQ and dK/dV) over (row_heads, span, head_dim, density): blocks of
    ``PREFILL_HEADS`` heads, full (density 1) or causal (query i sees the keys up to its place on the diagonal:
    about half the pairs, recorded as density 0.5)."""
    tdt = TORCH_DTYPES[dtype]
    gen = torch.Generator(device="cpu").manual_seed(2)
    fwd_s, bwd_s, fwd_sp, bwd_sp = [], [], [], []
    for row_heads, span, head_dim, density in itertools.product(*grid):
        nq, t, d = max(1, round(row_heads / PREFILL_HEADS)), round(span), int(head_dim)
        mask = None if density >= 1 else (
            torch.arange(t, device=device)[None, :] * nq <= torch.arange(nq, device=device)[:, None] * t)

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen).to(device=device, dtype=tdt)

        q, k, v, dout = rand(1, PREFILL_HEADS, nq, d), rand(1, PREFILL_HEADS, t, d), rand(1, PREFILL_HEADS, t, d), \
            rand(1, PREFILL_HEADS, nq, d)
        scale = 1 / math.sqrt(d)
        acc = partial_attention(q, k[:, :, :1], v[:, :, :1], scale)
        state = partial_attention(q, k, v, scale, mask)
        lse, delta = log_sum_exp(state), attention_delta(finalize(state), dout)
        dq_acc, dk_acc, dv_acc = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

        def fwd(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, acc: PartialState = acc,
                scale: float = scale, mask: torch.Tensor | None = mask) -> None:
            merge(acc, partial_attention(q, k, v, scale, mask))

        def bwd(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, lse: torch.Tensor = lse,
                delta: torch.Tensor = delta, dout: torch.Tensor = dout, scale: float = scale,
                acc: tuple[torch.Tensor, ...] = (dq_acc, dk_acc, dv_acc), mask: torch.Tensor | None = mask) -> None:
            dq, dk, dv = block_backward(q, k, v, scale, mask, lse, delta, dout)
            acc[0].add_(dq)
            acc[1].add_(dk)
            acc[2].add_(dv)

        where = f"row_heads {row_heads:g}, span {t}, head_dim {d}, density {density:g}"
        tf = _check("attn-fwd", dtype, where, _time(fwd, device, opts, opts.budget_s), opts)
        tb = _check("attn-bwd", dtype, where, _time(bwd, device, opts, opts.budget_s), opts)
        fwd_s.append(tf.median)
        bwd_s.append(tb.median)
        fwd_sp.append(tf.spread)
        bwd_sp.append(tb.spread)
    axes, g = PROFILE_AXES["attn-fwd"], tuple(tuple(x) for x in grid)
    return [KernelProfile("attn-fwd", dtype, axes, g, tuple(fwd_s), tuple(fwd_sp)),
            KernelProfile("attn-bwd", dtype, axes, g, tuple(bwd_s), tuple(bwd_sp))]
