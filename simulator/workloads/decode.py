"""The ``decode`` workload: one decode step of one attention layer or of a whole model."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from simulator.errors import InputError, excerpt
from simulator.limits import MAX_COUNT
from simulator.models import PRESETS, ModelPreset, custom_model
from simulator.units import parse_tokens
from simulator.workloads.base import Count, ModelShape, SmallCount, Strict
from simulator.workloads.shape import DecodeShape

__all__ = ["DType", "DecodeWorkload", "ModelRef", "Tokens"]

DType = Literal["fp64", "fp32", "bf16", "fp16", "fp8"]


def _tokens(v: Any) -> int:
    try:
        return parse_tokens(v)
    except InputError as err:
        raise ValueError(err.message) from None


Tokens = Annotated[int, BeforeValidator(_tokens), Field(ge=1, le=MAX_COUNT)]  # 1048576, "128K", "1M" (K = 1024)


def _known_model(v: ModelShape | str) -> ModelShape | str:
    if isinstance(v, str) and v not in PRESETS:
        raise ValueError(f"unknown model preset {excerpt(v)}; presets: {', '.join(PRESETS)}")
    return v


ModelRef = Annotated[ModelShape | str, AfterValidator(_known_model)]  # a preset's name, or a model block


class DecodeWorkload(Strict):
    """One decode step: ``batch`` query tokens attend to ``context`` cached tokens sharded over every GPU.

    ``model`` is an attention shape, a whole model (the shape plus ``layers, hidden, intermediate, vocab``) or a
    preset name (``llama-3.1-8b``...). ``scope: attention`` simulates one attention layer; ``scope: model`` (a
    preset or a whole model) a whole decode step: every layer's projections and MLP on the roofline, its attention
    schedule, and the LM head; memory then holds the weights and every layer's KV cache. ``context`` takes token
    counts such as ``1M`` or ``128K`` (K = 1024). ``weight_dtype`` and ``kv_dtype`` (default: ``dtype``) set the
    bytes per weight and per cached K/V element; kernels run at ``dtype``'s FLOP rate.
    ``tp`` splits heads and weights over groups of ``tp`` consecutive GPUs (tensor parallelism, with two
    allreduces per layer); the context is sharded over the ``GPUs / tp`` groups (context parallelism).
    """

    kind: Literal["decode"]
    model: ModelRef
    scope: Literal["attention", "model"] = "attention"
    tp: SmallCount = 1
    batch: Count = 1
    context: Tokens
    dtype: DType = "bf16"
    weight_dtype: DType | None = None
    kv_dtype: DType | None = None

    @model_validator(mode="after")
    def _scope(self) -> DecodeWorkload:
        if self.scope == "model" and not isinstance(self.model, str) and self.model.missing_for_model():
            raise ValueError(f"scope: model needs a model preset ({', '.join(PRESETS)}) or a whole model; this "
                             f"model block lacks {', '.join(self.model.missing_for_model())}")
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

    def model_preset(self) -> ModelPreset:
        """The whole model of ``scope: model``: the preset, or the user's block (parameters from its shapes)."""
        if isinstance(self.model, str):
            return PRESETS[self.model]
        m = self.model
        assert m.layers and m.hidden and m.intermediate and m.vocab, "validated by _scope"
        return custom_model(m.layers, m.hidden, m.heads, m.kv_heads or m.heads, m.head_dim, m.intermediate, m.vocab)

    @property
    def model_name(self) -> str:
        return self.model if isinstance(self.model, str) else "custom"

    def shape(self) -> DecodeShape:
        """The attention shape of the whole model (a preset's, or the one given)."""
        heads, kv_heads = self.heads_kv()
        head_dim = PRESETS[self.model].head_dim if isinstance(self.model, str) else self.model.head_dim
        return DecodeShape(batch=self.batch, heads=heads, head_dim=head_dim, kv_heads=kv_heads,
                           context=self.context, dtype=self.dtype, kv_dtype=self.kv_dtype)
