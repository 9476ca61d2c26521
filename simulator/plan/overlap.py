"""Ring overlap: the smallest per-rank shard at which ring attention's transfers hide behind its compute, found by
simulation, beside the Ring Attention paper's closed form.

Ring Attention (Liu, Zaharia & Abbeel, arXiv:2310.01889, Sec. 3 and Table 1) overlaps a block's compute with the
next K/V shard's transfer when the block is at least ``F / B`` tokens (F: the device's FLOP/s, B: the link's
bytes/s), for MHA in 16-bit. In this model's terms, a non-causal block of t tokens costs ``4 b h t^2 d / F`` and
its shard ``2 b kv t d e / B`` bytes, so compute covers the transfer from ``t* = (kv / h) (e / 2) F / B`` on, which
is ``F / B`` for MHA in bf16; launch and message overheads and latencies move it up.

:func:`find_overlap` simulates the non-causal ring forward (``overlap: true``, contiguous, P ranks) at growing
then bisected t, and returns the smallest t at which the critical rank's transfers all run under its kernels
(``comm_under_compute_frac`` = 1; they then cost only the SMs they hold, which slow the kernels they overlap:
``comm_hidden_frac`` stays below 1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.algorithms import Layout
from simulator.algorithms.prefill import build_prefill
from simulator.cluster.devices import flops_efficiency
from simulator.cluster.topology import Cluster
from simulator.engine.core import simulate
from simulator.errors import InputError
from simulator.models.presets import PRESETS
from simulator.run.timing import critical_timing
from simulator.units import DTYPE_BYTES
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["OverlapResult", "find_overlap", "overlap_shape"]


@dataclass(frozen=True)
class OverlapResult:
    tokens: int | None  # smallest per-rank shard whose transfers hide (None: not up to the search limit)
    closed_form: float  # (kv / h) (e / 2) F / B tokens
    flops: float  # F: the device's attention-forward FLOP/s
    bandwidth: float  # B: the slowest ring hop's bottleneck bytes/s
    simulations: int


def _hidden(shape: PrefillShape, layout: Layout, cluster: Cluster, tokens: int) -> bool:
    p = layout.ranks
    s = replace(shape, sequence=tokens * p, causal=False, layout="contiguous", backward=False)
    res = simulate(build_prefill("ring", {"overlap": True}, s, layout), cluster)
    return critical_timing(res, p)["comm_under_compute_frac"] >= 1.0 - 1e-12


def find_overlap(shape: PrefillShape, cluster: Cluster, layout: Layout, max_tokens: int = 1 << 24) -> OverlapResult:
    """Smallest per-rank shard (tokens) at which ring's transfers hide, on the first ``layout.ranks`` GPUs."""
    ranks = cluster.ranks[: layout.ranks]
    order = layout.ring_order()
    pairs = [(ranks[order[i]], ranks[order[(i + 1) % len(order)]]) for i in range(len(order))]
    cluster.prepare_routes(pairs)  # one batch
    hops = [cluster.route(a, b) for a, b in pairs]
    bandwidth = min(cluster.route_bandwidth(h) for h in hops)
    spec = cluster.specs[ranks[0]]
    flops = spec.flops_for(shape.dtype) * flops_efficiency(spec, "attn-fwd")
    closed = shape.kv_heads / shape.heads * shape.elem_bytes / 2 * flops / bandwidth
    sims = 0
    lo, hi = 0, 1  # hidden(lo) is False (or lo = 0), hidden(hi) to be found
    while hi <= max_tokens:
        sims += 1
        if _hidden(shape, layout, cluster, hi):
            break
        lo, hi = hi, hi * 2
    else:
        return OverlapResult(None, closed, flops, bandwidth, sims)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        sims += 1
        if _hidden(shape, layout, cluster, mid):
            hi = mid
        else:
            lo = mid
    return OverlapResult(hi, closed, flops, bandwidth, sims)


def overlap_shape(model: str, dtype: str) -> PrefillShape:
    """The attention shape of a preset, or of ``HEADS,KV_HEADS,HEAD_DIM`` (batch 1; the sequence is searched)."""
    if dtype not in DTYPE_BYTES:
        raise InputError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}", field="--dtype")
    if model in PRESETS:
        p = PRESETS[model]
        return PrefillShape(1, p.heads, p.head_dim, p.kv_heads, 1, dtype)
    try:
        heads, kv, head_dim = (int(x) for x in model.split(","))
    except ValueError:
        raise InputError(f"expected a preset ({', '.join(PRESETS)}) or HEADS,KV_HEADS,HEAD_DIM, got {model!r}",
                         field="--model") from None
    if min(heads, kv, head_dim) < 1 or heads % kv:
        raise InputError(f"heads ({heads}) must be a positive multiple of kv_heads ({kv})", field="--model")
    return PrefillShape(1, heads, head_dim, kv, 1, dtype)
