"""The online-softmax merge core, shared by the numeric simulator and the real torch.distributed runs.

A partial attention state over a subset S of key positions, per query row and head, is ``(o, l, m)``::

    m = max_{j in S} s_j                 running max score
    l = sum_{j in S} exp(s_j - m)        sum of exponentials, scaled to m
    o = sum_{j in S} exp(s_j - m) v_j    unnormalised output, scaled to m

Two states over disjoint subsets merge exactly (Milakov & Gimelshein, arXiv:1805.02867, Alg. 3; FlashAttention,
arXiv:2205.14135, Sec. 3.1)::

    m = max(m_a, m_b);  l = l_a e^(m_a-m) + l_b e^(m_b-m);  o = o_a e^(m_a-m) + o_b e^(m_b-m)

The merge is commutative and associative, which is why Ring and Tree Attention give the same answer. Rows whose
scores are all masked carry ``m = -inf, l = 0, o = 0`` and merge without NaN. Every function is array-API generic
(numpy and torch through ``array_api_compat``) and pure.

The backward (FlashAttention-2, arXiv:2307.08691, Alg. 2; ring-flash-attention's ``ring_flash_attn_backward``)
needs only the final log-sum-exp ``lse = m + log l`` of every query row (:func:`log_sum_exp`) and
``delta = rowsum(dO * O)`` (:func:`attention_delta`). Then each (query block, key block) pair contributes
independently (:func:`block_backward`)::

    P = exp(S - lse);  dV = P^T dO;  dP = dO V^T;  dS = P * (dP - delta);  dQ = scale dS K;  dK = scale dS^T Q

so dQ is the sum of its blocks' dQ over the key blocks, and dK, dV the sums over the query blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from array_api_compat import array_namespace

__all__ = ["PartialState", "attention_delta", "block_backward", "empty_state", "finalize", "log_sum_exp", "merge",
           "merge_all", "partial_attention", "rescale"]

Array = Any


@dataclass(frozen=True)
class PartialState:
    """Partial attention state. Shapes: ``o`` (b, heads, nq, head_dim); ``l``, ``m`` (b, heads, nq)."""

    o: Array
    l: Array
    m: Array


def _finite_or_zero(xp: Any, m: Array) -> Array:
    """``m`` with -inf replaced by 0, so that ``exp(s - m)`` never computes ``-inf - -inf``."""
    return xp.where(xp.isinf(m), xp.zeros_like(m), m)


def _scores(xp: Any, q: Array, k: Array, scale: float, mask: Array | None) -> tuple[Array, Array]:
    """Scaled scores (b, heads, nq, t) of ``q`` against ``k`` (GQA: each group of query heads against its KV
    head), -inf where ``mask`` is False; and ``q`` grouped by KV head (b, kv_heads, group * nq, d)."""
    b, heads, nq, d = q.shape
    kv_heads, t = k.shape[1], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    qg = xp.reshape(q, (b, kv_heads, (heads // kv_heads) * nq, d))
    scores = xp.reshape(xp.matmul(qg, xp.matrix_transpose(k)) * scale, (b, heads, nq, t))
    if mask is not None:
        scores = xp.where(mask, scores, xp.full_like(scores, -float("inf")))
    return scores, qg


def partial_attention(q: Array, k: Array, v: Array, scale: float, mask: Array | None = None) -> PartialState:
    """Attention of ``q`` against one shard of keys/values, as an unnormalised partial state.

    Shapes: ``q`` (b, heads, nq, d); ``k``, ``v`` (b, kv_heads, t, d) with ``heads % kv_heads == 0`` (GQA: each
    group of ``heads // kv_heads`` query heads shares one KV head); ``mask`` boolean, broadcastable to
    (b, heads, nq, t), True where the score is kept. An empty shard (t = 0) gives the identity state.
    """
    xp = array_namespace(q, k, v)
    b, heads, nq, d = q.shape
    kv_heads, t = k.shape[1], k.shape[2]
    scores, _ = _scores(xp, q, k, scale, mask)
    group = heads // kv_heads
    if t == 0:
        return empty_state(q)
    m = xp.max(scores, axis=-1)  # (b, heads, nq)
    p = xp.exp(scores - _finite_or_zero(xp, m)[..., None])
    l = xp.sum(p, axis=-1)
    pg = xp.reshape(p, (b, kv_heads, group * nq, t))
    o = xp.reshape(xp.matmul(pg, v), (b, heads, nq, d))
    return PartialState(o=o, l=l, m=m)


def empty_state(q: Array) -> PartialState:
    """The identity of :func:`merge` for queries shaped like ``q`` (b, heads, nq, d)."""
    xp = array_namespace(q)
    ml_shape = tuple(q.shape[:-1])
    return PartialState(o=xp.zeros_like(q), l=xp.zeros(ml_shape, dtype=q.dtype, device=q.device),
                        m=xp.full(ml_shape, -float("inf"), dtype=q.dtype, device=q.device))


def merge(a: PartialState, b: PartialState) -> PartialState:
    """Combine the states of two disjoint key subsets (commutative, associative, NaN-free on -inf rows)."""
    xp = array_namespace(a.o, a.l, a.m, b.o, b.l, b.m)
    m = xp.maximum(a.m, b.m)
    m0 = _finite_or_zero(xp, m)
    alpha = xp.exp(a.m - m0)  # a.m = -inf gives 0 (no -inf - -inf: m0 is finite)
    beta = xp.exp(b.m - m0)
    return PartialState(o=a.o * alpha[..., None] + b.o * beta[..., None], l=a.l * alpha + b.l * beta, m=m)


def rescale(state: PartialState, m_new: Array) -> PartialState:
    """Express ``state`` relative to a larger running max ``m_new`` (Tree Attention, Alg. 3: before the sum).

    After every rank rescales to the global max, the sum of the (o, l) pairs equals the merge of all states.
    """
    xp = array_namespace(state.o, state.l, state.m, m_new)
    factor = xp.exp(state.m - _finite_or_zero(xp, m_new))  # -inf rows give 0
    return PartialState(o=state.o * factor[..., None], l=state.l * factor, m=m_new)


def merge_all(states: list[PartialState]) -> PartialState:
    """Left fold of :func:`merge` over a non-empty list."""
    if not states:
        raise ValueError("merge_all needs at least one state")
    acc = states[0]
    for s in states[1:]:
        acc = merge(acc, s)
    return acc


def finalize(state: PartialState) -> Array:
    """Normalised attention output ``o / l``; rows with no unmasked score (l = 0) give 0."""
    xp = array_namespace(state.o, state.l)
    live = state.l > 0
    denom = xp.where(live, state.l, xp.ones_like(state.l))
    return xp.where(live[..., None], state.o / denom[..., None], xp.zeros_like(state.o))


def log_sum_exp(state: PartialState) -> Array:
    """``lse = m + log(l)`` per query row (b, heads, nq): the softmax denominator in log space; -inf on rows with
    no unmasked score. With the final lse, a row's probabilities are ``exp(s - lse)``, whatever block s is in."""
    xp = array_namespace(state.l, state.m)
    live = state.l > 0
    safe_l = xp.where(live, state.l, xp.ones_like(state.l))
    return xp.where(live, state.m + xp.log(safe_l), xp.full_like(state.m, -float("inf")))


def attention_delta(out: Array, dout: Array) -> Array:
    """``delta = rowsum(dO * O)`` (b, heads, nq): FlashAttention-2's backward preprocessing (Alg. 2, line 4)."""
    xp = array_namespace(out, dout)
    return xp.sum(out * dout, axis=-1)


def block_backward(q: Array, k: Array, v: Array, scale: float, mask: Array | None, lse: Array, delta: Array,
                   dout: Array) -> tuple[Array, Array, Array]:
    """One block's share of the attention gradients, given the *final* ``lse`` and ``delta`` of its query rows.

    Shapes as :func:`partial_attention` (``q``, ``dout`` (b, heads, nq, d); ``k``, ``v`` (b, kv_heads, t, d); ``lse``,
    ``delta`` (b, heads, nq); ``mask`` True where kept). Returns ``(dq, dk, dv)`` shaped like ``q``, ``k``, ``v``;
    with GQA a KV head's gradient sums over its group of query heads. Masked scores and rows with ``lse = -inf``
    contribute 0.
    """
    xp = array_namespace(q, k, v, lse, delta, dout)
    b, heads, nq, d = q.shape
    kv_heads, t = k.shape[1], k.shape[2]
    scores, qg = _scores(xp, q, k, scale, mask)
    group = heads // kv_heads
    dog = xp.reshape(dout, (b, kv_heads, group * nq, d))
    p = xp.exp(scores - _finite_or_zero(xp, lse)[..., None])  # masked: exp(-inf) = 0; lse = -inf rows: all masked
    pg = xp.reshape(p, (b, kv_heads, group * nq, t))
    dv = xp.matmul(xp.matrix_transpose(pg), dog)  # (b, kv_heads, t, d)
    dp = xp.reshape(xp.matmul(dog, xp.matrix_transpose(v)), (b, heads, nq, t))
    ds = xp.reshape(p * (dp - delta[..., None]), (b, kv_heads, group * nq, t))
    dq = xp.reshape(xp.matmul(ds, k) * scale, (b, heads, nq, d))
    dk = xp.matmul(xp.matrix_transpose(ds), qg) * scale
    return dq, dk, dv
