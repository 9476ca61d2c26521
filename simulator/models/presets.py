"""Model presets (published configs) and the per-layer cost of a decode step outside attention.

Shapes from the models' published ``config.json`` files (Hugging Face ``meta-llama``): layers, hidden size,
attention heads, KV heads (GQA), head dim, MLP intermediate size, vocabulary; parameter counts as published.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PRESETS", "ModelPreset", "custom_model"]


@dataclass(frozen=True)
class ModelPreset:
    """A decoder-only transformer (Llama architecture: GQA attention, gated MLP, untied or tied LM head)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    params: float  # published parameter count

    @property
    def layer_weights(self) -> int:
        """Weights of one layer: Q, K, V, O projections and the gated MLP (norms are negligible)."""
        attn = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim + self.heads * self.head_dim * self.hidden
        return attn + 3 * self.hidden * self.intermediate

    @property
    def head_weights(self) -> int:
        """The LM head (vocab x hidden), read once per decode step."""
        return self.vocab * self.hidden


PRESETS: dict[str, ModelPreset] = {
    # meta-llama/Llama-3.2-1B config.json: 16 layers, hidden 2048, 32 heads, 8 KV heads, head_dim 64,
    # intermediate 8192, vocab 128256, tied embeddings; 1.24B parameters.
    "llama-3.2-1b": ModelPreset("llama-3.2-1b", 16, 2048, 32, 8, 64, 8192, 128256, 1.24e9),
    # meta-llama/Llama-3.1-8B config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads, head_dim 128,
    # intermediate 14336, vocab 128256; 8.03B parameters.
    "llama-3.1-8b": ModelPreset("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8.03e9),
    # meta-llama/Llama-3.1-70B config.json: 80 layers, hidden 8192, 64 heads, 8 KV heads, head_dim 128,
    # intermediate 28672, vocab 128256; 70.6B parameters.
    "llama-3.1-70b": ModelPreset("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 70.6e9),
    # meta-llama/Llama-3.1-405B config.json: 126 layers, hidden 16384, 128 heads, 8 KV heads, head_dim 128,
    # intermediate 53248, vocab 128256, untied embeddings. The card says 405B; the shapes give 405.85e9
    # (126 layers x 3.1877e9 + 2 x 128256 x 16384 + norms), used here.
    "llama-3.1-405b": ModelPreset("llama-3.1-405b", 126, 16384, 128, 8, 128, 53248, 128256, 405.85e9),
}


def custom_model(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int,
                 vocab: int, name: str = "custom") -> ModelPreset:
    """A user-defined model (YAML ``model:`` block); its parameter count is computed from the shapes:
    ``layers x layer_weights + 2 x vocab x hidden`` (untied embedding and LM head; norms neglected)."""
    shell = ModelPreset(name, layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, 0.0)
    params = layers * shell.layer_weights + 2 * vocab * hidden
    return ModelPreset(name, layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, float(params))
