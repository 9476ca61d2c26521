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

On a cached prefix (``cached`` C tokens already in the KV cache, ``sequence`` n new tokens at positions C..C+n-1)
the queries are the n new tokens and the keys all C + n: n C + n(n+1)/2 pairs per head causal, n (C + n) full.
K and V (the cache) are ``kv_dtype`` elements (default: ``dtype``): stored, sent and read at that size.
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
    kv_dtype: str | None = None  # the KV cache's element type (default: dtype)
    cached: int = 0  # tokens already in the KV cache, before the sequence's (positions 0..cached-1)

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_elem_bytes(self) -> int:
        return DTYPE_BYTES[self.kv_dtype or self.dtype]

    @property
    def keys(self) -> int:
        """Tokens every query may attend to: the cached prefix and the sequence."""
        return self.cached + self.sequence

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.heads // self.kv_heads

    def q_bytes(self, tokens: int, heads: int | None = None) -> float:
        """q (or o, dO, dQ) of ``tokens`` rows: b t heads head_dim elements."""
        return float(self.batch * tokens * (self.heads if heads is None else heads) * self.head_dim
                     * self.elem_bytes)

    def kv_bytes(self, tokens: int, kv_heads: int | None = None) -> float:
        """K and V (or dK and dV) of ``tokens`` rows: 2 b t kv_heads head_dim elements of ``kv_dtype``."""
        return 2.0 * self.batch * tokens * (self.kv_heads if kv_heads is None else kv_heads) * self.head_dim \
            * self.kv_elem_bytes

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

    def merge_extra(self, rows: int, first: bool, heads: int | None = None) -> tuple[float, int]:
        """(bytes, kernels) of folding a ring step's partial output of ``rows`` query rows into the fp32 running
        state, as ring-flash-attention's ``update_out_and_lse`` does (``ring_flash_attn/utils.py``, one
        TorchScript-fused kernel): the first step converts (reads the block, writes fp32), the others read the state
        and the block and write the state; the lse likewise in fp32."""
        h = self.heads if heads is None else heads
        elems, lse = self.batch * rows * h * self.head_dim, self.batch * rows * h
        if first:
            return float(elems * (self.elem_bytes + 4) + lse * 8), 1
        return float(elems * (4 + self.elem_bytes + 4) + lse * 12), 1

    def accumulate_extra(self, q_rows: int, kv_rows: int, first: bool) -> tuple[float, int]:
        """(bytes, kernels) of a ring backward step's gradient accumulation in fp32 (ring-flash-attention's backward:
        ``dq = block_dq.to(float32)`` first, then ``dq += block_dq``; ``dk``, ``dv`` alike over the keys the launch
        covers): three kernels."""
        elems = self.batch * (q_rows * self.heads + 2 * kv_rows * self.kv_heads) * self.head_dim
        return float(elems * (self.elem_bytes + (4 if first else 8))), 3

    def overlap_sum_extra(self, key_spans: list[int]) -> tuple[float, int]:
        """(bytes, kernels) of summing the dK, dV that concurrent launches of one rank compute over the keys they
        share (``allgather``'s chunks: each against the keys up to its end): read both, write one, over the shorter
        spans; none for one launch."""
        if len(key_spans) < 2:
            return 0.0, 0
        shared = sum(sorted(key_spans)[:-1])
        return float(3 * self.kv_bytes(shared)), 2

    def elementwise_cost(self, elems: float, reads: int = 2, writes: int = 1) -> tuple[float, float]:
        """(FLOPs, bytes) of an elementwise kernel over ``elems`` elements."""
        return float(elems), float((reads + writes) * elems * self.elem_bytes)

    @property
    def total_pairs(self) -> int:
        """Unmasked (query, key) pairs of one head of one sequence (its new tokens against the cached prefix and
        themselves)."""
        n, c = self.sequence, self.cached
        if c:
            return n * c + n * (n + 1) // 2 if self.causal else n * (c + n)
        return n * (n + 1) // 2 if self.causal else n * n

    @property
    def model_flops(self) -> float:
        """FLOPs of the attention (forward, plus backward when ``backward``), masked pairs not counted."""
        fwd = 4.0 * self.batch * self.heads * self.total_pairs * self.head_dim
        return fwd * (1 + BACKWARD_FLOPS_RATIO) if self.backward else fwd
