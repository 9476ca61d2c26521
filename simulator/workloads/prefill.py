"""The ``prefill`` workload: attention over a whole sequence split across the context-parallel group (a prefill of
a long prompt), forward only or, with ``backward: true``, forward + backward (a training step's attention)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from simulator.models.precision import WeightPrecision
from simulator.models.presets import PRESETS, ModelPreset
from simulator.support.limits import MAX_COUNT
from simulator.units import parse_tokens
from simulator.workloads.base import Count, ModelShape, SmallCount, Strict
from simulator.workloads.decode import (
    DType,
    ModelRef,
    SequenceTokens,
    WeightDType,
    check_scope,
    weights_of,
    whole_model,
)
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["CachedTokens", "PrefillWorkload", "check_phase_scope", "model_dims"]


def _cached(v: Any) -> int:
    """0, or a token count (``126720``, ``"124K"``)."""
    if isinstance(v, int) and not isinstance(v, bool) and v == 0:
        return 0
    try:
        return parse_tokens(v)
    except Exception as err:  # InputError: its message, located by the caller
        raise ValueError(getattr(err, "message", str(err))) from None


CachedTokens = Annotated[int, BeforeValidator(_cached), Field(ge=0, le=MAX_COUNT)]  # 0 or a token count


def check_phase_scope(scope: str, model: ModelShape | str, tp: int) -> None:
    """As decode's (:func:`~simulator.workloads.decode.check_scope`); ``tp`` > 1 needs ``scope: model``."""
    check_scope(scope, model, tp)
    if tp > 1 and scope != "model":
        raise ValueError(f"tp ({tp}) needs scope: model (one attention layer is context parallel only)")


def model_dims(model: ModelShape | str) -> tuple[int, int, int]:
    """(heads, kv_heads, head_dim) of a preset or of a shape given inline."""
    if isinstance(model, str):
        p = PRESETS[model]
        return p.heads, p.kv_heads, p.head_dim
    return model.heads, model.kv_heads or model.heads, model.head_dim


class PrefillWorkload(Strict):
    """``batch`` sequences of ``sequence`` tokens attend to themselves, split over every GPU by ``layout``.

    ``model`` is an attention shape, a whole model or a preset name; ``scope: attention`` simulates one attention
    layer, ``scope: model`` (a preset or a whole model, forward only) the whole prefill: every layer's projections,
    MLP and elementwise kernels on the roofline beside its attention schedule, and the LM head of the last tokens;
    ``tp`` (``scope: model``) splits heads and weights over groups of ``tp`` consecutive GPUs, the sequence over the
    ``GPUs / tp`` groups. ``causal`` masks by global position. ``layout``: ``contiguous``, ``zigzag`` (2P chunks,
    rank r owns r and 2P-1-r) or ``striped`` (rank r owns r, r+P, ...). ``backward: true`` adds the backward pass.
    ``cached``: tokens already in the KV cache before the ``sequence`` new ones (a prompt on a cached prefix,
    forward only; the cache sharded by the same layout: docs/serving.md). ``weight_dtype`` (``scope: model``; one
    type or per part ``{attention: bf16, mlp: fp8}``) and ``kv_dtype`` as decode's.
    """

    kind: Literal["prefill"]
    model: ModelRef
    scope: Literal["attention", "model"] = Field(
        "attention", description="attention: one attention layer; model: every layer's dense part too, and the LM head")
    tp: SmallCount = Field(1, description="tensor-parallel degree (scope: model)")
    batch: Count = 1
    sequence: SequenceTokens = Field(description="tokens per sequence, e.g. 131072, '128K' or '1M' (K = 2^10, "
                                                 "M = 2^20)")
    dtype: DType = "bf16"
    causal: bool = True
    layout: Literal["contiguous", "zigzag", "striped"] = "zigzag"
    backward: bool = False
    cached: CachedTokens = Field(0, description="tokens already in the KV cache before the sequence's (0: none)")
    weight_dtype: WeightDType | None = Field(None, description="weights' element type, or one per part (scope: "
                                                               "model)")
    kv_dtype: DType | None = Field(None, description="the KV cache's element type (default: dtype)")

    @model_validator(mode="after")
    def _scope(self) -> PrefillWorkload:
        check_phase_scope(self.scope, self.model, self.tp)
        if self.scope == "model" and self.backward:
            raise ValueError("scope: model is forward only; a whole model's training step (weight gradients, "
                             "pipeline, DP, optimizer) is kind: train (docs/training.md), one attention layer's "
                             "forward + backward is scope: attention with backward: true")
        if self.cached and self.backward:
            raise ValueError(f"cached ({self.cached} tokens) is a prefill on a KV cache, forward only; a training "
                             f"step (backward: true) has no cache")
        if self.kv_dtype is not None and self.backward:
            raise ValueError("kv_dtype is the KV cache's element type, forward only; a training step (backward: "
                             "true) keeps K and V at dtype")
        return self

    def weights(self) -> WeightPrecision:
        """The element type of each part of the weights (``scope: model``)."""
        return weights_of(self.weight_dtype, self.dtype)

    def model_preset(self) -> ModelPreset:
        """The whole model of ``scope: model``."""
        return whole_model(self.model)

    def shape(self) -> PrefillShape:
        """The attention shape (a preset's, or the one given)."""
        heads, kv_heads, head_dim = model_dims(self.model)
        return PrefillShape(batch=self.batch, heads=heads, head_dim=head_dim, kv_heads=kv_heads,
                            sequence=self.sequence, dtype=self.dtype, causal=self.causal, layout=self.layout,
                            backward=self.backward, kv_dtype=self.kv_dtype, cached=self.cached)
