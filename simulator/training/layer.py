"""One layer of one micro-batch on one pipeline stage, simulated on the event engine: the pieces a training step is
composed of (docs/training.md).

The stage's ``tp x cp`` GPUs are the cluster's first ones (the representative pipeline's stage 0; every stage sits
on the same shape of servers, so every stage's layer takes the same time). Rank ``c * tp + t`` is TP rank ``t`` of
CP rank ``c``: a TP group is ``tp`` consecutive GPUs (inside a server), a CP group one GPU of each TP group.

* **Dense part** (:func:`dense_pass`): the QKV projection, the attention output projection and the gated MLP on the
  roofline at the training dtype, on the ``rows`` tokens the rank holds (``micro_batch x sequence / cp``), with their
  elementwise kernels (two RMSNorms with residual adds, RoPE, SiLU-and-mul). TP (Megatron-LM): an allreduce of the
  hidden state after the output projection and after the MLP; with sequence parallelism an all-gather before the
  QKV projection and before the MLP and a reduce-scatter after each, the elementwise kernels on ``rows / tp``. The
  backward runs the matmuls' input and weight gradients (twice the forward's FLOPs; bytes: weights read, weight
  gradients written, four activations) in reverse order with the conjugate collectives (an allreduce after the MLP's
  and the QKV's input gradient; with sequence parallelism the all-gathers and reduce-scatters swapped).
* **Attention** (:func:`attention_pass`): the prefill schedule ``cp_algorithm`` over each CP group, the ``tp`` head
  groups at once on the fabric (as :func:`simulator.models.step.attention_layer`), forward alone and forward +
  backward; the backward is their difference.
* **Point to point** (:func:`p2p_time`): every GPU of a stage sends its activation (or gradient) shard to the same
  GPU of the next stage (``tp x cp x pp`` GPUs further on the cluster's order), all at once.
* **LM head** on the roofline (:func:`head_times`): the logits of the rank's rows for its ``vocab / tp`` columns,
  in fp32, and their backward (twice the FLOPs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from simulator.algorithms import Layout
from simulator.algorithms.prefill import build_prefill
from simulator.cluster.devices import DeviceSpec, compute_time, duration_with_sms_held
from simulator.cluster.symmetry import first_server
from simulator.cluster.topology import Cluster
from simulator.collectives import Fabric, collective, fabric_of
from simulator.engine.core import SimResult, simulate
from simulator.models.presets import ModelPreset
from simulator.models.step import tp_shape
from simulator.schedule.core import COMPUTE_KINDS, Schedule
from simulator.units import DTYPE_BYTES
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["Kernel", "Piece", "attention_pass", "attention_schedule", "dense_pass", "dense_servers", "head_times",
           "p2p_time"]


@dataclasses.dataclass(frozen=True)
class Piece:
    """A simulated piece: its makespan, the critical rank's kernel seconds (the rest is exposed communication), bytes
    sent and engine events; ``kernels`` (less ``less``): those kernels' timing arguments, to time them again on
    fewer SMs (:meth:`kernel_seconds`)."""

    time: float
    compute: float
    bytes: float = 0.0
    events: int = 0
    kernels: tuple[Kernel, ...] = dataclasses.field(default=(), compare=False, repr=False)
    less: tuple[Kernel, ...] = dataclasses.field(default=(), compare=False, repr=False)

    def kernel_seconds(self, spec: DeviceSpec, held: int) -> float:
        """The critical rank's kernels' seconds, each timed alone on ``spec`` while ``held`` of its SMs are taken
        (:func:`simulator.cluster.devices.duration_with_sms_held`, the engine's contention model)."""
        return _seconds(spec, held, self.kernels) - _seconds(spec, held, self.less)

    @property
    def exposed(self) -> float:
        return max(0.0, self.time - self.compute)

    @staticmethod
    def of(result: SimResult) -> Piece:
        """A simulation's piece: ``compute`` is the critical rank's kernel seconds outside collectives (a
        collective's reductions, fused into its communication kernels, count as communication, as does what
        transfers holding SMs added to a kernel: :attr:`SimResult.slowed`)."""
        ids = result.ended(COMPUTE_KINDS, (result.critical_rank(),))
        own = np.array([i for i, op in zip(ids.tolist(), result.ops.take(ids), strict=True) if not op.coll],
                       dtype=np.int64)
        spans = result.end[own] - result.start[own]
        if result.slowed is not None:
            spans = spans - result.slowed[own]
        compute = sum(spans.tolist())  # in timeline order, as critical_split adds
        kernels = tuple(Kernel(op.flops, op.nbytes, op.dtype, op.fn, op.dims, op.fused) for op in result.ops.take(own))
        return Piece(result.makespan, compute, result.bytes_sent(), result.events, kernels)

    def minus(self, other: Piece) -> Piece:
        return Piece(self.time - other.time, self.compute - other.compute, self.bytes - other.bytes,
                     self.events - other.events, self.kernels + other.less, self.less + other.kernels)


class Kernel(NamedTuple):
    """A kernel's timing arguments (an op's: :func:`simulator.cluster.devices.duration_with_sms_held`'s)."""

    flops: float
    nbytes: float
    dtype: str
    fn: str
    dims: tuple[float, ...]
    fused: bool


def _seconds(spec: DeviceSpec, held: int, kernels: Sequence[Kernel]) -> float:
    return sum(duration_with_sms_held(spec, held, *k) for k in kernels)


# elementwise kernels of each stage: (name, FLOPs per row, elements read + written per row), as models.step's
def _elementwise(model: ModelPreset, tp: int) -> dict[str, tuple[tuple[str, float, float], ...]]:
    h, qk = model.hidden, (model.heads + model.kv_heads) * model.head_dim // tp
    inter = model.intermediate // tp
    norm = ("norm", 5.0 * h, 4.0 * h)
    return {"qkv": (norm, ("rope", 3.0 * qk, 2.0 * qk)), "mlp": (norm, ("silu-mul", 4.0 * inter, 3.0 * inter))}


def _weights(model: ModelPreset, tp: int) -> dict[str, int]:
    """Weights of each matmul stage of one TP rank."""
    return {"qkv": model.hidden * (model.heads + 2 * model.kv_heads) * model.head_dim // tp,
            "o-proj": model.heads * model.head_dim * model.hidden // tp,
            "mlp": 3 * model.hidden * model.intermediate // tp}


def dense_servers(cluster: Cluster, tp: int, cp: int) -> int:
    """Over how many alike servers the stage's ``tp x cp`` GPUs lie, each holding whole TP groups, so that one
    server's dense part is every server's (:func:`simulator.cluster.symmetry.first_server`: alike servers never share
    a link and run at the same instants, the same floats); 1 where that does not hold (one server, or TP groups that
    cross servers, or servers that differ)."""
    n = tp * cp
    return n // first_server(cluster, n, tp)


def dense_pass(model: ModelPreset, tp: int, cp: int, rows: int, dtype: str, cluster: Cluster, *,
               backward: bool, sequence_parallel: bool, fabric: Fabric | None = None, alike: bool = True) -> Piece:
    """One layer's dense part, forward or backward, on the stage's ``tp x cp`` GPUs (module docstring). ``alike``:
    where the GPUs lie on alike servers (:func:`dense_servers`), only the first server's TP groups are built and
    simulated: the same makespan and critical rank's kernels, the bytes every server's (one's times the servers),
    the events one server's."""
    servers = dense_servers(cluster, tp, cp) if alike else 1
    cp //= servers
    n = tp * cp
    sched = Schedule(n, placement=tuple(cluster.ranks[:n]), name="dense-bwd" if backward else "dense")
    fabric = fabric or fabric_of(cluster)
    eb = DTYPE_BYTES[dtype]
    h, weights, extra = model.hidden, _weights(model, tp), _elementwise(model, tp)
    sp = sequence_parallel and tp > 1
    ew_rows = rows // tp if sp else rows
    order = ("mlp", "o-proj", "qkv") if backward else ("qkv", "o-proj", "mlp")
    # the collectives before and after each stage: the forward's, and in the backward their conjugates
    if backward and sp:
        before = {"mlp": "allgather", "o-proj": "allgather"}
        after = {"mlp": "reduce-scatter", "qkv": "reduce-scatter"}
    elif backward:
        before, after = {}, {"mlp": "allreduce", "qkv": "allreduce"}
    elif sp:
        before = {"qkv": "allgather", "mlp": "allgather"}
        after = {"o-proj": "reduce-scatter", "mlp": "reduce-scatter"}
    else:
        before, after = {}, {"o-proj": "allreduce", "mlp": "allreduce"}
    front: dict[int, tuple[int, ...]] = {r: () for r in range(n)}
    groups = [list(range(c * tp, (c + 1) * tp)) for c in range(cp)]

    def comm(op: str, stage: str, when: str) -> None:
        if tp == 1:
            return
        for g in groups:
            f, _ = collective(sched, op, g, f"h.{stage}.{when}", rows * h, fabric, elem_bytes=eb, dtype=dtype,
                              tag=f"{stage}.{op}", deps={r: front[r] for r in g})
            front.update(f)

    for stage in order:
        if stage in before:
            comm(before[stage], stage, "in")
        w = weights[stage]
        mult = 2 if backward else 1
        for r in range(n):
            prev = list(front[r])
            for name, per_flops, per_elems in extra.get(stage, ()):
                prev = [sched.add_compute(r, f"{stage}.{name}", flops=mult * per_flops * ew_rows,
                                          nbytes=mult * per_elems * ew_rows * eb, dtype=dtype, deps=prev)]
            nbytes = (2 * w * eb + 4 * rows * h * eb) if backward else (w * eb + 2 * rows * h * eb)
            front[r] = (sched.add_compute(r, stage, flops=2 * mult * rows * w, nbytes=nbytes, dtype=dtype,
                                          deps=prev),)
        if stage in after:
            comm(after[stage], stage, "out")
    piece = Piece.of(simulate(sched, cluster))
    return piece if servers == 1 else dataclasses.replace(piece, bytes=piece.bytes * servers)


def attention_schedule(name: str, shape: PrefillShape, tp: int, cp: int, cluster: Cluster) -> Schedule:
    """The ``tp`` head groups' attention, each ``name`` over its CP group (one GPU of each TP group)."""
    part = tp_shape(shape, tp)
    parts = []
    fabric = fabric_of(cluster) if tp == 1 and not cluster.host_cores else None
    for j in range(tp):
        nodes = [cluster.ranks[c * tp + j] for c in range(cp)]
        sched = build_prefill(name, {}, part, Layout(cluster.host_indices(nodes), fabric))
        parts.append((sched, nodes[: sched.ranks]))
    if tp == 1:
        sched, nodes = parts[0]
        sched.placement = tuple(nodes)
        return sched
    return Schedule.combine(parts, name=name)


def attention_pass(name: str, shape: PrefillShape, tp: int, cp: int, cluster: Cluster) -> tuple[Piece, Piece]:
    """(forward, backward) of one layer's attention of one micro-batch over the stage's CP groups."""
    forward = attention_schedule(name, dataclasses.replace(shape, backward=False), tp, cp, cluster)
    both = attention_schedule(name, dataclasses.replace(shape, backward=True), tp, cp, cluster)
    fwd = Piece.of(simulate(forward, cluster))
    return fwd, Piece.of(simulate(both, cluster)).minus(fwd)


def p2p_time(nbytes: float, stage_gpus: int, cluster: Cluster) -> Piece:
    """Every GPU of stage 0 sends ``nbytes`` to its peer of stage 1 (``stage_gpus`` further on), all at once."""
    ranks: Sequence[str] = cluster.ranks[: 2 * stage_gpus]
    sched = Schedule(len(ranks), placement=tuple(ranks), name="p2p")
    for r in range(stage_gpus):
        sched.add_transfer(r, r + stage_gpus, nbytes, "act")
    result = simulate(sched, cluster)
    return Piece(result.makespan, 0.0, result.bytes_sent(), result.events)


def head_times(model: ModelPreset, tp: int, rows: int, dtype: str, cluster: Cluster) -> tuple[float, float]:
    """(forward, backward) seconds of the LM head on ``rows`` tokens of one TP rank: logits in fp32."""
    spec = cluster.specs[cluster.ranks[0]]
    w = model.head_weights // tp
    wb = DTYPE_BYTES[dtype]
    logits = rows * (model.vocab // tp) * 4.0
    fwd = compute_time(spec, 2.0 * rows * w, w * wb + logits, dtype)
    bwd = compute_time(spec, 4.0 * rows * w, 2.0 * w * wb + 2.0 * logits, dtype)
    return fwd, bwd
