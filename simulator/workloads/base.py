"""What every workload model shares: strict frozen pydantic models, non-negative quantities with units, the
attention shape of a model given inline."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, PositiveInt, model_validator

from simulator.errors import InputError

__all__ = ["ModelShape", "Strict", "unit_value"]


class Strict(BaseModel):
    """A strict, frozen scenario model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)



def unit_value(parse: Any, v: Any) -> float:
    """A non-negative quantity; unit errors become pydantic's ValueError (located by the caller)."""
    try:
        x = float(parse(v))
    except InputError as err:
        raise ValueError(err.message) from None
    if x < 0:
        raise ValueError(f"must not be negative, got {v!r}")
    return x


class ModelShape(Strict):
    """Attention shape: ``heads`` query heads of ``head_dim``; ``kv_heads`` (GQA) defaults to ``heads``.

    With ``layers``, ``hidden``, ``intermediate`` and ``vocab`` as well it is a whole model of the Llama
    architecture (GQA attention, gated MLP, untied LM head), usable with ``scope: model``.
    """

    heads: PositiveInt
    head_dim: PositiveInt
    kv_heads: PositiveInt | None = None
    layers: PositiveInt | None = None
    hidden: PositiveInt | None = None
    intermediate: PositiveInt | None = None
    vocab: PositiveInt | None = None

    WHOLE_MODEL_KEYS: ClassVar[tuple[str, ...]] = ("layers", "hidden", "intermediate", "vocab")

    def missing_for_model(self) -> list[str]:
        """The whole-model keys this block lacks (empty: usable with ``scope: model``)."""
        return [k for k in self.WHOLE_MODEL_KEYS if getattr(self, k) is None]

    @model_validator(mode="after")
    def _gqa(self) -> ModelShape:
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return self
