"""Every prefill schedule replayed on arrays equals dense attention (and, with a backward, its gradients): every
layout, uneven n, GQA, P in {1, 2, 3, 4, 8}."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.algorithms import Layout
from simulator.algorithms.prefill import PREFILL_REGISTRY, build_prefill
from simulator.numeric.prefill import make_prefill_inputs, run_prefill_numeric
from simulator.workloads.layouts import LAYOUTS
from simulator.workloads.prefill_shape import PrefillShape

HEADS, HEAD_DIM, BATCH = 8, 4, 2


def check(name, p, layout, kv, n, causal, backward, dtype, tol, params=None):
    s = PrefillShape(BATCH, HEADS, HEAD_DIM, kv, n, "fp64" if dtype == np.float64 else "fp32", causal, layout, backward)
    sched = build_prefill(name, params or {}, s, Layout((0,) * p))
    inp = make_prefill_inputs(np.random.default_rng(p * 100 + n), BATCH, HEADS, kv, HEAD_DIM, n, causal, dtype)
    res = run_prefill_numeric(sched, inp)
    assert res.max_abs_err < tol
    assert res.max_grad_err < tol


def _ulysses_ok(p, kv):
    return HEADS % p == 0 and (kv % p == 0 or p % kv == 0)


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("name", list(PREFILL_REGISTRY))
def test_prefill_schedules_equal_dense_fp64(name, p, layout, backward):
    n = 2 * p * 2 + 3  # uneven for every layout
    for kv in (HEADS, 2, 1):  # MHA, GQA, MQA
        if name == "ulysses" and not _ulysses_ok(p, kv):
            continue
        check(name, p, layout, kv, n, True, backward, np.float64, 1e-12)
    if name != "ulysses" or _ulysses_ok(p, 2):  # full (non-causal) attention
        check(name, p, layout, 2, n, False, backward, np.float64, 1e-12)


@pytest.mark.parametrize("name", list(PREFILL_REGISTRY))
@pytest.mark.parametrize("p", [2, 4, 8])
def test_prefill_schedules_equal_dense_fp32(name, p):
    check(name, p, "zigzag", 2, 8 * p + 5, True, True, np.float32, 1e-5)


def test_ring_without_overlap_is_exact_too():
    check("ring", 4, "striped", 2, 19, True, True, np.float64, 1e-12, {"overlap": False})


def test_fewer_tokens_than_twice_the_ranks():
    check("ring", 8, "zigzag", 2, 9, True, True, np.float64, 1e-12)
    check("allgather", 8, "zigzag", 2, 8, True, True, np.float64, 1e-12)


@pytest.mark.parametrize("hosts", [(0, 0, 1, 1), (0, 0, 0, 0, 1, 1, 1, 1), (0, 0, 1, 1, 2, 2, 3, 3)])
@pytest.mark.parametrize("kv", [8, 2])
def test_ulysses_with_hierarchical_alltoall_is_exact(hosts, kv):
    s = PrefillShape(BATCH, HEADS, HEAD_DIM, kv, 29, "fp64", True, "zigzag", True)
    sched = build_prefill("ulysses", {"alltoall": "hierarchical"}, s, Layout(hosts))
    res = run_prefill_numeric(sched, make_prefill_inputs(np.random.default_rng(5), BATCH, HEADS, kv, HEAD_DIM, 29,
                                                         True))
    assert res.max_abs_err < 1e-12 and res.max_grad_err < 1e-12
