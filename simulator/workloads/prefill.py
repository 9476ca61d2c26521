"""The ``prefill`` workload: attention over a whole sequence split across the context-parallel group (a prefill of
a long prompt), forward only or, with ``backward: true``, forward + backward (a training step's attention)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from simulator.models import PRESETS
from simulator.workloads.base import Count, ModelShape, Strict
from simulator.workloads.decode import DType, ModelRef, Tokens
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["PrefillWorkload", "model_dims"]


def model_dims(model: ModelShape | str) -> tuple[int, int, int]:
    """(heads, kv_heads, head_dim) of a preset or of a shape given inline."""
    if isinstance(model, str):
        p = PRESETS[model]
        return p.heads, p.kv_heads, p.head_dim
    return model.heads, model.kv_heads or model.heads, model.head_dim


class PrefillWorkload(Strict):
    """``batch`` sequences of ``sequence`` tokens attend to themselves, split over every GPU by ``layout``.

    ``model`` is an attention shape or a preset name; one attention layer is simulated (``scope: attention``).
    ``causal`` masks by global position. ``layout``: ``contiguous``, ``zigzag`` (2P chunks, rank r owns r and
    2P-1-r) or ``striped`` (rank r owns r, r+P, ...). ``backward: true`` adds the backward pass.
    """

    kind: Literal["prefill"]
    model: ModelRef
    scope: Literal["attention"] = Field("attention", description="one attention layer (scope: model is not built yet)")
    batch: Count = 1
    sequence: Tokens = Field(description="tokens per sequence, e.g. 131072, '128K' or '1M' (K = 2^10, M = 2^20)")
    dtype: DType = "bf16"
    causal: bool = True
    layout: Literal["contiguous", "zigzag", "striped"] = "zigzag"
    backward: bool = False

    def shape(self) -> PrefillShape:
        """The attention shape (a preset's, or the one given)."""
        heads, kv_heads, head_dim = model_dims(self.model)
        return PrefillShape(batch=self.batch, heads=heads, head_dim=head_dim, kv_heads=kv_heads,
                            sequence=self.sequence, dtype=self.dtype, causal=self.causal, layout=self.layout,
                            backward=self.backward)
