"""A whole decode step of a model preset: every layer's projections and MLP, its attention, and the LM head.

With ``tp`` (tensor parallelism) the GPUs form groups of ``tp`` consecutive ranks; each group holds 1/tp of every
layer's weights and heads and ends its attention output projection and its MLP with an allreduce of the hidden
state (Megatron-style). The context is sharded over the ``P / tp`` groups: the attention of head group j runs the
chosen schedule over GPU j of every group (on a DGX with tp = 8, one GPU per node on one NIC rail), all head
groups at once, sharing the fabric.

Layers run one after another; the step takes ``layers x (dense + attention) + LM head``, where each term is
the simulated makespan of that stage on every rank (a layer starts when the slowest rank finished the previous
one). Memory per rank: the weights it holds, every layer's KV shard, and one layer's transient buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from simulator.algorithms import Layout, build_schedule
from simulator.cluster.devices import DTYPE_BYTES
from simulator.cluster.topology import Cluster
from simulator.collectives import allreduce, fabric_of
from simulator.engine.core import simulate
from simulator.memory import timeline_peaks
from simulator.models import ModelPreset
from simulator.schedule import Schedule
from simulator.workloads.shape import DecodeShape

__all__ = ["StepResult", "attention_layer", "dense_layer", "model_step"]


def attention_layer(name: str, params: dict[str, Any], shape: DecodeShape, tp: int, cluster: Cluster) -> Schedule:
    """One layer's attention: ``tp`` head groups, each the named schedule over ``P / tp`` context shards."""
    ranks = cluster.ranks
    if len(ranks) % tp:
        raise ValueError(f"tp ({tp}) must divide the {len(ranks)} GPUs")
    cp = len(ranks) // tp
    part_shape = dataclasses.replace(shape, heads=shape.heads // tp, kv_heads=max(1, shape.kv_heads // tp))
    parts = []
    for j in range(tp):
        nodes = [ranks[g * tp + j] for g in range(cp)]
        parts.append((build_schedule(name, params, part_shape, Layout(cluster.host_indices(nodes))), nodes))
    return Schedule.combine(parts, name=name) if tp > 1 else _placed(parts[0])


def _placed(part: tuple[Schedule, Sequence[str]]) -> Schedule:
    sched, nodes = part
    sched.placement = tuple(nodes)
    return sched


def dense_layer(model: ModelPreset, shape: DecodeShape, tp: int, cluster: Cluster, weight_dtype: str | None = None
                ) -> Schedule:
    """One layer outside attention on every rank: QKV, O projection + allreduce, MLP + allreduce.

    Weights are ``weight_dtype`` elements (default: the activations' ``shape.dtype``)."""
    p = len(cluster.ranks)
    sched = Schedule(p, placement=tuple(cluster.ranks), name="dense")
    b, h, eb = shape.batch, model.hidden, shape.elem_bytes
    wb = DTYPE_BYTES[weight_dtype or shape.dtype]
    qkv = h * (model.heads + 2 * model.kv_heads) * model.head_dim // tp
    o_proj = model.heads * model.head_dim * h // tp
    mlp = 3 * h * model.intermediate // tp
    hosts = cluster.host_indices(cluster.ranks)
    fabric = fabric_of(cluster)
    last = {r: sched.add_compute(r, "qkv", flops=2 * b * qkv, nbytes=qkv * wb + 2 * b * h * eb, dtype=shape.dtype)
            for r in range(p)}
    for stage, weights in (("o-proj", o_proj), ("mlp", mlp)):
        front: dict[int, tuple[int, ...]] = {
            r: (sched.add_compute(r, stage, flops=2 * b * weights, nbytes=weights * wb + 2 * b * h * eb,
                                  dtype=shape.dtype, deps=[last[r]]),) for r in range(p)}
        if tp > 1:
            for g in range(p // tp):
                group = list(range(g * tp, (g + 1) * tp))
                front.update(allreduce(sched, group, hosts, f"h.{stage}", b * h, op="sum", algo="auto", fabric=fabric,
                                       elem_bytes=eb, dtype=shape.dtype, tag=f"{stage}.allreduce",
                                       deps={r: front[r] for r in group}))
        last = {r: sched.add_compute(r, f"{stage}.done", dtype=shape.dtype, deps=front[r], fused=True)
                for r in range(p)}
    return sched


def _head(model: ModelPreset, shape: DecodeShape, tp: int, cluster: Cluster, weight_bytes: int) -> Schedule:
    p = len(cluster.ranks)
    sched = Schedule(p, placement=tuple(cluster.ranks), name="lm-head")
    w = model.head_weights // tp
    for r in range(p):
        sched.add_compute(r, "lm-head", flops=2 * shape.batch * w, nbytes=w * weight_bytes, dtype=shape.dtype)
    return sched


@dataclasses.dataclass(frozen=True)
class StepResult:
    """A whole decode step of a model: its latency, the critical compute, bytes moved, per-rank peaks, events,
    and, for explanations, its parts (seconds, summed over the layers)."""

    latency_s: float
    compute_s: float
    bytes_moved: float
    peaks: list[float]
    events: int
    dense_s: float = 0.0  # every layer's projections, MLP and their allreduces
    attention_s: float = 0.0  # every layer's attention schedule
    attention_compute_s: float = 0.0  # of which kernels, on the rank that finishes attention last
    head_s: float = 0.0  # the LM head


def model_step(model: ModelPreset, name: str, params: dict[str, Any], shape: DecodeShape, tp: int,
               cluster: Cluster, weight_dtype: str | None = None) -> StepResult:
    """Simulate one layer's dense part and attention, and the LM head; compose the decode step."""
    wb = DTYPE_BYTES[weight_dtype or shape.dtype]
    attn = attention_layer(name, params, shape, tp, cluster)
    runs = [simulate(s, cluster) for s in (dense_layer(model, shape, tp, cluster, weight_dtype), attn)]
    head = simulate(_head(model, shape, tp, cluster, wb), cluster)
    layer = sum(r.makespan for r in runs)
    place = attn.placement_on(cluster.ranks)
    attn_peak = dict(zip(place, timeline_peaks(attn, runs[1].timeline), strict=True))
    kv = {place[r]: bufs.get("kv0", 0.0) for r, bufs in attn.initial.items()}
    weights_bytes = model.params / tp * wb  # the published count, split over the tp group
    peaks = [weights_bytes + (model.layers - 1) * kv.get(n, 0.0) + attn_peak.get(n, 0.0) for n in cluster.ranks]
    return StepResult(
        latency_s=model.layers * layer + head.makespan,
        compute_s=model.layers * sum(r.critical_split()[0] for r in runs) + head.critical_split()[0],
        bytes_moved=model.layers * sum(r.bytes_sent() for r in runs),
        peaks=peaks,
        events=sum(r.events for r in runs) + head.events,
        dense_s=model.layers * runs[0].makespan,
        attention_s=model.layers * runs[1].makespan,
        attention_compute_s=model.layers * runs[1].critical_split()[0],
        head_s=head.makespan,
    )
