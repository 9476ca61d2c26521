"""The ``generate`` workload: prefill a prompt with one prefill schedule, then decode ``new_tokens`` tokens with
each decode schedule of ``algorithms`` (the Tree Attention paper's end-to-end setting), one attention layer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from simulator.models.presets import ModelPreset
from simulator.workloads.base import Count, SmallCount, Strict
from simulator.workloads.decode import DType, ModelRef, SequenceTokens, whole_model
from simulator.workloads.prefill import check_phase_scope, model_dims
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.shape import DecodeShape

__all__ = ["GenerateWorkload"]


class GenerateWorkload(Strict):
    """``batch`` prompts of ``prompt`` tokens are prefilled by ``prefill`` (a prefill schedule: ``ring``,
    ``allgather``, ``ulysses``, ``single``, or ``{name: ring, overlap: false}``), causal, split by ``layout``; then
    ``new_tokens`` decode steps, each over the whole context so far (prompt + tokens generated), by each decode
    schedule of the scenario's ``algorithms``. ``scope: model`` (a preset or a whole model): the whole model in
    both phases (every layer's dense part and the LM head), ``tp`` splitting heads and weights in both."""

    kind: Literal["generate"]
    model: ModelRef
    scope: Literal["attention", "model"] = Field(
        "attention", description="attention: one attention layer; model: every layer's dense part too, and the LM head")
    tp: SmallCount = Field(1, description="tensor-parallel degree (scope: model)")
    batch: Count = 1
    prompt: SequenceTokens = Field(description="prompt tokens, e.g. 32768, '32K' or '1M' (K = 2^10, M = 2^20)")
    new_tokens: Count = 1
    prefill: str | dict[str, Any] = "ring"
    layout: Literal["contiguous", "zigzag", "striped"] = "zigzag"
    dtype: DType = "bf16"

    @model_validator(mode="after")
    def _scope(self) -> GenerateWorkload:
        check_phase_scope(self.scope, self.model, self.tp)
        return self

    def model_preset(self) -> ModelPreset:
        """The whole model of ``scope: model``."""
        return whole_model(self.model)

    def prefill_shape(self) -> PrefillShape:
        heads, kv_heads, head_dim = model_dims(self.model)
        return PrefillShape(batch=self.batch, heads=heads, head_dim=head_dim, kv_heads=kv_heads, sequence=self.prompt,
                            dtype=self.dtype, causal=True, layout=self.layout, backward=False)

    def decode_shape(self, context: int) -> DecodeShape:
        """One decode step over ``context`` cached tokens."""
        heads, kv_heads, head_dim = model_dims(self.model)
        return DecodeShape(batch=self.batch, heads=heads, head_dim=head_dim, kv_heads=kv_heads, context=context,
                           dtype=self.dtype)
