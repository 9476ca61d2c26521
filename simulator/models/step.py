"""A whole decode step (or a whole prefill) of a model: every layer's projections and MLP, its attention, and the
LM head.

With ``tp`` (tensor parallelism) the GPUs form groups of ``tp`` consecutive ranks; each group holds 1/tp of every
layer's weights and heads and ends its attention output projection and its MLP with an allreduce of the hidden
state (Megatron-style). The context is sharded over the ``P / tp`` groups: the attention of head group j runs the
chosen schedule over GPU j of every group (on a DGX with tp = 8, one GPU per node on one NIC rail), all head
groups at once, sharing the fabric.

Layers run one after another; the step takes ``layers x (dense + attention) + LM head``, where each term is
the simulated makespan of that stage on every rank (a layer starts when the slowest rank finished the previous
one). Memory per rank: the weights it holds, every layer's KV shard, and one layer's transient buffers.

A prefill (:func:`prefill_model`) composes the same way: each context-parallel group transforms the tokens of its
layout shard (``rows`` of the hidden state instead of ``batch``), with its elementwise kernels as well (the two
RMSNorms fused with their residual adds, RoPE on q and k, SiLU-and-mul of the MLP; a decode step leaves them out,
negligible beside its weight reads), the attention layer runs the prefill schedule, and the LM head computes the
logits of each sequence's last token on the group holding it. Memory adds, per rank, the residual stream of its
rows and, outside attention, the MLP's transient activations: ``peak = weights / tp + (layers - 1) x KV shard +
max(attention's peak, KV shard + rows (hidden + 2 intermediate / tp)) + rows hidden`` (x dtype bytes); on a cached
prefix the rows are the new tokens and the KV shard holds the group's share of the cache too. Weights in their own
precision (per part, FP8 at the FP8 rate with row-wise scales): :mod:`simulator.models.precision`.
Model FLOPs (:func:`prefill_model_flops`) count the matmuls only: ``2 x`` weights per token for every layer,
attention's unmasked pairs, and the LM head of the last tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from simulator.algorithms import Layout, build_schedule
from simulator.algorithms.prefill import build_prefill
from simulator.cluster.symmetry import first_server
from simulator.cluster.topology import Cluster
from simulator.collectives import Fabric, allreduce, fabric_of
from simulator.engine.core import SimResult, simulate
from simulator.models.precision import SCALE_BYTES, WeightPrecision, gemm_dtype, weight_bytes, weight_precision
from simulator.models.presets import ModelPreset
from simulator.schedule.core import Schedule
from simulator.schedule.memory import timeline_peaks
from simulator.units import DTYPE_BYTES
from simulator.workloads.layouts import layout_runs, run_tokens
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.shape import DecodeShape

__all__ = ["StepResult", "attention_layer", "dense_layer", "dense_on_one_server", "model_step", "prefill_model",
           "prefill_model_flops", "tp_shape"]

Shape = DecodeShape | PrefillShape
Builder = Callable[[str, Mapping[str, Any], Any, Layout], Schedule]  # build_schedule or build_prefill


def tp_shape(shape: Shape, tp: int) -> Any:
    """The attention shape of one of ``tp`` head groups: heads / tp query heads, kv_heads / tp (at least one)."""
    return dataclasses.replace(shape, heads=shape.heads // tp, kv_heads=max(1, shape.kv_heads // tp))


def attention_layer(name: str, params: Mapping[str, Any], shape: Shape, tp: int, cluster: Cluster,
                    build: Builder = build_schedule, fabric: Fabric | None = None) -> Schedule:
    """One layer's attention: ``tp`` head groups, each the named schedule (``build``: decode or prefill) over
    ``P / tp`` context shards. ``fabric`` (tp 1 only: the ranks are then the cluster's own) runs its collectives as
    NCCL does. A schedule on fewer ranks than its group (``single``: one) runs on the group's first GPUs."""
    ranks = cluster.ranks
    if len(ranks) % tp:
        raise ValueError(f"tp ({tp}) must divide the {len(ranks)} GPUs")
    cp = len(ranks) // tp
    part_shape = tp_shape(shape, tp)
    parts = []
    built: dict[tuple[int, ...], Schedule] = {}  # head groups on the same servers: one schedule, built once
    for j in range(tp):
        nodes = [ranks[g * tp + j] for g in range(cp)]
        hosts = cluster.host_indices(nodes)
        sched = built.get(hosts)
        if sched is None:
            sched = built[hosts] = build(name, params, part_shape, Layout(hosts, fabric if tp == 1 else None))
        parts.append((sched, nodes[: sched.ranks]))
    return Schedule.combine(parts, name=name) if tp > 1 else _placed(parts[0])


def _placed(part: tuple[Schedule, Sequence[str]]) -> Schedule:
    sched, nodes = part
    sched.placement = tuple(nodes)
    return sched


_ONE_SERVER: ContextVar[dict[Any, Any] | None] = ContextVar("dense_on_one_server", default=None)


@contextlib.contextmanager
def dense_on_one_server(memo: dict[Any, Any] | None = None) -> Iterator[None]:
    """Inside: a dense layer (:func:`dense_layer`) on servers that are all alike
    (:func:`simulator.cluster.symmetry.first_server`), whose tensor-parallel groups stay inside a server and whose
    ranks transform the same rows on every server, is built on the first server only. Every server then runs the
    first's timeline (the same floats): the layer's makespan, its critical rank (the lowest of the last to finish)
    and that rank's compute are the whole layer's; its bytes and events are one server's. For the planners
    (:mod:`simulator.plan`), which read latencies, compute and memory only. ``memo`` (a dict the caller keeps
    across calls): a whole step's dense layer is built and simulated once per cluster and arguments (the same
    schedule for every attention schedule and layout of a prefill on that cluster)."""
    token = _ONE_SERVER.set({} if memo is None else memo)
    try:
        yield
    finally:
        _ONE_SERVER.reset(token)


# what a dense layer never reads of its shape (attention's: its context, a prefill's sequence and layout come in as
# rows): steps and layouts that differ only there share one (tests/test_plan_speed.py holds dense_layer to it)
_DENSE_BLIND = frozenset({"context", "sequence", "layout"})


def _dense(model: ModelPreset, shape: Shape, tp: int, cluster: Cluster, prec: WeightPrecision,
           rows: Sequence[int] | None = None, elementwise: bool = False) -> Schedule:
    """:func:`dense_layer`, kept in :func:`dense_on_one_server`'s memo by its arguments (the cluster by identity)."""
    memo = _ONE_SERVER.get()
    seen = tuple((f.name, getattr(shape, f.name)) for f in dataclasses.fields(shape) if f.name not in _DENSE_BLIND)
    key = ("dense", model, type(shape), seen, tp, id(cluster), prec, None if rows is None else tuple(rows),
           elementwise)
    try:
        hit = None if memo is None else memo.get(key)
    except TypeError:  # an argument that cannot be a key
        memo = None
        hit = None
    if hit is None or hit[0] is not cluster:
        hit = (cluster, dense_layer(model, shape, tp, cluster, prec, rows=rows, elementwise=elementwise))
        if memo is not None:
            memo[key] = hit
    return hit[1]


def _simulated(sched: Schedule, cluster: Cluster) -> SimResult:
    """``simulate(sched, cluster)``, kept in :func:`dense_on_one_server`'s memo for the schedule and cluster (by
    identity: the memo holds both)."""
    memo = _ONE_SERVER.get()
    if memo is None:
        return simulate(sched, cluster)
    key = ("run", id(sched), id(cluster))
    hit = memo.get(key)
    if hit is None or hit[0] is not sched or hit[1] is not cluster:
        hit = memo[key] = (sched, cluster, simulate(sched, cluster))
    return hit[2]


def _dense_ranks(cluster: Cluster, tp: int, n_rows: Sequence[int]) -> int:
    """How many ranks (the first) a dense layer builds: all, or inside :func:`dense_on_one_server` where it
    applies, the first server's."""
    p = len(n_rows)
    if _ONE_SERVER.get() is None:
        return p
    gpn = first_server(cluster, p, tp)
    return p if any(n_rows[r] != n_rows[r % gpn] for r in range(p)) else gpn


def dense_layer(model: ModelPreset, shape: Shape, tp: int, cluster: Cluster,
                weight_dtype: str | WeightPrecision | None = None, *, rows: Sequence[int] | None = None,
                elementwise: bool = False) -> Schedule:
    """One layer outside attention on every rank: QKV, O projection + allreduce, MLP + allreduce.

    Weights are ``weight_dtype`` elements (one type, or one per part: :mod:`simulator.models.precision`; default:
    the activations' ``shape.dtype``); a stage whose weights are FP8 runs at the FP8 rate and reads its row-wise
    scales. ``rows[r]``: the rows of the hidden state rank r transforms (default ``shape.batch``: one decode token
    per sequence); the ranks of a tensor parallel group must have the same. ``elementwise`` adds the kernels outside
    the matmuls (:data:`__doc__`), and an FP8 stage's quantization of its inputs."""
    p = len(cluster.ranks)
    sched = Schedule(p, placement=tuple(cluster.ranks), name="dense")
    h, eb = model.hidden, shape.elem_bytes
    n_rows = list(rows) if rows is not None else [shape.batch] * p
    prec = weight_precision(weight_dtype, shape.dtype)
    qkv = h * (model.heads + 2 * model.kv_heads) * model.head_dim // tp
    o_proj = model.heads * model.head_dim * h // tp
    mlp = 3 * h * model.intermediate // tp
    hosts = cluster.host_indices(cluster.ranks)
    fabric = fabric_of(cluster)
    built = range(_dense_ranks(cluster, tp, n_rows))
    extra = _elementwise(model, tp) if elementwise else {}
    quant = _quantized(model, tp, eb, prec) if elementwise else {}
    gemm = {stage: _gemm(model, stage, weights, tp, prec, shape.dtype)
            for stage, weights in (("qkv", qkv), ("o-proj", o_proj), ("mlp", mlp))}
    last = {r: _kernels(sched, r, "qkv", 2 * n_rows[r] * qkv, gemm["qkv"][1] + 2 * n_rows[r] * h * eb,
                        gemm["qkv"][0], (), n_rows[r], extra.get("qkv", ()), eb, quant.get("qkv"), shape.dtype)
            for r in built}
    for stage, weights in (("o-proj", o_proj), ("mlp", mlp)):
        front: dict[int, tuple[int, ...]] = {
            r: (_kernels(sched, r, stage, 2 * n_rows[r] * weights, gemm[stage][1] + 2 * n_rows[r] * h * eb,
                         gemm[stage][0], [last[r]], n_rows[r], extra.get(stage, ()), eb, quant.get(stage),
                         shape.dtype),)
            for r in built}
        if tp > 1:
            for g in range(len(built) // tp):
                group = list(range(g * tp, (g + 1) * tp))
                front.update(allreduce(sched, group, hosts, f"h.{stage}", n_rows[group[0]] * h, op="sum",
                                       algo="auto", fabric=fabric, elem_bytes=eb, dtype=shape.dtype,
                                       tag=f"{stage}.allreduce", deps={r: front[r] for r in group}))
        last = {r: sched.add_compute(r, f"{stage}.done", dtype=shape.dtype, deps=front[r], fused=True)
                for r in built}
    return sched


_STAGE_PART = {"qkv": "attention", "o-proj": "attention", "mlp": "mlp"}


def _gemm(model: ModelPreset, stage: str, weights: int, tp: int, prec: WeightPrecision, act: str
          ) -> tuple[str, float]:
    """(the dtype a stage's matmul runs at, the bytes of weights it reads: its weights at their type and, FP8,
    one FP32 scale per output row)."""
    part = prec.of(_STAGE_PART[stage])
    nbytes: float = weights * DTYPE_BYTES[part]
    if part == "fp8":
        rows = {"qkv": (model.heads + 2 * model.kv_heads) * model.head_dim, "o-proj": model.hidden,
                "mlp": 2 * model.intermediate + model.hidden}[stage]
        nbytes += rows * SCALE_BYTES / tp
    return gemm_dtype(part, act), nbytes


def _quantized(model: ModelPreset, tp: int, eb: int, prec: WeightPrecision) -> dict[str, tuple[float, float]]:
    """(FLOPs, bytes) per row of quantizing the inputs of each FP8 stage's matmuls to FP8, one FP32 scale per row:
    read the input at the activations' size, write it in one byte (max, divide, convert: 3 FLOPs an element)."""
    inputs = {"qkv": (model.hidden,), "o-proj": (model.heads * model.head_dim // tp,),
              "mlp": (model.hidden, model.intermediate // tp)}
    return {stage: (sum(3.0 * x for x in widths), sum(x * (eb + 1.0) + SCALE_BYTES for x in widths))
            for stage, widths in inputs.items() if prec.of(_STAGE_PART[stage]) == "fp8"}


# elementwise kernels of each stage (name, FLOPs per row, elements read + written per row), run in sequence with
# its matmul op on the same rank (their order inside a stage does not change its time): the RMSNorm fused with the
# residual add reads the hidden state and the residual and writes both; RoPE rotates q and k (after the QKV
# projection); SiLU-and-mul reads gate and up and writes their product (between the MLP's matmuls).
def _elementwise(model: ModelPreset, tp: int) -> dict[str, tuple[tuple[str, float, float], ...]]:
    h, qk = model.hidden, (model.heads + model.kv_heads) * model.head_dim // tp
    inter = model.intermediate // tp
    norm = ("norm", 5.0 * h, 4.0 * h)
    return {"qkv": (norm, ("rope", 3.0 * qk, 2.0 * qk)), "mlp": (norm, ("silu-mul", 4.0 * inter, 3.0 * inter))}


def _kernels(sched: Schedule, r: int, stage: str, flops: float, nbytes: float, dtype: str, deps: Sequence[int],
             n_rows: int, elementwise: Sequence[tuple[str, float, float]], eb: int,
             quantize: tuple[float, float] | None = None, act: str | None = None) -> int:
    """A stage's elementwise kernels (if any, at the activations' ``act``, default ``dtype``; ``quantize``: FLOPs
    and bytes per row of its FP8 input quantization), then its matmul (at ``dtype``'s rate); returns the matmul's
    op id."""
    act = act or dtype
    prev = list(deps)
    for name, per_row_flops, per_row_elems in elementwise:
        prev = [sched.add_compute(r, f"{stage}.{name}", flops=per_row_flops * n_rows,
                                  nbytes=per_row_elems * n_rows * eb, dtype=act, deps=prev)]
    if quantize is not None:
        prev = [sched.add_compute(r, f"{stage}.quantize", flops=quantize[0] * n_rows, nbytes=quantize[1] * n_rows,
                                  dtype=act, deps=prev)]
    return sched.add_compute(r, stage, flops=flops, nbytes=nbytes, dtype=dtype, deps=prev)


def _head(model: ModelPreset, shape: Shape, tp: int, cluster: Cluster, weight: str,
          ranks: Sequence[int] | None = None) -> Schedule:
    """The LM head of ``shape.batch`` tokens on ``ranks`` (default: every rank), each with 1/tp of its weights of
    element type ``weight`` (FP8: at the FP8 rate, its row-wise scales read too)."""
    p = len(cluster.ranks)
    sched = Schedule(p, placement=tuple(cluster.ranks), name="lm-head")
    w = model.head_weights // tp
    nbytes: float = w * DTYPE_BYTES[weight]
    if weight == "fp8":
        nbytes += model.vocab * SCALE_BYTES / tp
    for r in range(p) if ranks is None else ranks:
        sched.add_compute(r, "lm-head", flops=2 * shape.batch * w, nbytes=nbytes,
                          dtype=gemm_dtype(weight, shape.dtype))
    return sched


@dataclasses.dataclass(frozen=True)
class StepResult:
    """A whole decode step (or prefill) of a model: its latency, the critical compute, bytes moved, per-rank peaks,
    events, and, for explanations, its parts (seconds, summed over the layers)."""

    latency_s: float
    compute_s: float
    bytes_moved: float
    peaks: list[float]
    events: int
    dense_s: float = 0.0  # every layer's projections, MLP and their allreduces
    attention_s: float = 0.0  # every layer's attention schedule
    attention_compute_s: float = 0.0  # of which kernels, on the rank that finishes attention last
    head_s: float = 0.0  # the LM head
    attention: SimResult | None = dataclasses.field(default=None, repr=False)  # one layer's attention, simulated


def _compose(model: ModelPreset, dense: Schedule, attn: Schedule, head: Schedule, cluster: Cluster,
             weights_bytes: float, kv: Mapping[str, float], outside: Mapping[str, float] | None = None,
             resident: Mapping[str, float] | None = None) -> StepResult:
    """Simulate one layer's dense part and attention, and the LM head; ``layers x (dense + attention) + head``.

    Per GPU: ``weights + (layers - 1) x kv + max(attention's peak, outside) + resident`` bytes."""
    runs = [_simulated(dense, cluster), simulate(attn, cluster)]  # a dense layer shared by steps: simulated once
    head_run = simulate(head, cluster)
    layer = sum(r.makespan for r in runs)
    place = attn.placement_on(cluster.ranks)
    attn_peak = dict(zip(place, timeline_peaks(attn, runs[1]), strict=True))
    out, res = outside or {}, resident or {}
    peaks = [weights_bytes + (model.layers - 1) * kv.get(n, 0.0) + max(attn_peak.get(n, 0.0), out.get(n, 0.0))
             + res.get(n, 0.0) for n in cluster.ranks]
    return StepResult(
        latency_s=model.layers * layer + head_run.makespan,
        compute_s=model.layers * sum(r.critical_split()[0] for r in runs) + head_run.critical_split()[0],
        bytes_moved=model.layers * sum(r.bytes_sent() for r in runs) + head_run.bytes_sent(),
        peaks=peaks,
        events=sum(r.events for r in runs) + head_run.events,
        dense_s=model.layers * runs[0].makespan,
        attention_s=model.layers * runs[1].makespan,
        attention_compute_s=model.layers * runs[1].critical_split()[0],
        head_s=head_run.makespan,
        attention=runs[1],
    )


def model_step(model: ModelPreset, name: str, params: dict[str, Any], shape: DecodeShape, tp: int,
               cluster: Cluster, weight_dtype: str | WeightPrecision | None = None) -> StepResult:
    """Simulate one layer's dense part and attention, and the LM head; compose the decode step (weights as
    ``weight_dtype`` says: :mod:`simulator.models.precision`)."""
    prec = weight_precision(weight_dtype, shape.dtype)
    attn = attention_layer(name, params, shape, tp, cluster)
    place = attn.placement_on(cluster.ranks)
    kv = {place[r]: bufs.get("kv0", 0.0) for r, bufs in attn.initial.items()}
    return _compose(model, _dense(model, shape, tp, cluster, prec), attn,
                    _head(model, shape, tp, cluster, prec.head), cluster, weight_bytes(model, prec, tp), kv)


def group_tokens(shape: PrefillShape, groups: int) -> list[int]:
    """Tokens of each of the ``groups`` context-parallel shards of ``shape.layout``."""
    return [run_tokens(runs) for runs in layout_runs(shape.layout, shape.sequence, groups)]


def group_kv_bytes(shape: PrefillShape, tp: int, groups: int) -> list[float]:
    """KV bytes one GPU of each context-parallel group holds per layer: its TP share of the heads, for the group's
    share of a cached prefix (docs/serving.md) and of the new tokens."""
    part = tp_shape(shape, tp)
    cached = [run_tokens(runs) for runs in layout_runs(shape.layout, shape.cached, groups)] if shape.cached else \
        [0] * groups
    return [part.kv_bytes(c + t) for c, t in zip(cached, group_tokens(shape, groups), strict=True)]


def _last_group(shape: PrefillShape, groups: int) -> int:
    """The context-parallel group that holds the sequence's last position."""
    last = shape.sequence - 1
    for g, runs in enumerate(layout_runs(shape.layout, shape.sequence, groups)):
        if any(run.start <= last < run.start + run.step * run.size and (last - run.start) % run.step == 0
               for run in runs):
            return g
    raise AssertionError("a layout covers every position")


def prefill_model(model: ModelPreset, name: str, params: Mapping[str, Any], shape: PrefillShape, tp: int,
                  cluster: Cluster, fabric: Fabric | None = None,
                  weight_dtype: str | WeightPrecision | None = None) -> StepResult:
    """Simulate one layer's dense part (elementwise kernels too) and its attention (the prefill schedule), and the
    LM head of the last tokens; compose the whole prefill (module docstring, memory included)."""
    p = len(cluster.ranks)
    cp, eb = p // tp, shape.elem_bytes
    prec = weight_precision(weight_dtype, shape.dtype)
    per_group = group_tokens(shape, cp)
    rows = [shape.batch * per_group[r // tp] for r in range(p)]
    attn = attention_layer(name, params, shape, tp, cluster, build=build_prefill, fabric=fabric)
    last = _last_group(shape, cp)
    group_kv = group_kv_bytes(shape, tp, cp)  # held for every layer
    kv = {n: group_kv[r // tp] for r, n in enumerate(cluster.ranks)}
    outside = {n: kv[n] + rows[r] * (model.hidden + 2 * (model.intermediate // tp)) * eb
               for r, n in enumerate(cluster.ranks)}
    resident = {n: rows[r] * model.hidden * eb for r, n in enumerate(cluster.ranks)}
    dense = _dense(model, shape, tp, cluster, prec, rows=rows, elementwise=True)
    head = _head(model, shape, tp, cluster, prec.head, ranks=range(last * tp, (last + 1) * tp))
    return _compose(model, dense, attn, head, cluster, weight_bytes(model, prec, tp), kv, outside, resident)


def prefill_model_flops(model: ModelPreset, shape: PrefillShape) -> float:
    """Model FLOPs of a whole prefill: every layer's matmuls (2 per weight per new token: a cached prefix's tokens
    are not transformed again) and attention (unmasked pairs only), and the LM head of each sequence's last
    token."""
    tokens = shape.batch * shape.sequence
    return model.layers * (2.0 * tokens * model.layer_weights + shape.model_flops) \
        + 2.0 * shape.batch * model.head_weights
