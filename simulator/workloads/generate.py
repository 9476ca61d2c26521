"""The ``generate`` workload: prefill a prompt with one prefill schedule, then decode ``new_tokens`` tokens with
each decode schedule of ``algorithms`` (the Tree Attention paper's end-to-end setting), one attention layer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from simulator.models.precision import WeightPrecision
from simulator.models.presets import ModelPreset
from simulator.workloads.base import Count, SmallCount, Strict
from simulator.workloads.decode import DType, ModelRef, SequenceTokens, WeightDType, weights_of, whole_model
from simulator.workloads.prefill import check_phase_scope, model_dims
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.shape import DecodeShape

__all__ = ["GenerateWorkload", "Turn"]


class Turn(Strict):
    """One turn of a conversation: ``prompt`` new tokens prefilled on the KV cache of the earlier turns, then
    ``new_tokens`` decode steps."""

    prompt: SequenceTokens = Field(description="the turn's new prompt tokens")
    new_tokens: Count = Field(1, description="tokens generated after it")


class GenerateWorkload(Strict):
    """``batch`` prompts of ``prompt`` tokens are prefilled by ``prefill`` (a prefill schedule: ``ring``,
    ``allgather``, ``ulysses``, ``single``, or ``{name: ring, overlap: false}``), causal, split by ``layout``; then
    ``new_tokens`` decode steps, each over the whole context so far (prompt + tokens generated), by each decode
    schedule of the scenario's ``algorithms``. ``scope: model`` (a preset or a whole model): the whole model in
    both phases (every layer's dense part and the LM head), ``tp`` splitting heads and weights in both.
    ``weight_dtype`` (one type, or per part) and ``kv_dtype`` as decode's, in both phases. ``turns: [{prompt: 32K,
    new_tokens: 256}, {prompt: 2K, new_tokens: 256}]`` instead of ``prompt`` and ``new_tokens``: a conversation,
    each turn's prompt prefilled on the KV cache of the earlier turns (prompts and generated tokens: a prefill on a
    cached prefix, docs/serving.md), then its decode steps."""

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
    weight_dtype: WeightDType | None = Field(None, description="weights' element type, or one per part (scope: "
                                                               "model)")
    kv_dtype: DType | None = Field(None, description="the KV cache's element type (default: dtype)")

    turns: list[Turn] | None = Field(None, min_length=1, max_length=1000, description=(
        "a conversation instead of prompt and new_tokens: [{prompt, new_tokens}, ...], each turn prefilled on the "
        "KV cache of the earlier ones"))

    @model_validator(mode="before")
    @classmethod
    def _first_turn(cls, data: Any) -> Any:
        """``turns`` gives ``prompt`` and ``new_tokens`` their first turn's values."""
        if isinstance(data, dict) and data.get("turns") is not None:
            given = [k for k in ("prompt", "new_tokens") if k in data]
            if given:
                raise ValueError(f"give turns, or prompt and new_tokens, not both ({', '.join(given)} given)")
            first = data["turns"][0] if isinstance(data["turns"], list) and data["turns"] else None
            if isinstance(first, dict):
                data = {**data, "prompt": first.get("prompt"), "new_tokens": first.get("new_tokens", 1)}
        return data

    @model_validator(mode="after")
    def _scope(self) -> GenerateWorkload:
        check_phase_scope(self.scope, self.model, self.tp)
        return self

    def conversation(self) -> list[tuple[int, int, int]]:
        """(cached tokens, prompt, new tokens) of each turn: a turn's prompt is prefilled on every earlier turn's
        prompt and generated tokens."""
        turns = [(t.prompt, t.new_tokens) for t in self.turns] if self.turns else [(self.prompt, self.new_tokens)]
        out, cached = [], 0
        for prompt, new in turns:
            out.append((cached, prompt, new))
            cached += prompt + new
        return out

    def weights(self) -> WeightPrecision:
        """The element type of each part of the weights (``scope: model``)."""
        return weights_of(self.weight_dtype, self.dtype)

    def model_preset(self) -> ModelPreset:
        """The whole model of ``scope: model``."""
        return whole_model(self.model)

    def prefill_shape(self, turn: int = 0) -> PrefillShape:
        """The prefill of turn ``turn`` (the first: the prompt, no cache)."""
        heads, kv_heads, head_dim = model_dims(self.model)
        cached, prompt, _ = self.conversation()[turn]
        return PrefillShape(batch=self.batch, heads=heads, head_dim=head_dim, kv_heads=kv_heads, sequence=prompt,
                            dtype=self.dtype, causal=True, layout=self.layout, backward=False,
                            kv_dtype=self.kv_dtype, cached=cached)

    def decode_shape(self, context: int) -> DecodeShape:
        """One decode step over ``context`` cached tokens."""
        heads, kv_heads, head_dim = model_dims(self.model)
        return DecodeShape(batch=self.batch, heads=heads, head_dim=head_dim, kv_heads=kv_heads, context=context,
                           dtype=self.dtype, kv_dtype=self.kv_dtype)
