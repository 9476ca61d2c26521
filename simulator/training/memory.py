"""Memory of one rank in a training step (pure functions, bytes).

**Model states** (ZeRO, Rajbhandari et al., arXiv:1910.02054, section 3.1 and figure 1): mixed-precision Adam holds
2 bytes of fp16/bf16 parameters, 2 of gradients and K = 12 of optimizer states (fp32 master parameters, momentum,
variance) per parameter. Stage 1 shards the optimizer states over the N_d data-parallel ranks, stage 2 the gradients
too, stage 3 the parameters too:

    stage 0: (2 + 2 + K) Psi;  1: (2 + 2) Psi + K Psi / N_d;  2: 2 Psi + (2 + K) Psi / N_d;  3: (2 + 2 + K) Psi / N_d

Here ``Psi`` is the parameters a rank holds before ZeRO (its pipeline stage's, divided by TP), the 2s are the
training dtype's bytes, and K is 12 for Adam below fp32 (master copy + 2 moments), 8 in fp32 (the 2 moments); SGD
with momentum: 8 below fp32 (master + momentum), 4 in fp32.

**Activations** (:func:`layer_activation_bytes`): what one layer keeps per micro-batch for its backward, counted on
this Llama layer as it runs here (FlashAttention: no score matrix), per token of the rank, in the activations' dtype
(the log-sum-exp in fp32):

* ``none``: the two norms' inputs and outputs (4 x hidden), q, k, v, the attention output (its projection's input),
  the attention's log-sum-exp, the MLP's gate and up outputs and their product; with sequence parallelism the
  hidden-sized ones are sharded over TP (the rest always are, by heads and columns);
* ``selective``: the attention core (its forward) is recomputed in the backward: its output and log-sum-exp are
  not kept;
* ``full``: only the layer's input is kept (hidden; sharded with sequence parallelism); the whole layer's forward
  runs again in the backward, and one layer's ``none`` activations live while it does.

1F1B keeps, on stage ``s`` of ``p``, the activations of ``min(p - s, m)`` micro-batches (the first stage the most).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.models.presets import ModelPreset

__all__ = ["MemoryBreakdown", "in_flight", "layer_activation_bytes", "model_state_bytes", "optimizer_k"]


def optimizer_k(optimizer: str, elem_bytes: int) -> int:
    """Bytes of optimizer state per parameter (ZeRO's K)."""
    master = 4 if elem_bytes < 4 else 0  # an fp32 copy of the weights when training below fp32
    return master + (8 if optimizer == "adam" else 4)


def model_state_bytes(params: float, zero: int, dp: int, elem_bytes: int, k: int) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) bytes of one rank holding ``params`` parameters before ZeRO."""
    weights, grads, states = params * elem_bytes, params * elem_bytes, params * k
    return (weights / dp if zero >= 3 else weights, grads / dp if zero >= 2 else grads,
            states / dp if zero >= 1 else states)


def layer_activation_bytes(model: ModelPreset, tokens: int, tp: int, sequence_parallel: bool, recompute: str,
                           elem_bytes: int) -> float:
    """Bytes one layer keeps for its backward, for ``tokens`` tokens of one rank (module docstring)."""
    h = model.hidden / (tp if sequence_parallel else 1)
    if recompute == "full":
        return tokens * h * elem_bytes
    qkv = (model.heads + 2 * model.kv_heads) * model.head_dim / tp
    attn_out, lse = model.heads * model.head_dim / tp, model.heads / tp
    mlp = 3 * model.intermediate / tp
    kept = 4 * h + qkv + mlp + (0.0 if recompute == "selective" else attn_out)
    return tokens * (kept * elem_bytes + (0.0 if recompute == "selective" else lse * 4))


def in_flight(stage: int, stages: int, micro_batches: int) -> int:
    """Micro-batches whose activations 1F1B keeps on ``stage`` at once."""
    return min(stages - stage, micro_batches)


@dataclass(frozen=True)
class MemoryBreakdown:
    """One rank's peak, by part (bytes)."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    transient: float  # one layer's working set while recomputing, the LM head's logits
    buffers: float  # communication buffers: DP buckets, pipeline send/receive, ZeRO-3's gathered layers

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.transient + self.buffers
