"""Prefill layouts: positions, unmasked-pair counts (closed forms vs brute force), imbalance, and the attention
efficiency of the device spec."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cluster.devices import compute_time, parse_device_spec
from simulator.errors import InputError
from simulator.workloads.layouts import (
    LAYOUTS,
    imbalance,
    layout_runs,
    pair_count,
    pair_matrix,
    positions,
    rank_pairs,
)
from simulator.workloads.prefill_shape import PrefillShape


def brute(qpos, kpos, causal):
    return int((kpos[None, :] <= qpos[:, None]).sum()) if causal else len(qpos) * len(kpos)


@settings(max_examples=60, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), p=st.integers(1, 9), extra=st.integers(0, 40), causal=st.booleans())
def test_pair_counts_equal_brute_force(layout, p, extra, causal):
    n = p + extra
    runs = layout_runs(layout, n, p)
    pos = [positions(r) for r in runs]
    assert sorted(np.concatenate(pos).tolist()) == list(range(n))  # a partition of the sequence
    for qr in range(p):
        for kr in range(p):
            assert pair_count(runs[qr], runs[kr], causal) == brute(pos[qr], pos[kr], causal)
        assert rank_pairs(runs[qr], n, causal) == sum(pair_count(runs[qr], runs[kr], causal) for kr in range(p))


def test_each_layout_owns_the_positions_its_definition_gives():
    assert [positions(r).tolist() for r in layout_runs("zigzag", 8, 2)] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert [positions(r).tolist() for r in layout_runs("striped", 7, 3)] == [[0, 3, 6], [1, 4], [2, 5]]
    assert [positions(r).tolist() for r in layout_runs("contiguous", 7, 3)] == [[0, 1, 2], [3, 4], [5, 6]]


@pytest.mark.parametrize("m", [1, 3, 1000])
def test_causal_imbalance_closed_forms_p8(m):
    p = 8
    n = 2 * p * m
    c = n // (2 * p)
    per_rank = {r: rank_pairs(runs, n, True) for r, runs in enumerate(layout_runs("zigzag", n, p))}
    assert set(per_rank.values()) == {c * ((2 * p - 1) * c + 2) + c * (c - 1)}  # equal on every rank
    assert imbalance("zigzag", n, p, True) == 1.0
    k = n // p
    striped = [rank_pairs(runs, n, True) for runs in layout_runs("striped", n, p)]
    assert striped == [k * (r + 1) + p * k * (k - 1) // 2 for r in range(p)]
    contiguous = imbalance("contiguous", n, p, True)
    assert contiguous == pytest.approx(((2 * p - 1) * k + 1) / (p * k + 1), rel=1e-15)
    if m == 1000:
        assert imbalance("striped", n, p, True) <= 1.02
        assert contiguous == pytest.approx((2 * p - 1) / p, rel=1e-3)
    assert imbalance("contiguous", n, p, False) == 1.0


def test_prefill_costs():
    s = PrefillShape(batch=2, heads=8, head_dim=64, kv_heads=2, sequence=100, dtype="bf16")
    f, _ = s.forward_cost(10, 10, 55)
    assert f == 4 * 2 * 8 * 55 * 64
    assert s.backward_cost(10, 10, 55)[0] == 2.5 * f
    assert s.total_pairs == 5050
    assert s.model_flops == 4 * 2 * 8 * 5050 * 64


def _locate(path, err):
    return InputError(err.message, field=".".join(map(str, path)))


def test_attention_efficiency_is_a_documented_device_field():
    spec = parse_device_spec("g", {"peak_flops": {"bf16": "100 TFLOP/s"}, "eff_flops": 0.8,
                                   "attention_efficiency": {"forward": 0.5, "backward": 0.25}}, _locate)
    assert compute_time(spec, 1e12, 0, "bf16", launch=False) == pytest.approx(1e12 / 80e12)
    assert compute_time(spec, 1e12, 0, "bf16", launch=False, fn="attn-fwd") == pytest.approx(1e12 / 50e12)
    assert compute_time(spec, 1e12, 0, "bf16", launch=False, fn="attn-bwd") == pytest.approx(1e12 / 25e12)
    plain = parse_device_spec("g", {"peak_flops": {"bf16": "100 TFLOP/s"}, "eff_flops": 0.8}, _locate)
    assert compute_time(plain, 1e12, 0, "bf16", launch=False, fn="attn-fwd") == pytest.approx(1e12 / 80e12)
    with pytest.raises(InputError, match="valid keys: backward, forward"):
        parse_device_spec("g", {"attention_efficiency": {"fwd": 0.5}}, _locate)
    with pytest.raises(InputError, match=r"in \(0, 1\]"):
        parse_device_spec("g", {"attention_efficiency": {"forward": 1.5}}, _locate)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(LAYOUTS), st.integers(0, 300), st.integers(1, 12), st.booleans())
def test_pair_matrix_is_pair_count_of_every_pair(layout: str, n: int, p: int, causal: bool) -> None:
    runs = layout_runs(layout, n, p)
    matrix = pair_matrix(runs, causal)
    assert matrix.tolist() == [[pair_count(q, k, causal) for k in runs] for q in runs]
