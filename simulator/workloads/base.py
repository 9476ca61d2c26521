"""What every workload model shares: strict frozen pydantic models, non-negative quantities with units, the
attention shape of a model given inline."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, PositiveInt, model_validator

from simulator.errors import InputError
from simulator.units import checked_quantity, parse_bandwidth, parse_bytes, parse_flops, parse_time

__all__ = ["ModelShape", "Strict", "unit_value"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)



_KINDS = {parse_bytes: "bytes", parse_bandwidth: "bandwidth", parse_time: "time", parse_flops: "flops"}


def unit_value(parse: Any, v: Any, positive: bool = False) -> float:
    """A non-negative (or ``positive``) quantity parsed by ``parse`` (``parse_bytes``, ... or a kind name such as
    ``"bytes"``) within :data:`simulator.units.LIMITS`; errors become pydantic's ValueError (located by the caller)."""
    try:
        return checked_quantity(v, parse if isinstance(parse, str) else _KINDS[parse], positive=positive)
    except InputError as err:
        raise ValueError(err.message) from None


class ModelShape(Strict):
    """Attention shape: ``heads`` query heads of ``head_dim``; ``kv_heads`` (GQA) defaults to ``heads``."""

    heads: PositiveInt
    head_dim: PositiveInt
    kv_heads: PositiveInt | None = None

    @model_validator(mode="after")
    def _gqa(self) -> ModelShape:
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return self
