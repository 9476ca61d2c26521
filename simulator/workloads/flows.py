"""The ``flows`` workload: the network model on its own, one result row per flow."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from simulator.units import parse_bytes, parse_time
from simulator.workloads.base import Strict, unit_value

__all__ = ["FlowSpec", "FlowsWorkload"]


class FlowSpec(Strict):
    """One transfer of the ``flows`` workload: ``bytes`` from ``src`` to ``dst`` starting at ``start``."""

    src: str = Field(max_length=200)
    dst: str = Field(max_length=200)
    bytes: float = Field(description="payload, e.g. 1e9 or '1 GB'")
    start: float = Field(0.0, description="start time, e.g. 0 or '2 us'")

    @field_validator("bytes", mode="before")
    @classmethod
    def _bytes(cls, v: Any) -> float:
        return unit_value(parse_bytes, v, unit=False)  # the key names the unit

    @field_validator("start", mode="before")
    @classmethod
    def _start(cls, v: Any) -> float:
        return unit_value(parse_time, v)

    @model_validator(mode="after")
    def _ends(self) -> FlowSpec:
        if self.src == self.dst:
            raise ValueError(f"a flow needs two different devices, got {self.src!r} as src and dst")
        return self


class FlowsWorkload(Strict):
    """The network model on its own: one result row per flow."""

    kind: Literal["flows"]
    flows: list[FlowSpec] = Field(min_length=1, max_length=100_000)
