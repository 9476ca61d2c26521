"""Prefill / training attention shape and its cost formulas (pure functions, SI units).

``batch`` sequences of ``sequence`` tokens; every token is a query and a key. A block is (a query shard x a KV
shard); its work is its ``pairs`` unmasked (query, key) pairs (:func:`simulator.workloads.layouts.pair_count`):
fully masked blocks cost nothing, partially masked ones their exact count.

* Forward (FlashAttention): two matmuls, S = Q K^T and O = P V: ``F = 4 b heads pairs head_dim``. It reads q and
  the K, V shard and reads and writes the running state (o, l, m) of its queries.
* Backward (FlashAttention-2, arXiv:2307.08691, Alg. 2): five matmuls (S again from the saved lse, dV, dP, dQ, dK),
  2.5x the forward's: ``F = 10 b heads pairs head_dim``. It reads q, dO, lse and delta, K and V, and reads and
  writes dQ, dK and dV.

Model FLOPs (for ``tflops_per_gpu``) count the pairs the mask keeps: n(n+1)/2 per head causal, n^2 full.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.units import DTYPE_BYTES

__all__ = ["BACKWARD_FLOPS_RATIO", "PrefillShape"]

BACKWARD_FLOPS_RATIO = 2.5  # FlashAttention-2 backward matmul FLOPs / forward's (5 matmuls vs 2)


@dataclass(frozen=True)
class PrefillShape:
    """Attention shape of a prefill (or a training step's attention with ``backward``)."""

    batch: int
    heads: int
    head_dim: int
    kv_heads: int
    sequence: int
    dtype: str
    causal: bool = True
    layout: str = "zigzag"
    backward: bool = False

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.heads // self.kv_heads

    def q_bytes(self, tokens: int, heads: int | None = None) -> float:
        """q (or o, dO, dQ) of ``tokens`` rows: b t heads head_dim elements."""
        return float(self.batch * tokens * (self.heads if heads is None else heads) * self.head_dim
                     * self.elem_bytes)

    def kv_bytes(self, tokens: int, kv_heads: int | None = None) -> float:
        """K and V (or dK and dV) of ``tokens`` rows: 2 b t kv_heads head_dim elements."""
        return 2.0 * self.batch * tokens * (self.kv_heads if kv_heads is None else kv_heads) * self.head_dim \
            * self.elem_bytes

    def row_bytes(self, tokens: int, heads: int | None = None) -> float:
        """One value per query row and head (lse, or delta): b t heads elements."""
        return float(self.batch * tokens * (self.heads if heads is None else heads) * self.elem_bytes)

    def state_bytes(self, tokens: int, heads: int | None = None) -> float:
        """A running state (o, l, m) of ``tokens`` query rows."""
        return self.q_bytes(tokens, heads) + 2 * self.row_bytes(tokens, heads)

    def forward_cost(self, nq: int, nk: int, pairs: int, heads: int | None = None) -> tuple[float, float]:
        """(FLOPs, bytes) of one forward block kernel, its result merged into the running state."""
        h = self.heads if heads is None else heads
        kv = max(1, h // self.group)
        flops = 4.0 * self.batch * h * pairs * self.head_dim
        return flops, self.q_bytes(nq, h) + self.kv_bytes(nk, kv) + 2 * self.state_bytes(nq, h)

    def backward_cost(self, nq: int, nk: int, pairs: int, heads: int | None = None) -> tuple[float, float]:
        """(FLOPs, bytes) of one backward block kernel (FlashAttention-2), dQ, dK, dV accumulated."""
        h = self.heads if heads is None else heads
        kv = max(1, h // self.group)
        flops = BACKWARD_FLOPS_RATIO * 4.0 * self.batch * h * pairs * self.head_dim
        nbytes = 4 * self.q_bytes(nq, h) + 2 * self.row_bytes(nq, h) + 3 * self.kv_bytes(nk, kv)
        return flops, nbytes

    def elementwise_cost(self, elems: float, reads: int = 2, writes: int = 1) -> tuple[float, float]:
        """(FLOPs, bytes) of an elementwise kernel over ``elems`` elements."""
        return float(elems), float((reads + writes) * elems * self.elem_bytes)

    @property
    def total_pairs(self) -> int:
        """Unmasked (query, key) pairs of one head of one sequence."""
        n = self.sequence
        return n * (n + 1) // 2 if self.causal else n * n

    @property
    def model_flops(self) -> float:
        """FLOPs of the attention (forward, plus backward when ``backward``), masked pairs not counted."""
        fwd = 4.0 * self.batch * self.heads * self.total_pairs * self.head_dim
        return fwd * (1 + BACKWARD_FLOPS_RATIO) if self.backward else fwd
