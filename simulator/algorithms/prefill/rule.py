"""Pass-KV (``ring``) or pass-Q (``ring-q``): the bytes each puts on the wire, and the rule that picks by them
(pure functions, SI units; docs/serving.md).

Over P ranks, n new tokens on a cached prefix of C (``shape.cached``), g = heads / kv_heads query heads per KV head:

* pass-KV sends every K/V shard (cached and new) to the P - 1 other ranks: ``(P - 1) x 2 (C + n) kv_heads d`` elements
  of ``kv_dtype``;
* pass-Q sends every query shard to the P - 1 others, ``(P - 1) x n heads d`` elements, and returns one partial state
  (o, l, m: ``heads d + 2 heads`` elements per row) from every block with unmasked pairs off the diagonal, at most
  ``(P - 1) x n (heads d + 2 heads)`` (fewer under a causal mask without a prefix: the blocks it hides return none).

Per token of the context, pass-Q wins when ``n / (C + n)`` (the cache-miss rate) is below about
``kv_heads / heads x kv bytes / dtype bytes`` (1/g with K and V in the activations' type: 1/16 for Llama 3.1 405B's
128 heads over 8 KV heads); :func:`pass_rule` compares the exact volumes. It ignores what the engine sees: which
transfers hide behind compute, link contention, the merges; ``auto`` (the prefill kind) picks by simulating both.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simulator.workloads.layouts import pair_matrix, prefix_runs, run_tokens
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["AUTO_CANDIDATES", "PassVolumes", "miss_rate_threshold", "pass_rule", "pass_volumes"]

AUTO_CANDIDATES = ("ring", "ring-q")  # what ``auto`` chooses between


class PassVolumes(NamedTuple):
    """Bytes on the wire of one layer's attention forward, every rank's sends summed."""

    pass_kv: float  # ring: K and V shards
    pass_q: float  # ring-q: query shards and the partial states returned
    queries: float  # of pass_q, the query shards
    partials: float  # of pass_q, the partial states


def pass_volumes(shape: PrefillShape, p: int) -> PassVolumes:
    """The forward's bytes of ``ring`` and ``ring-q`` over ``p`` ranks (the schedules' own, to the byte)."""
    runs, keys = prefix_runs(shape.layout, shape.cached, shape.sequence, p)
    tok = [run_tokens(rr) for rr in runs]
    kv = (p - 1) * sum(shape.kv_bytes(run_tokens(k)) for k in keys)
    queries = (p - 1) * sum(shape.q_bytes(t) for t in tok)
    live = pair_matrix(runs, shape.causal, keys if shape.cached else None) > 0
    np.fill_diagonal(live, False)  # a rank's own block starts its state: nothing returned
    partials = sum(shape.state_bytes(tok[o]) * int(live[o].sum()) for o in range(p))
    return PassVolumes(float(kv), float(queries + partials), float(queries), float(partials))


def pass_rule(shape: PrefillShape, p: int) -> str:
    """``ring-q`` when passing the queries (and returning the partials) moves fewer bytes than passing K and V, else
    ``ring``."""
    v = pass_volumes(shape, p)
    return "ring-q" if v.pass_q < v.pass_kv else "ring"


def miss_rate_threshold(shape: PrefillShape) -> float:
    """The cache-miss rate n / (C + n) below which pass-Q moves fewer bytes when every block returns a partial (a
    cached prefix): ``2 kv_heads d kv_bytes / ((heads d + heads d + 2 heads) dtype_bytes)``."""
    kv = 2.0 * shape.kv_heads * shape.head_dim * shape.kv_elem_bytes
    q = (2.0 * shape.heads * shape.head_dim + 2.0 * shape.heads) * shape.elem_bytes
    return kv / q
