"""The merge core's backward pieces (lse, delta, block backward) against the dense closed-form reference, and that
reference against torch autograd."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.kernels.dense import dense_backward, dense_forward, visible
from simulator.merge import (
    attention_delta,
    block_backward,
    finalize,
    log_sum_exp,
    merge_all,
    partial_attention,
)


def _inputs(rng, b, heads, kv, n, d):
    q = rng.standard_normal((b, heads, n, d))
    k = rng.standard_normal((b, kv, n, d))
    v = rng.standard_normal((b, kv, n, d))
    dout = rng.standard_normal((b, heads, n, d))
    return q, k, v, dout


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 23), blocks=st.integers(1, 5), gqa=st.sampled_from([(4, 4), (4, 2), (4, 1)]),
       causal=st.booleans(), seed=st.integers(0, 2**16))
def test_blockwise_forward_and_backward_equal_dense(n, blocks, gqa, causal, seed):
    rng = np.random.default_rng(seed)
    heads, kv = gqa
    q, k, v, dout = _inputs(rng, 2, heads, kv, n, 8)
    pos = rng.permutation(n)  # rows in any order: masks follow global positions, not indices
    scale = 1 / math.sqrt(8)
    mask = visible(pos, pos, causal)
    out_ref, lse_ref = dense_forward(q, k, v, scale, mask)
    dq_ref, dk_ref, dv_ref = dense_backward(q, k, v, scale, mask, dout)
    cuts = np.array_split(np.arange(n), blocks)
    parts = [partial_attention(q, k[:, :, c], v[:, :, c], scale, mask[None, None][..., c]) for c in cuts]
    state = merge_all(parts)
    out, lse = finalize(state), log_sum_exp(state)
    np.testing.assert_allclose(out, out_ref, rtol=0, atol=1e-12)
    assert np.array_equal(np.isinf(lse), np.isinf(lse_ref))
    np.testing.assert_allclose(np.where(np.isinf(lse), 0, lse), np.where(np.isinf(lse_ref), 0, lse_ref), atol=1e-12)
    delta = attention_delta(out, dout)
    dq = np.zeros_like(q)
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    for c in cuts:
        for r in cuts:  # (query block, key block) pairs, each independent given the final lse
            bq, bk, bv = block_backward(q[:, :, r], k[:, :, c], v[:, :, c], scale, mask[None, None][..., r, :][..., c],
                                        lse[:, :, r], delta[:, :, r], dout[:, :, r])
            dq[:, :, r] += bq
            dk[:, :, c] += bk
            dv[:, :, c] += bv
    for got, ref in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)


def test_fully_masked_rows_have_zero_gradient_and_no_nan():
    rng = np.random.default_rng(1)
    q, k, v, dout = _inputs(rng, 1, 2, 1, 4, 4)
    mask = np.zeros((4, 4), dtype=bool)
    mask[2:, :2] = True  # rows 0, 1 see nothing
    state = partial_attention(q, k, v, 0.5, mask)
    lse = log_sum_exp(state)
    assert np.isneginf(lse[..., :2]).all()
    dq, dk, dv = block_backward(q, k, v, 0.5, mask, lse, attention_delta(finalize(state), dout), dout)
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    assert not dq[:, :, :2].any()
    ref = dense_backward(q, k, v, 0.5, mask, dout)
    for got, want in zip((dq, dk, dv), ref, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_dense_backward_equals_torch_autograd(causal):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    q, k, v, dout = _inputs(rng, 2, 6, 2, 9, 5)
    pos = rng.permutation(9)
    mask = visible(pos, pos, causal)
    scale = 0.37
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    s = torch.einsum("bhqd,bhtd->bhqt", tq, tk.repeat_interleave(3, dim=1)) * scale
    s = s.masked_fill(~torch.tensor(mask), float("-inf"))
    out = torch.softmax(s, dim=-1) @ tv.repeat_interleave(3, dim=1)
    out.backward(torch.tensor(dout))
    ref_out, _ = dense_forward(q, k, v, scale, mask)
    np.testing.assert_allclose(out.detach().numpy(), ref_out, atol=1e-12)
    for t, got in zip((tq, tk, tv), dense_backward(q, k, v, scale, mask, dout), strict=True):
        np.testing.assert_allclose(got, t.grad.numpy(), atol=1e-12)


def test_block_backward_runs_on_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    q, k, v, dout = _inputs(rng, 1, 4, 2, 6, 4)
    mask = visible(np.arange(6), np.arange(6), True)
    state = partial_attention(q, k, v, 0.5, mask)
    lse, delta = log_sum_exp(state), attention_delta(finalize(state), dout)
    ref = block_backward(q, k, v, 0.5, mask, lse, delta, dout)
    t = [torch.tensor(x) for x in (q, k, v)]
    got = block_backward(*t, 0.5, torch.tensor(mask), torch.tensor(lse), torch.tensor(delta), torch.tensor(dout))
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_allclose(g.numpy(), r, atol=1e-12)
