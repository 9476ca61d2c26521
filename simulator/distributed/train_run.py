"""A real training step of the small model (:mod:`.train_model`) over TP x CP x PP x DP gloo (or NCCL) ranks, and
the check of its gradients against single-process autograd.

**Placement** is treering's (docs/training.md, :mod:`simulator.training.placement`): by default process rank ``t + tp
(c + cp (s + pp d))`` is TP rank ``t`` of CP rank ``c`` of stage ``s`` of replica ``d``; a workload's ``placement``
reorders the dimensions as it does in the simulator. Process groups (``new_group``): each TP
group (``tp`` consecutive ranks) and each gradient group, the ranks of one TP rank and stage over CP and DP (as
Megatron-LM reduces gradients over DP x CP: a CP rank's gradients are its tokens' share). The CP group's attention
runs its prefill schedule's sends between the process ranks (:mod:`.train_attention`); the stages pass activations
point to point (:mod:`.train_pipeline`).

**The step** (:meth:`TrainRank.step`): every micro-batch of this replica (``micro_batch`` sequences, this CP rank's
positions of them) forward and backward through the stage in 1F1B order, the loss of each token divided by the
step's tokens; the gradients flattened and allreduced (SUM) on the gradient group in one bucket after the last
backward (ZeRO 0); the optimizer step (Adam or SGD with momentum, :mod:`.train_optimizer`) on this rank's shards.

**The check** (:func:`check_step`): rank 0 gathers every rank's gradients and losses and compares each rank's
gradient of each weight with its TP shard of the reference gradient (the whole model, single process, dense
attention, float64, :func:`~.train_model.reference_grads`), relative to that weight's largest reference gradient;
the loss summed over the last stage's ranks of TP rank 0 with the reference loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
import torch.distributed as dist

from simulator.distributed.train_attention import CPAttention
from simulator.distributed.train_model import (
    LAYER_WEIGHTS,
    Ops,
    head_loss,
    init_weights,
    layer_forward,
    make_batch,
    reference_grads,
    shard,
    stage_weight_names,
)
from simulator.distributed.train_optimizer import Optimizer
from simulator.distributed.train_pipeline import StagePeers, run_1f1b
from simulator.distributed.train_tp import tp_ops
from simulator.models.presets import ModelPreset
from simulator.training.placement import CANONICAL, placed_order
from simulator.training.step import stage_layers
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.train import TrainWorkload

__all__ = ["DTYPES", "TrainCheck", "TrainRank", "TrainSpec", "check_step"]

DTYPES = {"fp64": torch.float64, "fp32": torch.float32}  # what a real step runs in (a CPU, a gradient check)
LR = 1e-3


@dataclass(frozen=True)
class TrainSpec:
    """One real step: the model, ``sequences`` of ``sequence`` tokens in micro-batches of ``micro_batch`` over the
    layout, in ``dtype``; weights and data from ``seed``."""

    model: ModelPreset
    sequence: int
    sequences: int
    micro_batch: int = 1
    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    cp_algorithm: str = "ring"
    layout: str = "zigzag"
    dtype: str = "fp64"
    optimizer: str = "adam"
    seed: int = 0
    placement: tuple[str, ...] = CANONICAL  # the order the dimensions vary in over the process ranks, fastest first

    @classmethod
    def of(cls, wl: TrainWorkload, seed: int) -> TrainSpec:
        """The step of a ``kind: train`` workload (checked by :func:`simulator.distributed.checks.check_train`)."""
        par = wl.parallel
        return cls(wl.model_preset(), wl.sequence, wl.batch_sequences, wl.micro_batch, par.tp, par.cp, par.pp, par.dp,
                   par.cp_algorithm, par.layout, wl.dtype, wl.optimizer, seed, tuple(wl.placement))

    @cached_property
    def _ranks(self) -> list[int]:
        """The process rank of each canonical index (``t + tp (c + cp (s + pp d))``)."""
        return placed_order({"tp": self.tp, "cp": self.cp, "pp": self.pp, "dp": self.dp}, self.placement)

    @cached_property
    def _canonical(self) -> dict[int, int]:
        return {r: i for i, r in enumerate(self._ranks)}

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def micro_batches(self) -> int:
        return self.sequences // (self.dp * self.micro_batch)

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(t, c, s, d) of a process rank."""
        i = self._canonical[rank]
        return (i % self.tp, i // self.tp % self.cp, i // (self.tp * self.cp) % self.pp,
                i // (self.tp * self.cp * self.pp))

    def rank(self, t: int, c: int, s: int, d: int) -> int:
        """The process rank of coordinates (t, c, s, d)."""
        return self._ranks[t + self.tp * (c + self.cp * (s + self.pp * d))]

    def stage_layers(self, s: int) -> range:
        """The layers of stage ``s`` (as the simulator splits them: the first stages one more)."""
        counts = stage_layers(self.model.layers, self.pp)
        return range(sum(counts[:s]), sum(counts[: s + 1]))


def _groups(spec: TrainSpec, rank: int) -> tuple[Any, Any]:
    """(this rank's TP group, its gradient group); every rank creates every group, in the same order."""
    t, c, s, d = spec.coords(rank)
    tp_group = grad_group = None
    if spec.tp > 1:
        for cc in range(spec.cp):
            for ss in range(spec.pp):
                for dd in range(spec.dp):
                    g = dist.new_group([spec.rank(tt, cc, ss, dd) for tt in range(spec.tp)])
                    if (cc, ss, dd) == (c, s, d):
                        tp_group = g
    if spec.cp * spec.dp > 1:
        for tt in range(spec.tp):
            for ss in range(spec.pp):
                g = dist.new_group([spec.rank(tt, cc, ss, dd) for dd in range(spec.dp) for cc in range(spec.cp)])
                if (tt, ss) == (t, s):
                    grad_group = g
    return tp_group, grad_group


class TrainRank:
    """This process's part of the step: its stage's weight shards, its tokens, its groups. Needs the process group
    (of ``spec.world`` ranks); ``hosts[r]``: the host of process rank ``r``."""

    def __init__(self, spec: TrainSpec, device: torch.device, hosts: Sequence[int]) -> None:
        if dist.get_world_size() != spec.world:
            raise ValueError(f"the step needs {spec.world} ranks (tp x cp x pp x dp), the group has "
                             f"{dist.get_world_size()}")
        self.spec, self.device, self.rank = spec, device, dist.get_rank()
        t, c, s, d = self.coords = spec.coords(self.rank)
        self.tp_group, self.grad_group = _groups(spec, self.rank)
        model, dtype = spec.model, DTYPES[spec.dtype]
        self.layers = spec.stage_layers(s)
        self.first, self.last = s == 0, s == spec.pp - 1
        full = init_weights(model, spec.seed, dtype)
        self.initial = {n: shard(n, full[n], spec.tp, t).clone().to(device)
                        for n in stage_weight_names(model, self.layers, self.first, self.last)}
        shape = PrefillShape(batch=spec.micro_batch, heads=model.heads // spec.tp, head_dim=model.head_dim,
                             kv_heads=model.kv_heads // spec.tp, sequence=spec.sequence, dtype=spec.dtype,
                             causal=True, layout=spec.layout, backward=False)
        cp_ranks = [spec.rank(t, cc, s, d) for cc in range(spec.cp)]
        self.attention = CPAttention(spec.cp_algorithm, shape, c, cp_ranks, [hosts[r] for r in cp_ranks], device)
        self.pos = self.attention.positions.to(device)
        tokens, labels = make_batch(model, spec.sequences, spec.sequence, spec.seed)
        mine = slice(d * spec.micro_batches * spec.micro_batch, (d + 1) * spec.micro_batches * spec.micro_batch)
        self.tokens = tokens[mine][:, self.attention.positions].to(device)
        self.labels = labels[mine][:, self.attention.positions].to(device)
        self.ops = tp_ops(self.tp_group, spec.tp, Ops(attention=self.attention))
        self.peers = StagePeers(s, spec.pp, spec.rank(t, c, s - 1, d) if s > 0 else None,
                                spec.rank(t, c, s + 1, d) if s < spec.pp - 1 else None)

    def step(self) -> TrainStepRun:
        """A fresh step from the initial weights (a new optimizer), not yet run."""
        return TrainStepRun(self)


class TrainStepRun:
    """One step of a :class:`TrainRank`: :meth:`run_rank` runs it (the interface of ``timed_iterations``)."""

    def __init__(self, rank: TrainRank) -> None:
        self.r = rank
        self.params = {n: p.clone().requires_grad_(True) for n, p in rank.initial.items()}
        self.optimizer = Optimizer(rank.spec.optimizer, list(self.params.values()), LR)

    def _forward(self, i: int, x: torch.Tensor | None) -> torch.Tensor:
        r, p = self.r, self.params
        mb = r.spec.micro_batch
        seqs = slice(i * mb, (i + 1) * mb)
        if x is None:
            x = p["embed"][r.tokens[seqs]]
        for layer in r.layers:
            x = layer_forward(x, {n: p[f"layers.{layer}.{n}"] for n in LAYER_WEIGHTS}, r.pos, r.spec.model.head_dim,
                              r.ops)
        if r.last:
            return head_loss(x, p["norm"], p["head"], r.labels[seqs], r.spec.sequences * r.spec.sequence, r.ops)
        return x

    def run_rank(self) -> dict[str, Any]:
        """Forward and backward of every micro-batch, the gradient allreduce, the optimizer step; returns this
        rank's gradients (``grads``, by weight name) and its micro-batches' losses (``losses``, last stage)."""
        r = self.r
        spec = r.spec
        shape = (spec.micro_batch, len(r.pos), spec.model.hidden)
        losses = run_1f1b(r.peers, spec.micro_batches, self._forward,
                          lambda: torch.empty(shape, dtype=DTYPES[spec.dtype], device=r.device))
        grads = [p.grad for p in self.params.values()]
        assert all(g is not None for g in grads)
        if r.grad_group is not None:
            flat = torch.cat([g.reshape(-1) for g in grads if g is not None])
            dist.all_reduce(flat, group=r.grad_group)
            at = 0
            for g in grads:
                assert g is not None
                g.copy_(flat[at:at + g.numel()].view_as(g))
                at += g.numel()
        self.optimizer.step()
        return {"grads": {n: p.grad for n, p in self.params.items()}, "losses": losses}


@dataclass(frozen=True)
class TrainCheck:
    """The step against single-process autograd: the largest gradient error of any weight on any rank, relative to
    the weight's largest reference gradient and absolute; the loss's error; how many weights were compared."""

    grad_max_rel_err: float
    grad_max_abs_err: float
    loss_abs_err: float
    weights: int


def check_step(spec: TrainSpec, rank: TrainRank, result: Mapping[str, Any]) -> TrainCheck | None:
    """Gather every rank's gradients and losses on rank 0 and check them (module docstring); None elsewhere."""
    mine = (rank.coords, {n: g.detach().cpu() for n, g in result["grads"].items()}, list(result["losses"]))
    gathered: list[Any] | None = [None] * spec.world if rank.rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if gathered is None:
        return None
    full = init_weights(spec.model, spec.seed, DTYPES[spec.dtype])
    tokens, labels = make_batch(spec.model, spec.sequences, spec.sequence, spec.seed)
    ref_loss, ref = reference_grads(spec.model, {n: w.double() for n, w in full.items()}, tokens, labels)
    rel = absolute = 0.0
    seen: set[str] = set()
    loss = 0.0
    for (t, _c, s, _d), grads, losses in gathered:
        for name, got in grads.items():
            want = shard(name, ref[name], spec.tp, t)
            diff = float((got.double() - want).abs().max())
            absolute = max(absolute, diff)
            rel = max(rel, diff / max(float(ref[name].abs().max()), 1e-300))
            seen.add(name)
        if s == spec.pp - 1 and t == 0:
            loss += sum(losses)
    if seen != set(ref):
        raise ValueError(f"no rank holds the gradients of {sorted(set(ref) - seen)}")
    return TrainCheck(rel, absolute, abs(loss - ref_loss), len(seen))
