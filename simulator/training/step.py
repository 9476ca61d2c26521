"""A whole training step, composed from the engine's pieces (docs/training.md).

1. One layer of one micro-batch on one stage (:mod:`.layer`, on the event engine): the dense part forward and
   backward with its TP collectives, the attention forward and backward over the CP group; per ``recompute`` the
   backward adds the attention's forward (``selective``) or the whole layer's forward (``full``). ZeRO-3 gathers
   each layer's parameters before its forward and its backward and reduce-scatters its gradients after the backward,
   each prefetched under the neighbouring layer's compute: a layer takes ``max(compute, its DP collectives)``, its
   compute slowed while they hold SMs (3.).
2. A stage's forward (backward) of a micro-batch is its layers' (the last stage adds the LM head,
   :func:`~.layer.head_times`); the stages run 1F1B (:mod:`.pipeline`) with the point-to-point time of one
   activation shard (:func:`~.layer.p2p_time`) between them.
3. Each stage's gradients (its layers', the embedding on the first, the LM head on the last; divided by TP) are
   reduced over DP in buckets overlapped with the backward (:mod:`.dp`): an allreduce with ZeRO 0, a reduce-scatter
   with 1 and 2 (2: after every micro-batch, its gradients being sharded; 0 and 1: after the last, gradients
   accumulated), each stage's buckets on one stream beside its pipeline (:class:`~.pipeline.DPStreams`, timed in
   the same walk as the pipeline): a bucket's collective starts once the backwards have done its share of their
   work and the previous bucket's is done, and while one runs, its kernel holds a block per channel on the GPU's
   SMs and the stage's kernels run on the SMs left (:meth:`Pieces.pace`), so its ops take longer and the stages
   that wait for them wait longer; ZeRO-3's per-layer collectives slow the layer they are prefetched under
   (:func:`~.dp.under`). Then the optimizer step on the roofline (:func:`optimizer_time`) and, with ZeRO 1 and 2,
   the all-gather of the updated parameters.
4. The step ends when the last stage is done. A dimension's exposed time is how much shorter the step would be with
   that dimension's communication free (TP: dense parts at their kernel time; CP: attention at its kernel time; PP:
   no point-to-point time; DP: no DP collectives), each by the same composition.

Model FLOPs (for ``tflops_per_gpu`` and ``mfu``): ``6 x tokens x (layers x layer weights + LM head)`` (forward 2,
backward 4 per weight per token) plus attention's forward and backward over the unmasked pairs (3.5 x the forward's
``4 b heads pairs head_dim``); recomputation is not counted (MFU, as PaLM defines it).
"""

from __future__ import annotations

import dataclasses
import functools

from simulator.cluster.devices import DeviceSpec, compute_time
from simulator.cluster.topology import Cluster
from simulator.models.presets import ModelPreset
from simulator.schedule.memory import usable_bytes
from simulator.training.dp import DPCollectives, bucket_sizes, under
from simulator.training.layer import Piece, attention_pass, dense_pass, head_times, p2p_time
from simulator.training.memory import (
    MemoryBreakdown,
    layer_activation_bytes,
    model_state_bytes,
    optimizer_k,
)
from simulator.training.pipeline import DPStreams, Pipeline, interleaved_order, one_f_one_b, peak_in_flight
from simulator.training.placement import placed
from simulator.units import DTYPE_BYTES
from simulator.workloads.train import DIMENSIONS, TrainWorkload

__all__ = ["Pieces", "StepCache", "TrainStep", "compose", "model_flops", "optimizer_time", "stage_layers",
           "stage_memory", "stage_params", "step_pieces", "train_step"]



def stage_layers(layers: int, pp: int) -> list[int]:
    """Layers per stage: as even as can be, the first stages one more."""
    return [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]


def stage_params(model: ModelPreset, pp: int, chunks: int = 1) -> list[float]:
    """Parameters of each stage (before TP): its layers', the embedding on the first, the LM head on the last;
    with ``chunks`` per stage (interleaved), virtual stage ``c pp + s`` is chunk ``c`` of stage ``s``."""
    lw = model.layer_weights
    embed = max(0.0, model.params - model.layers * lw - model.head_weights)
    virtual = [float(n * lw) for n in stage_layers(model.layers, pp * chunks)]
    virtual[0] += embed
    virtual[-1] += model.head_weights
    return [sum(virtual[s::pp]) for s in range(pp)]


def optimizer_time(params: float, optimizer: str, dtype: str, cluster: Cluster) -> float:
    """One optimizer step over ``params`` parameters on the roofline, in fp32: Adam reads the gradient (training
    dtype), master weight, two moments and writes them back and the training-dtype copy (SGD: one moment)."""
    eb = DTYPE_BYTES[dtype]
    states = 2 if optimizer == "adam" else 1
    master = 4 if eb < 4 else 0
    per_param = eb + 2 * (4 * states + master) + (eb if master else 4)
    spec = cluster.specs[cluster.ranks[0]]
    rate = "fp32" if "fp32" in spec.peak_flops else dtype  # memory-bound: the FLOP rate barely matters
    return compute_time(spec, (10.0 if optimizer == "adam" else 3.0) * params, per_param * params, rate)


def model_flops(wl: TrainWorkload) -> float:
    """The step's model FLOPs (module docstring)."""
    model = wl.model_preset()
    tokens = wl.batch_sequences * wl.sequence
    attn = dataclasses.replace(wl.attention_shape(backward=True), batch=1).model_flops
    return 6.0 * tokens * (model.layers * model.layer_weights + model.head_weights) \
        + model.layers * wl.batch_sequences * attn


@dataclasses.dataclass(frozen=True)
class Pieces:
    """What the engine simulated: one layer of one micro-batch, and the transfers between stages."""

    dense_f: Piece
    dense_b: Piece
    attn_f: Piece
    attn_b: Piece
    p2p: Piece
    head_f: float
    head_b: float
    zero3_ag: float  # one layer's parameters all-gathered over DP
    zero3_rs: float  # one layer's gradients reduce-scattered over DP
    rates: dict[tuple[str, str, int], float] = dataclasses.field(default_factory=dict, init=False, compare=False,
                                                                 repr=False)

    def pace(self, forward: bool, recompute: str, spec: DeviceSpec, held: int) -> float:
        """The pace, of its pace alone, of a layer's forward (or backward, with ``recompute``'s forward) while a
        collective holds ``held`` of the GPU's SMs (:mod:`.dp`): ``1 / ((1 - k) + k s)``, ``k`` its kernels' share
        of its seconds, ``s`` their seconds on the SMs left over their seconds alone; 1 where the device has no SM
        count (or no more SMs than are held) or nothing is held. ``k`` is the layer's own (with its TP and CP
        communication), whichever dimension a composition frees (:func:`compose`'s ``free``)."""
        if held <= 0 or spec.sm_count <= held:
            return 1.0
        key = (spec.name, "forward" if forward else recompute, held)
        if key not in self.rates:
            parts = [self.dense_f, self.attn_f] if forward else [self.dense_b, self.attn_b] + {
                "none": [], "selective": [self.attn_f], "full": [self.dense_f, self.attn_f]}[recompute]
            alone = sum(p.kernel_seconds(spec, 0) for p in parts)
            slowed = sum(p.kernel_seconds(spec, held) for p in parts)
            window = sum(p.time for p in parts)
            kernels = sum(p.compute for p in parts)
            share = min(1.0, max(0.0, kernels / window)) if window > 0 else 0.0
            # (a backward piece is a difference of two simulations, whose critical ranks may differ: never faster)
            stretch = max(1.0, slowed / alone) if alone > 0 else 1.0
            self.rates[key] = 1.0 / ((1.0 - share) + share * stretch)
        return self.rates[key]


@dataclasses.dataclass(frozen=True)
class TrainStep:
    """A simulated training step and what its row reports."""

    step_s: float
    compute_s: float
    pipeline: Pipeline
    exposed: dict[str, float]
    memory: list[MemoryBreakdown]  # per stage
    capacity: float
    flops: float
    bytes_moved: float
    events: int
    pieces: Pieces

    @property
    def peak_bytes(self) -> float:
        return max(m.total for m in self.memory)

    @property
    def oom(self) -> bool:
        return self.peak_bytes > self.capacity


@dataclasses.dataclass
class StepCache:
    """What steps of one model, sequence, micro-batch and dtype on one cluster share, kept between the layouts a
    plan tries: the simulated pieces by (tp, cp, cp_algorithm, sequence_parallel), the pipeline transfers by (tp, cp),
    the DP collectives by (tp, cp, pp, dp); each with what of the placement decides it."""

    layers: dict[tuple[int, int, str, bool, tuple[str, ...]], tuple[Piece, Piece, Piece, Piece]] = dataclasses.field(
        default_factory=dict)
    p2p: dict[tuple[int, int, tuple[str, ...]], Piece] = dataclasses.field(default_factory=dict)
    dp: dict[tuple[int, int, int, int, tuple[str, ...]], DPCollectives] = dataclasses.field(default_factory=dict)


def _layer(wl: TrainWorkload, cluster: Cluster) -> tuple[Piece, Piece, Piece, Piece]:
    model, par = wl.model_preset(), wl.parallel
    rows = wl.micro_batch * wl.sequence // par.cp
    sp = par.sequence_parallel
    dense_f = dense_pass(model, par.tp, par.cp, rows, wl.dtype, cluster, backward=False, sequence_parallel=sp)
    dense_b = dense_pass(model, par.tp, par.cp, rows, wl.dtype, cluster, backward=True, sequence_parallel=sp)
    attn_f, attn_b = attention_pass(par.cp_algorithm, wl.attention_shape(backward=True), par.tp, par.cp, cluster)
    return dense_f, dense_b, attn_f, attn_b


def _first_two(wl: TrainWorkload) -> tuple[str, ...]:
    """What of the placement decides which GPUs a stage's TP and CP groups are: with TP then CP the fastest-varying,
    the first ``tp x cp`` GPUs whatever the rest of the placement; otherwise all of it."""
    order = tuple(wl.placement)
    return order[:2] if order[:2] == ("tp", "cp") else order


def step_pieces(wl: TrainWorkload, cluster: Cluster, dpc: DPCollectives | None, cache: StepCache) -> Pieces:
    """The pieces of ``wl``'s step on ``cluster`` (its GPUs in their own order: the workload's placement is applied
    here), simulated or from ``cache``; without ``dpc`` ZeRO-3's layer collectives are 0."""
    return _pieces(wl, placed(cluster, wl.parallel.sizes, wl.placement), dpc, cache)


def _pieces(wl: TrainWorkload, cluster: Cluster, dpc: DPCollectives | None, cache: StepCache) -> Pieces:
    """:func:`step_pieces` on the placed cluster."""
    model, par = wl.model_preset(), wl.parallel
    rows = wl.micro_batch * wl.sequence // par.cp
    key = (par.tp, par.cp, par.cp_algorithm, par.sequence_parallel and par.tp > 1, _first_two(wl))
    if key not in cache.layers:
        cache.layers[key] = _layer(wl, cluster)
    dense_f, dense_b, attn_f, attn_b = cache.layers[key]
    eb = DTYPE_BYTES[wl.dtype]
    hop = (par.tp, par.cp, tuple(wl.placement))
    if par.pp > 1 and hop not in cache.p2p:
        cache.p2p[hop] = p2p_time(rows * model.hidden * eb / par.tp, par.tp * par.cp, cluster)
    p2p = cache.p2p[hop] if par.pp > 1 else Piece(0.0, 0.0)
    head_f, head_b = head_times(model, par.tp, rows, wl.dtype, cluster)
    layer_params = model.layer_weights / par.tp
    ag = dpc.time("allgather", layer_params) if wl.zero == 3 and dpc is not None else 0.0
    rs = dpc.time("reduce-scatter", layer_params) if wl.zero == 3 and dpc is not None else 0.0
    return Pieces(dense_f, dense_b, attn_f, attn_b, p2p, head_f, head_b, ag, rs)


def compose(wl: TrainWorkload, pc: Pieces, dpc: DPCollectives | None, cluster: Cluster,
            free: str = "") -> tuple[float, Pipeline, float]:
    """(step seconds, the pipeline, the critical stage's kernel seconds) with dimension ``free``'s communication
    free (without ``dpc``: DP's)."""
    free = "dp" if dpc is None else free
    model, par, m = wl.model_preset(), wl.parallel, wl.micro_batches

    def t(piece: Piece, dim: str) -> float:
        return piece.compute if free == dim else piece.time

    lf = t(pc.dense_f, "tp") + t(pc.attn_f, "cp")
    lb = t(pc.dense_b, "tp") + t(pc.attn_b, "cp")
    lb += {"none": 0.0, "selective": t(pc.attn_f, "cp"), "full": lf}[wl.recompute]
    comp_f = pc.dense_f.compute + pc.attn_f.compute
    comp_b = pc.dense_b.compute + pc.attn_b.compute + {"none": 0.0, "selective": pc.attn_f.compute,
                                                       "full": comp_f}[wl.recompute]
    spec = cluster.specs[cluster.ranks[0]]
    if wl.zero == 3 and dpc is not None and free != "dp":  # each prefetched under the layer: slowing it (.dp)
        layer = model.layer_weights / par.tp
        ag, rs = dpc.channels("allgather", layer), dpc.channels("reduce-scatter", layer)
        lf = under(lf, ((pc.zero3_ag, pc.pace(True, wl.recompute, spec, ag)),))
        lb = under(lb, ((pc.zero3_ag, pc.pace(False, wl.recompute, spec, ag)),
                        (pc.zero3_rs, pc.pace(False, wl.recompute, spec, rs))))
    v = par.virtual_stages
    layers = stage_layers(model.layers, par.pp * v)  # per virtual stage c pp + s
    last = par.pp * v - 1
    fwd = [n * lf + (pc.head_f if g == last else 0.0) for g, n in enumerate(layers)]
    bwd = [n * lb + (pc.head_b if g == last else 0.0) for g, n in enumerate(layers)]
    p2p = 0.0 if free == "pp" else pc.p2p.time
    params = stage_params(model, par.pp, v)
    bucket = wl.bucket / DTYPE_BYTES[wl.dtype]
    dp = dpc if par.grad_ranks > 1 and free != "dp" else None
    buckets = [bucket_sizes(params[s] / par.tp, bucket) for s in range(par.pp)]  # equal sizes: one time each
    streams = None
    if dp is not None and wl.zero in (0, 1, 2):  # each stage's gradient buckets beside its pipeline (.pipeline)
        operation = "allreduce" if wl.zero == 0 else "reduce-scatter"
        held = [dp.channels(operation, b[0]) for b in buckets]
        streams = DPStreams(tuple(range(m)) if wl.zero == 2 else (m - 1,), tuple(len(b) for b in buckets),
                            tuple(dp.time(operation, b[0]) for b in buckets),
                            tuple(pc.pace(True, wl.recompute, spec, h) for h in held),
                            tuple(pc.pace(False, wl.recompute, spec, h) for h in held))
    pipe = one_f_one_b(fwd, bwd, m, p2p, v, streams)
    done = []
    for s in range(par.pp):
        shard, sizes = params[s] / par.tp, buckets[s]
        end = max(pipe.stage_end[s], pipe.stream_end[s])
        if dp is not None and wl.zero == 3:
            end += pc.zero3_rs  # the first layer's gradients, reduce-scattered after the last backward
        opt = optimizer_time(shard / (par.grad_ranks if wl.zero >= 1 else 1), wl.optimizer, wl.dtype, cluster)
        gather = len(sizes) * dp.time("allgather", sizes[0]) if dp is not None and wl.zero in (1, 2) else 0.0
        done.append(end + opt + gather)
    crit = max(range(par.pp), key=lambda s: done[s])
    n_crit = sum(layers[crit::par.pp])
    compute = m * (n_crit * (comp_f + comp_b) + (pc.head_f + pc.head_b if crit == par.pp - 1 else 0.0))
    compute += optimizer_time(params[crit] / par.tp / (par.grad_ranks if wl.zero >= 1 else 1), wl.optimizer, wl.dtype,
                              cluster)
    return max(done), pipe, compute


@functools.lru_cache(maxsize=4096)
def _peaks(pp: int, chunks: int, m: int, layers: tuple[int, ...]) -> tuple[float, ...]:
    """Each stage's peak of layers held in flight (a plan asks for the same orders many times)."""
    return tuple(peak_in_flight(interleaved_order(s, pp, chunks, m), layers) for s in range(pp))


def stage_memory(wl: TrainWorkload) -> list[MemoryBreakdown]:
    """Each stage's per-rank peak (docs: :mod:`simulator.training.memory`)."""
    model, par, m = wl.model_preset(), wl.parallel, wl.micro_batches
    eb = DTYPE_BYTES[wl.dtype]
    rows = wl.micro_batch * wl.sequence // par.cp
    sp = par.sequence_parallel and par.tp > 1
    k = optimizer_k(wl.optimizer, eb)
    per_layer = layer_activation_bytes(model, rows, par.tp, sp, wl.recompute, eb)
    whole_layer = layer_activation_bytes(model, rows, par.tp, sp, "none", eb)
    transient = {"none": 0.0, "selective": whole_layer - per_layer, "full": whole_layer}[wl.recompute]
    v = par.virtual_stages
    layers, params = stage_layers(model.layers, par.pp * v), stage_params(model, par.pp, v)
    out = []
    for s in range(par.pp):
        weights, grads, states = model_state_bytes(params[s] / par.tp, wl.zero, par.grad_ranks, eb, k)
        acts = per_layer * _peaks(par.pp, v, m, tuple(layers))[s]
        logits = 2.0 * rows * (model.vocab // par.tp) * 4 if s == par.pp - 1 else 0.0
        buffers = 2.0 * wl.bucket if par.grad_ranks > 1 and wl.zero < 3 else 0.0
        if par.pp > 1:
            buffers += 4.0 * rows * model.hidden * eb / par.tp  # an activation and a gradient, sent and received
        if wl.zero == 3:
            buffers += 2.0 * model.layer_weights / par.tp * eb  # the layer gathered and the next, prefetched
        out.append(MemoryBreakdown(weights, grads, states, acts, transient + logits, buffers))
    return out


def _dp_bytes(wl: TrainWorkload) -> float:
    """Bytes every GPU sends over DP (its gradient group of n = dp x cp GPUs) in a step, by the collectives' ring
    closed forms (allreduce 2(n-1)/n, the others (n-1)/n of the buffer), summed over the GPUs."""
    par, model = wl.parallel, wl.model_preset()
    if par.grad_ranks == 1:
        return 0.0
    eb, n = DTYPE_BYTES[wl.dtype], par.grad_ranks
    total = 0.0
    v = par.virtual_stages
    for s, shard in enumerate(p / par.tp for p in stage_params(model, par.pp, v)):
        if wl.zero in (0, 1):  # allreduce; or reduce-scatter + all-gather of the parameters
            per_gpu = 2 * (n - 1) / n * shard * eb
        elif wl.zero == 2:  # a reduce-scatter per micro-batch, the all-gather of the parameters
            per_gpu = (wl.micro_batches + 1) * (n - 1) / n * shard * eb
        else:  # per layer and micro-batch: all-gathers before forward and backward, a reduce-scatter
            per_gpu = 3 * wl.micro_batches * (n - 1) / n * sum(stage_layers(model.layers, par.pp * v)[s::par.pp]) \
                * model.layer_weights / par.tp * eb
        total += per_gpu * par.tp * par.cp * par.dp  # the stage's GPUs in every replica
    return total


def train_step(wl: TrainWorkload, cluster: Cluster, mem_fraction: float = 0.9,
               cache: StepCache | None = None) -> TrainStep:
    """Simulate the step of ``wl`` on ``cluster`` (checked by :func:`simulator.workloads.train.train_checks`; its
    GPUs in their own order: the workload's placement is applied here); ``cache``: pieces simulated for other
    layouts of the same model, sequence, micro-batch and dtype on ``cluster``."""
    par, m = wl.parallel, wl.micro_batches
    cache = cache if cache is not None else StepCache()
    cluster = placed(cluster, par.sizes, wl.placement)
    replica = par.tp * par.cp * par.pp
    key = (par.tp, par.cp, par.pp, par.dp, tuple(wl.placement))
    dpc = cache.dp.get(key)
    if dpc is None:
        dpc = cache.dp[key] = DPCollectives(cluster, replica, par.dp, wl.dtype, par.tp, par.cp)
    events_before = dpc.events
    pc = _pieces(wl, cluster, dpc, cache)
    step, pipe, compute = compose(wl, pc, dpc, cluster)
    exposed = {dim: max(0.0, step - compose(wl, pc, dpc, cluster, dim)[0]) for dim in DIMENSIONS}
    memory = stage_memory(wl)
    layers = stage_layers(wl.model_preset().layers, par.pp)
    per_replica = sum(n * m * (pc.dense_f.bytes + pc.dense_b.bytes + pc.attn_f.bytes + pc.attn_b.bytes)
                      for n in layers) + 2 * m * (par.pp * par.virtual_stages - 1) * pc.p2p.bytes
    recompute = {"none": 0.0, "selective": pc.attn_f.bytes, "full": pc.attn_f.bytes + pc.dense_f.bytes}
    per_replica += sum(layers) * m * recompute[wl.recompute]
    events = sum(p.events for p in (pc.dense_f, pc.dense_b, pc.attn_f, pc.attn_b, pc.p2p)) + dpc.events \
        - events_before
    capacity = usable_bytes(cluster.specs[cluster.ranks[0]].mem_bytes, mem_fraction)
    return TrainStep(step, compute, pipe, exposed, memory, capacity, model_flops(wl),
                     par.dp * per_replica + _dp_bytes(wl), events, pc)
