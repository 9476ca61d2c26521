"""Decode workload shape, KV sharding and the cost formulas (pure functions, SI units).

One query token per sequence (``batch`` sequences) attends to ``context`` cached tokens split over the ranks in
contiguous shards (the first ``context % P`` ranks get one token more). Decode attention of one query against t
cached tokens (docs/architecture.md): F = 4 b n_heads t head_dim FLOPs; it reads the K and V shard,
2 b t n_kv_heads head_dim elements, plus q and writes o.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.units import DTYPE_BYTES

__all__ = ["DecodeShape", "shard_bounds"]


def shard_bounds(context: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` token ranges of ``parts`` shards of ``context`` tokens (uneven allowed)."""
    base, extra = divmod(context, parts)
    bounds, start = [], 0
    for r in range(parts):
        end = start + base + (1 if r < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


@dataclass(frozen=True)
class DecodeShape:
    """Attention shape of one decode step: b sequences, n_heads query heads of head_dim, n_kv_heads KV heads."""

    batch: int
    heads: int
    head_dim: int
    kv_heads: int
    context: int
    dtype: str
    kv_dtype: str | None = None  # the KV cache's element type (default: dtype)

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_elem_bytes(self) -> int:
        return DTYPE_BYTES[self.kv_dtype or self.dtype]

    @property
    def model_dim(self) -> int:
        """d = heads x head_dim (the paper's model dimension)."""
        return self.heads * self.head_dim

    def kv_bytes(self, tokens: int) -> float:
        """Bytes of the K and V cache of ``tokens`` tokens: 2 b t n_kv head_dim elements of ``kv_dtype``."""
        return 2.0 * self.batch * tokens * self.kv_heads * self.head_dim * self.kv_elem_bytes

    @property
    def q_bytes(self) -> float:
        """The query (or one output): b d elements."""
        return float(self.batch * self.model_dim * self.elem_bytes)

    @property
    def ml_elems(self) -> int:
        """Elements of one of l or m: b n_heads (one query row per sequence)."""
        return self.batch * self.heads

    @property
    def state_bytes(self) -> float:
        """A partial state (o, l, m): b d + 2 b n_heads elements."""
        return float((self.batch * self.model_dim + 2 * self.ml_elems) * self.elem_bytes)

    def attend_cost(self, tokens: int) -> tuple[float, float]:
        """(FLOPs, bytes) of partial attention against ``tokens`` cached tokens, merged into the running state."""
        flops = 4.0 * self.batch * self.heads * tokens * self.head_dim
        return flops, self.kv_bytes(tokens) + self.q_bytes + 2 * self.state_bytes

    def merge_cost(self) -> tuple[float, float]:
        """(FLOPs, bytes) of merging one partial state into another: read two states, write one."""
        elems = self.batch * self.model_dim + 2 * self.ml_elems
        return 4.0 * elems, 3 * self.state_bytes

    def elementwise_cost(self, elems: int, reads: int = 2, writes: int = 1) -> tuple[float, float]:
        """(FLOPs, bytes) of an elementwise kernel over ``elems`` elements (e.g. a reduction of two buffers)."""
        return float(elems), float((reads + writes) * elems * self.elem_bytes)
