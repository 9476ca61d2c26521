"""The ``decode`` workload: one decode step of one attention layer or of a whole model."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, model_validator

from simulator.errors import InputError, excerpt
from simulator.models.precision import WeightPrecision, weight_precision
from simulator.models.presets import PRESETS, ModelPreset, custom_model
from simulator.support.limits import MAX_COUNT, MAX_SEQUENCE
from simulator.units import parse_tokens
from simulator.workloads.base import Count, ModelShape, SmallCount, Strict
from simulator.workloads.shape import DecodeShape

__all__ = ["DType", "DecodeWorkload", "ModelRef", "PartDTypes", "SequenceTokens", "Tokens", "WeightDType",
           "check_scope", "heads_kv", "token_fields", "weights_of", "whole_model"]

DType = Literal["fp64", "fp32", "bf16", "fp16", "fp8"]


class PartDTypes(Strict):
    """``weight_dtype`` per part of the weights (:mod:`simulator.models.precision`); a part left out takes
    ``dtype``."""

    attention: DType | None = Field(None, description="the Q, K, V and O projections")
    mlp: DType | None = Field(None, description="the gated MLP")
    head: DType | None = Field(None, description="the embedding and the LM head")


WeightDType = DType | PartDTypes  # one element type for every weight, or one per part


def weights_of(weight_dtype: WeightDType | None, dtype: str) -> WeightPrecision:
    """The element type of each part of the weights (default: ``dtype``)."""
    if isinstance(weight_dtype, PartDTypes):
        return weight_precision(weight_dtype.model_dump(), dtype)
    return weight_precision(weight_dtype, dtype)


def _tokens(v: Any) -> int:
    try:
        return parse_tokens(v)
    except InputError as err:
        raise ValueError(err.message) from None


Tokens = Annotated[int, BeforeValidator(_tokens), Field(ge=1, le=MAX_COUNT)]  # 1048576, "128K", "1M" (K = 1024)


def _sequence(v: int) -> int:
    if v > MAX_SEQUENCE:
        raise ValueError(f"must be at most {MAX_SEQUENCE:,} tokens (2^31) for a sequence that attends to itself "
                         f"(its (query, key) pairs are counted in 64-bit integers; a thousand times the longest "
                         f"context of any model)")
    return v


# a prefill's sequence or a generate's prompt: every token attends to the ones before it
SequenceTokens = Annotated[int, BeforeValidator(_tokens), Field(ge=1), AfterValidator(_sequence)]


def token_fields(model: type[BaseModel]) -> list[str]:
    """The fields of a workload model that are token counts (:data:`Tokens`: ``80K`` is 81,920 tokens)."""
    return [name for name, f in model.model_fields.items()
            if any(isinstance(m, BeforeValidator) and m.func is _tokens for m in f.metadata)]


def _known_model(v: ModelShape | str) -> ModelShape | str:
    if isinstance(v, str) and v not in PRESETS:
        raise ValueError(f"unknown model preset {excerpt(v)}; presets: {', '.join(PRESETS)}")
    return v


ModelRef = Annotated[ModelShape | str, AfterValidator(_known_model)]  # a preset's name, or a model block


def heads_kv(model: ModelShape | str) -> tuple[int, int]:
    """(query heads, KV heads) of a preset or of a model block."""
    if isinstance(model, str):
        preset = PRESETS[model]
        return preset.heads, preset.kv_heads
    return model.heads, model.kv_heads or model.heads


def check_scope(scope: str, model: ModelShape | str, tp: int) -> None:
    """``scope: model`` needs a whole model; ``tp`` must divide the heads, and it and the KV heads one another
    (pydantic's ValueError, located by the caller)."""
    if scope == "model" and not isinstance(model, str) and model.missing_for_model():
        raise ValueError(f"scope: model needs a model preset ({', '.join(PRESETS)}) or a whole model; this "
                         f"model block lacks {', '.join(model.missing_for_model())}")
    heads, kv = heads_kv(model)
    if heads % tp:
        raise ValueError(f"tp ({tp}) must divide the {heads} attention heads")
    if kv % tp and tp % kv:
        raise ValueError(f"tp ({tp}) and the {kv} KV heads must divide one another")


def whole_model(model: ModelShape | str) -> ModelPreset:
    """The whole model of ``scope: model``: the preset, or the user's block (parameters from its shapes)."""
    if isinstance(model, str):
        return PRESETS[model]
    assert model.layers and model.hidden and model.intermediate and model.vocab, "validated by check_scope"
    return custom_model(model.layers, model.hidden, model.heads, model.kv_heads or model.heads, model.head_dim,
                        model.intermediate, model.vocab)


class DecodeWorkload(Strict):
    """One decode step: ``batch`` query tokens attend to ``context`` cached tokens sharded over every GPU.

    ``model`` is an attention shape, a whole model (the shape plus ``layers, hidden, intermediate, vocab``) or a
    preset name (``llama-3.1-8b``...). ``scope: attention`` simulates one attention layer; ``scope: model`` (a
    preset or a whole model) a whole decode step: every layer's projections and MLP on the roofline, its attention
    schedule, and the LM head; memory then holds the weights and every layer's KV cache. ``context`` takes token
    counts such as ``1M`` or ``128K`` (K = 1024). ``weight_dtype`` (one type, or per part ``{attention: bf16, mlp:
    fp8}``) and ``kv_dtype`` (default: ``dtype``) set the bytes per weight and per cached K/V element; attention
    runs at ``dtype``'s FLOP rate, a matmul with FP8 weights at the FP8 rate (:mod:`simulator.models.precision`).
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
    weight_dtype: WeightDType | None = None
    kv_dtype: DType | None = None

    @model_validator(mode="after")
    def _scope(self) -> DecodeWorkload:
        check_scope(self.scope, self.model, self.tp)
        return self

    def weights(self) -> WeightPrecision:
        """The element type of each part of the weights."""
        return weights_of(self.weight_dtype, self.dtype)

    def heads_kv(self) -> tuple[int, int]:
        """(query heads, KV heads) of the whole model."""
        return heads_kv(self.model)

    def model_preset(self) -> ModelPreset:
        """The whole model of ``scope: model``: the preset, or the user's block (parameters from its shapes)."""
        return whole_model(self.model)

    @property
    def model_name(self) -> str:
        return self.model if isinstance(self.model, str) else "custom"

    def shape(self) -> DecodeShape:
        """The attention shape of the whole model (a preset's, or the one given)."""
        heads, kv_heads = self.heads_kv()
        head_dim = PRESETS[self.model].head_dim if isinstance(self.model, str) else self.model.head_dim
        return DecodeShape(batch=self.batch, heads=heads, head_dim=head_dim, kv_heads=kv_heads,
                           context=self.context, dtype=self.dtype, kv_dtype=self.kv_dtype)
