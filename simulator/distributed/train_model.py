"""The small Llama-like model of the real training runs (docs/training.md, "Real runs"): its weights from a seed,
its data, and one set of layer functions that both the sharded run and the single-process reference call.

The model is a :class:`~simulator.models.presets.ModelPreset` (a scenario's ``model:`` block): an untied embedding,
``layers`` decoder layers (RMSNorm, GQA attention with RoPE, RMSNorm, gated SiLU MLP, each with a residual add), a
final RMSNorm and an LM head; the loss is the cross-entropy of every token's logits against a random label, summed
and divided by the tokens of the step. Where a weight is split over TP (Megatron-LM): the Q, K, V, gate, up and LM
head matrices by columns (heads, intermediate, vocabulary), the output and down projections by rows; the norms and
the embedding are whole on every TP rank. The layer functions take :class:`Ops`: how the TP collectives and the
attention run. The reference passes the identity and dense causal attention; the sharded run Megatron's
conjugate collectives (:mod:`.train_tp`) and the CP group's prefill schedule (:mod:`.train_attention`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from simulator.models.presets import ModelPreset

__all__ = ["LAYER_WEIGHTS", "Ops", "causal_attention", "head_loss", "init_weights", "layer_forward", "make_batch",
           "reference_grads", "rms_norm", "rope", "shard", "shard_dim", "stage_weight_names"]

LAYER_WEIGHTS = ("norm1", "wq", "wk", "wv", "wo", "norm2", "w_gate", "w_up", "w_down")
_COLUMNS = ("wq", "wk", "wv", "w_gate", "w_up", "head")  # split over TP by columns
_ROWS = ("wo", "w_down")  # by rows
EPS = 1e-6
ROPE_THETA = 10000.0

Fn = Callable[[torch.Tensor], torch.Tensor]


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Dense causal softmax attention of the whole sequence, (b, heads, n, d); GQA by repeating the KV heads."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    n = q.shape[2]
    s = (q @ k.transpose(-1, -2)) / float(q.shape[-1]) ** 0.5
    s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), -float("inf"))
    return torch.softmax(s, dim=-1) @ v


@dataclass(frozen=True)
class Ops:
    """How a layer's parallel parts run: ``copy_in`` before a column-parallel matmul (identity forward, allreduce
    of the input gradient), ``reduce_out`` after a row-parallel one (allreduce forward), ``gather_out`` the LM head's
    logits over the vocabulary (all-gather forward, own slice backward), ``attention`` on (b, heads, rows, d)."""

    copy_in: Fn = _identity
    reduce_out: Fn = _identity
    gather_out: Fn = _identity
    attention: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = causal_attention


def shard_dim(name: str) -> int | None:
    """The dimension a weight is split along over TP (None: whole on every TP rank)."""
    base = name.rsplit(".", 1)[-1]
    return 1 if base in _COLUMNS else 0 if base in _ROWS else None


def shard(name: str, full: torch.Tensor, tp: int, t: int) -> torch.Tensor:
    """TP rank ``t``'s part of weight ``name``."""
    dim = shard_dim(name)
    return full if dim is None or tp == 1 else full.chunk(tp, dim=dim)[t]


def init_weights(model: ModelPreset, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every weight of the whole model, drawn in float64 from ``seed`` (the same on every rank) and cast to
    ``dtype``: matrices N(0, 1 / fan_in), norms 1 + N(0, 0.1^2) (so that their gradients are not trivial)."""
    g = torch.Generator().manual_seed(seed)
    h, d, inter = model.hidden, model.head_dim, model.intermediate

    def mat(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=g, dtype=torch.float64) / rows ** 0.5

    def norm() -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(h, generator=g, dtype=torch.float64)

    w = {"embed": torch.randn(model.vocab, h, generator=g, dtype=torch.float64)}
    for i in range(model.layers):
        w |= {f"layers.{i}.norm1": norm(), f"layers.{i}.wq": mat(h, model.heads * d),
              f"layers.{i}.wk": mat(h, model.kv_heads * d), f"layers.{i}.wv": mat(h, model.kv_heads * d),
              f"layers.{i}.wo": mat(model.heads * d, h), f"layers.{i}.norm2": norm(),
              f"layers.{i}.w_gate": mat(h, inter), f"layers.{i}.w_up": mat(h, inter),
              f"layers.{i}.w_down": mat(inter, h)}
    w |= {"norm": norm(), "head": mat(h, model.vocab)}
    return {k: v.to(dtype) for k, v in w.items()}


def make_batch(model: ModelPreset, sequences: int, sequence: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, labels) of one step, (sequences, sequence) each, from ``seed`` (the same on every rank)."""
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(model.vocab, (sequences, sequence), generator=g)
    labels = torch.randint(model.vocab, (sequences, sequence), generator=g)
    return tokens, labels


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of (b, heads, rows, d) at the rows' global positions ``pos``."""
    d = x.shape[-1]
    inv = ROPE_THETA ** (-torch.arange(0, d, 2, dtype=torch.float64, device=pos.device) / d)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def layer_forward(x: torch.Tensor, w: Mapping[str, torch.Tensor], pos: torch.Tensor, head_dim: int,
                  ops: Ops) -> torch.Tensor:
    """One decoder layer on (b, rows, hidden) at global positions ``pos``; ``w``: the layer's (local) weights by
    their short names (:data:`LAYER_WEIGHTS`); the local heads are read off the weights' shapes."""
    b, n, _ = x.shape
    hq, hkv = w["wq"].shape[1] // head_dim, w["wk"].shape[1] // head_dim

    def heads(t: torch.Tensor, count: int) -> torch.Tensor:
        return t.view(b, n, count, head_dim).transpose(1, 2)

    h = ops.copy_in(rms_norm(x, w["norm1"]))
    q, k, v = heads(h @ w["wq"], hq), heads(h @ w["wk"], hkv), heads(h @ w["wv"], hkv)
    a = ops.attention(rope(q, pos).contiguous(), rope(k, pos).contiguous(), v.contiguous())
    x = x + ops.reduce_out(a.transpose(1, 2).reshape(b, n, hq * head_dim) @ w["wo"])
    h = ops.copy_in(rms_norm(x, w["norm2"]))
    return x + ops.reduce_out((F.silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"])


def head_loss(x: torch.Tensor, norm: torch.Tensor, head: torch.Tensor, labels: torch.Tensor, tokens: int,
              ops: Ops) -> torch.Tensor:
    """The final norm, the LM head and the cross-entropy of these rows' labels, summed, over ``tokens``."""
    logits = ops.gather_out(ops.copy_in(rms_norm(x, norm)) @ head)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum") / tokens


def reference_grads(model: ModelPreset, weights: Mapping[str, torch.Tensor], tokens: torch.Tensor,
                    labels: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    """(loss, every weight's gradient) of the whole step by single-process autograd, dense attention."""
    w = {k: v.detach().clone().requires_grad_(True) for k, v in weights.items()}
    pos = torch.arange(tokens.shape[1])
    x = w["embed"][tokens]
    for i in range(model.layers):
        x = layer_forward(x, {n: w[f"layers.{i}.{n}"] for n in LAYER_WEIGHTS}, pos, model.head_dim, Ops())
    loss = head_loss(x, w["norm"], w["head"], labels, tokens.numel(), Ops())
    loss.backward()
    grads: dict[str, torch.Tensor] = {}
    for k, v in w.items():
        assert v.grad is not None, k
        grads[k] = v.grad
    return float(loss.item()), grads


def stage_weight_names(model: ModelPreset, layers: Sequence[int], first: bool, last: bool) -> list[str]:
    """The weights a pipeline stage holds: its layers', the embedding on the first stage, the head on the last."""
    names = ["embed"] if first else []
    names += [f"layers.{i}.{n}" for i in layers for n in LAYER_WEIGHTS]
    return names + (["norm", "head"] if last else [])
