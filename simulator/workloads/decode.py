"""The ``decode`` workload: one decode step of one attention layer or of a whole model."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from simulator.errors import excerpt
from simulator.models import PRESETS
from simulator.workloads.base import Count, ModelShape, SmallCount, Strict
from simulator.workloads.shape import DecodeShape

__all__ = ["DecodeWorkload"]


class DecodeWorkload(Strict):
    """One decode step: ``batch`` query tokens attend to ``context`` cached tokens sharded over every GPU.

    ``model`` is an attention shape or a preset name (``llama-3.1-8b``...). ``scope: attention`` simulates one
    attention layer; ``scope: model`` (presets only) a whole decode step: every layer's projections and MLP on the
    roofline, its attention schedule, and the LM head; memory then holds the weights and every layer's KV cache.
    ``tp`` splits heads and weights over groups of ``tp`` consecutive GPUs (tensor parallelism, with two
    allreduces per layer); the context is sharded over the ``GPUs / tp`` groups (context parallelism).
    """

    kind: Literal["decode"]
    model: ModelShape | str
    scope: Literal["attention", "model"] = "attention"
    tp: SmallCount = 1
    batch: Count = 1
    context: Count
    dtype: Literal["fp64", "fp32", "bf16", "fp16", "fp8"] = "bf16"

    @field_validator("model")
    @classmethod
    def _preset(cls, v: ModelShape | str) -> ModelShape | str:
        if isinstance(v, str) and v not in PRESETS:
            raise ValueError(f"unknown model preset {excerpt(v)}; presets: {', '.join(PRESETS)}")
        return v

    @model_validator(mode="after")
    def _scope(self) -> DecodeWorkload:
        if self.scope == "model" and not isinstance(self.model, str):
            raise ValueError(f"scope: model needs a model preset ({', '.join(PRESETS)}), not a bare shape")
        heads, kv = self.heads_kv()
        if heads % self.tp:
            raise ValueError(f"tp ({self.tp}) must divide the {heads} attention heads")
        if kv % self.tp and self.tp % kv:
            raise ValueError(f"tp ({self.tp}) and the {kv} KV heads must divide one another")
        return self

    def heads_kv(self) -> tuple[int, int]:
        """(query heads, KV heads) of the whole model."""
        if isinstance(self.model, str):
            preset = PRESETS[self.model]
            return preset.heads, preset.kv_heads
        return self.model.heads, self.model.kv_heads or self.model.heads

    def shape(self) -> DecodeShape:
        """The attention shape of the whole model (a preset's, or the one given)."""
        heads, kv_heads = self.heads_kv()
        head_dim = PRESETS[self.model].head_dim if isinstance(self.model, str) else self.model.head_dim
        return DecodeShape(batch=self.batch, heads=heads, head_dim=head_dim, kv_heads=kv_heads,
                           context=self.context, dtype=self.dtype)
