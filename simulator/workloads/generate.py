"""The ``generate`` workload: prefill a prompt with one prefill schedule, then decode ``new_tokens`` tokens with
each decode schedule of ``algorithms`` (the Tree Attention paper's end-to-end setting), one attention layer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PositiveInt, field_validator

from simulator.errors import InputError
from simulator.limits import MAX_COUNT
from simulator.models import PRESETS
from simulator.units import parse_tokens
from simulator.workloads.base import Count, ModelShape, Strict
from simulator.workloads.prefill import model_dims
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.shape import DecodeShape

__all__ = ["GenerateWorkload"]


class GenerateWorkload(Strict):
    """``batch`` prompts of ``prompt`` tokens are prefilled by ``prefill`` (a prefill schedule: ``ring``,
    ``allgather``, ``ulysses``, ``single``, or ``{name: ring, overlap: false}``), causal, split by ``layout``; then
    ``new_tokens`` decode steps, each over the whole context so far (prompt + tokens generated), by each decode
    schedule of the scenario's ``algorithms``."""

    kind: Literal["generate"]
    model: ModelShape | str
    scope: Literal["attention"] = Field("attention", description="one attention layer (scope: model is not built yet)")
    batch: Count = 1
    prompt: PositiveInt = Field(le=MAX_COUNT,
                                description="prompt tokens, e.g. 32768, '32K' or '1M' (K = 2^10, M = 2^20)")
    new_tokens: Count = 1
    prefill: str | dict[str, Any] = "ring"
    layout: Literal["contiguous", "zigzag", "striped"] = "zigzag"
    dtype: Literal["fp64", "fp32", "bf16", "fp16", "fp8"] = "bf16"

    @field_validator("model")
    @classmethod
    def _preset(cls, v: ModelShape | str) -> ModelShape | str:
        if isinstance(v, str) and v not in PRESETS:
            raise ValueError(f"unknown model preset {v!r}; presets: {', '.join(PRESETS)}")
        return v

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v: Any) -> int:
        try:
            return parse_tokens(v)
        except InputError as err:
            raise ValueError(err.message) from None

    def prefill_shape(self) -> PrefillShape:
        heads, kv_heads, head_dim = model_dims(self.model)
        return PrefillShape(batch=self.batch, heads=heads, head_dim=head_dim, kv_heads=kv_heads, sequence=self.prompt,
                            dtype=self.dtype, causal=True, layout=self.layout, backward=False)

    def decode_shape(self, context: int) -> DecodeShape:
        """One decode step over ``context`` cached tokens."""
        heads, kv_heads, head_dim = model_dims(self.model)
        return DecodeShape(batch=self.batch, heads=heads, head_dim=head_dim, kv_heads=kv_heads, context=context,
                           dtype=self.dtype)
