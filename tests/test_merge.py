"""The merge core: associativity, commutativity, -inf rows, agreement with dense attention, numpy and torch."""

from __future__ import annotations

import itertools
import math
from functools import reduce

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.merge import PartialState, empty_state, finalize, merge, merge_all, partial_attention


def dense_attention(q, k, v, scale, mask=None):
    heads, kv_heads = q.shape[1], k.shape[1]
    k = np.repeat(k, heads // kv_heads, axis=1)
    v = np.repeat(v, heads // kv_heads, axis=1)
    s = np.einsum("bhqd,bhtd->bhqt", q, k) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isinf(m), 0, m))
    l = p.sum(-1, keepdims=True)
    return np.where(l > 0, (p @ v) / np.where(l > 0, l, 1), 0)


def state(m, l, o):
    return PartialState(o=np.asarray(o, float), l=np.asarray(l, float), m=np.asarray(m, float))


m_values = st.one_of(st.just(-math.inf), st.floats(-30, 30))
states = st.tuples(m_values, st.floats(0.01, 100), st.floats(-10, 10)).map(
    lambda t: state([t[0]], [0.0 if math.isinf(t[0]) else t[1]], [[0.0 if math.isinf(t[0]) else t[2]]]))


def close(a, b):
    return (np.array_equal(a.m, b.m) and np.allclose(a.l, b.l, rtol=1e-12, atol=0)
            and np.allclose(a.o, b.o, rtol=1e-12, atol=1e-300))


@settings(max_examples=300, deadline=None)
@given(states, states, states)
def test_merge_is_associative(a, b, c):
    left, right = merge(merge(a, b), c), merge(a, merge(b, c))
    assert close(left, right)
    assert not np.isnan(left.l).any() and not np.isnan(left.o).any()


@settings(max_examples=300, deadline=None)
@given(states, states)
def test_merge_is_commutative(a, b):
    ab, ba = merge(a, b), merge(b, a)
    assert np.array_equal(ab.m, ba.m) and np.array_equal(ab.l, ba.l) and np.array_equal(ab.o, ba.o)


def test_fully_masked_rows_merge_without_nan():
    q = np.ones((1, 1, 1, 4))
    empty = partial_attention(q, np.ones((1, 1, 3, 4)), np.ones((1, 1, 3, 4)), 0.5,
                              mask=np.zeros((1, 1, 1, 3), bool))
    assert np.isneginf(empty.m).all() and (empty.l == 0).all()
    both = merge(empty, empty)
    assert not np.isnan(both.o).any() and (finalize(both) == 0).all()
    live = partial_attention(q, np.ones((1, 1, 2, 4)), np.full((1, 1, 2, 4), 3.0), 0.5)
    assert np.allclose(finalize(merge(empty, live)), 3.0)


def test_seed_exercise_eight_states_ring_and_tree_agree():
    pairs = [(2, 3), (1, 4), (3, 1), (0, 5), (2, 2), (1, 6), (4, 1), (0, 3)]
    states8 = [state([m], [l], [[l]]) for m, l in pairs]
    ring = reduce(merge, states8)
    level = states8
    while len(level) > 1:
        level = [merge(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    tree = level[0]
    expected_l = sum(l * math.exp(m - 4) for m, l in pairs)
    assert ring.m[0] == tree.m[0] == 4
    assert math.isclose(ring.l[0], expected_l, rel_tol=1e-14)
    assert math.isclose(tree.l[0], expected_l, rel_tol=1e-14)


@pytest.mark.parametrize("splits", [[10], [3, 7], [1, 0, 4, 5], [2, 2, 2, 2, 2]])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_sharded_partials_equal_dense_attention(splits, kv_heads):
    rng = np.random.default_rng(7)
    b, heads, d, t = 2, 4, 8, sum(splits)
    q = rng.standard_normal((b, heads, 1, d))
    k = rng.standard_normal((b, kv_heads, t, d))
    v = rng.standard_normal((b, kv_heads, t, d))
    scale = 1 / math.sqrt(d)
    bounds = np.cumsum([0, *splits])
    parts = [partial_attention(q, k[:, :, a:z], v[:, :, a:z], scale) for a, z in itertools.pairwise(bounds)]
    out = finalize(merge_all([empty_state(q), *parts]))
    assert np.abs(out - dense_attention(q, k, v, scale)).max() < 1e-12


def test_torch_tensors_use_the_same_code():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s) for s in ((1, 4, 1, 8), (1, 2, 6, 8), (1, 2, 6, 8)))
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    a = partial_attention(tq, tk[:, :, :2], tv[:, :, :2], 0.3)
    b = partial_attention(tq, tk[:, :, 2:], tv[:, :, 2:], 0.3)
    out = finalize(merge(a, b))
    assert isinstance(out, torch.Tensor)
    assert np.abs(out.numpy() - dense_attention(q, k, v, 0.3)).max() < 1e-12
