"""Dense attention over whole sequences and its closed-form backward, in float64 numpy: the reference that prefill
schedules (forward and backward) are checked against. Independent of the merge core (explicit softmax).

Masks are by **global position**: with ``causal``, key position j is visible to query position i iff j <= i.
Shapes: ``q``, ``dout`` (b, heads, nq, d); ``k``, ``v`` (b, kv_heads, nk, d) (GQA: query head h uses KV head
h // (heads // kv_heads)); ``qpos`` (nq,), ``kpos`` (nk,) the global positions of the rows.

The backward of ``O = softmax(scale Q K^T) V`` (e.g. FlashAttention-2, arXiv:2307.08691, Sec. 2.2)::

    dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(P * dP));  dQ = scale dS K;  dK = scale dS^T Q
"""

from __future__ import annotations

import numpy as np

__all__ = ["dense_backward", "dense_forward", "visible"]


def visible(qpos: np.ndarray, kpos: np.ndarray, causal: bool) -> np.ndarray:
    """Boolean (nq, nk): True where key ``kpos[j]`` is visible to query ``qpos[i]``."""
    if not causal:
        return np.ones((len(qpos), len(kpos)), dtype=bool)
    return np.asarray(kpos)[None, :] <= np.asarray(qpos)[:, None]


def _expand(k: np.ndarray, heads: int) -> np.ndarray:
    return np.repeat(np.asarray(k, dtype=np.float64), heads // k.shape[1], axis=1)


def _probs(q: np.ndarray, k: np.ndarray, scale: float, mask: np.ndarray) -> np.ndarray:
    s = np.einsum("bhqd,bhtd->bhqt", np.asarray(q, dtype=np.float64), _expand(k, q.shape[1])) * scale
    s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isinf(m), 0.0, m))
    l = p.sum(axis=-1, keepdims=True)
    return np.where(l > 0, p / np.where(l > 0, l, 1.0), 0.0)


def dense_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(out, lse)``: out (b, heads, nq, d), lse (b, heads, nq) (-inf on rows that see no key)."""
    q64 = np.asarray(q, dtype=np.float64)
    s = np.einsum("bhqd,bhtd->bhqt", q64, _expand(k, q.shape[1])) * scale
    s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1)
    with np.errstate(divide="ignore"):
        lse = m + np.log(np.exp(s - np.where(np.isinf(m), 0.0, m)[..., None]).sum(axis=-1))
    lse = np.where(np.isinf(m), -np.inf, lse)
    return _probs(q, k, scale, mask) @ _expand(v, q.shape[1]), lse


def dense_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask: np.ndarray, dout: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dq, dk, dv)`` of ``sum(out * dout)``, shaped like q, k, v (a KV head sums over its query heads)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    group = heads // kv_heads
    p = _probs(q, k, scale, mask)
    do = np.asarray(dout, dtype=np.float64)
    dv_full = np.einsum("bhqt,bhqd->bhtd", p, do)
    dp = np.einsum("bhqd,bhtd->bhqt", do, _expand(v, heads))
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = np.einsum("bhqt,bhtd->bhqd", ds, _expand(k, heads)) * scale
    dk_full = np.einsum("bhqt,bhqd->bhtd", ds, np.asarray(q, dtype=np.float64)) * scale
    b, _, nk, d = dk_full.shape
    dk = dk_full.reshape(b, kv_heads, group, nk, d).sum(axis=2)
    dv = dv_full.reshape(b, kv_heads, group, nk, d).sum(axis=2)
    return dq, dk, dv
