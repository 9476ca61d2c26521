"""Numeric mode: every schedule equals dense attention, in its own merge order."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.algorithms import Layout, build_schedule, resolve
from simulator.numeric.decode import make_inputs, run_numeric
from simulator.workloads.shape import DecodeShape, shard_bounds

ALGOS = [
    "ring", {"name": "ring", "overlap": False}, "ring-q", "tree",
    {"name": "tree", "allreduce": "ring"}, {"name": "tree", "allreduce": "double-binary-tree"},
    {"name": "tree", "allreduce": "recursive-doubling"}, {"name": "tree", "allreduce": "hierarchical"},
    "tree-p2p", {"name": "tree-p2p", "arity": 3, "topology_aware": True}, {"name": "tree-p2p", "arity": 4},
    "single",
]


def _id(entry):
    return entry if isinstance(entry, str) else ",".join(f"{k}={v}" for k, v in entry.items())


@pytest.mark.parametrize("entry", ALGOS, ids=_id)
@pytest.mark.parametrize("ranks", [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize(("dtype", "tol"), [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_every_schedule_equals_dense_attention(entry, ranks, dtype, tol):
    context = 7 * ranks + 3  # uneven shards
    shape = DecodeShape(batch=2, heads=4, head_dim=16, kv_heads=2, context=context,  # GQA: 2 query heads per KV head
                        dtype="fp64" if dtype == np.float64 else "fp32")
    rng = np.random.default_rng(ranks)
    mask = np.ones((2, context), bool)
    lo, hi = shard_bounds(context, ranks)[ranks // 2]
    mask[:, lo:hi] = False  # one shard whose scores are all masked
    mask[1, :5] = False
    inp = make_inputs(rng, 2, 4, 2, 16, context, dtype, mask=mask)
    name, params = resolve(entry)
    sched = build_schedule(name, params, shape, Layout(tuple(r // 4 for r in range(ranks))))
    res = run_numeric(sched, inp)
    assert res.max_abs_err < tol
    assert all(np.isfinite(out).all() for out in res.outputs.values())


def test_fully_masked_row_gives_zero_not_nan():
    shape = DecodeShape(1, 2, 8, 2, 12, "fp64")
    mask = np.zeros((1, 12), bool)
    inp = make_inputs(np.random.default_rng(0), 1, 2, 2, 8, 12, mask=mask)
    for entry in ("ring", "tree", "tree-p2p"):
        name, params = resolve(entry)
        res = run_numeric(build_schedule(name, params, shape, Layout((0, 0, 0))), inp)
        assert res.max_abs_err == 0.0


def test_ring_and_tree_differ_only_by_rounding():
    shape = DecodeShape(1, 8, 32, 8, 1000, "fp64")
    inp = make_inputs(np.random.default_rng(1), 1, 8, 8, 32, 1000)
    outs = {}
    for entry in ("ring", "tree", "single"):
        name, params = resolve(entry)
        outs[entry] = run_numeric(build_schedule(name, params, shape, Layout((0,) * 8)), inp).outputs[0]
    assert np.abs(outs["ring"] - outs["tree"]).max() < 1e-14
    assert np.abs(outs["ring"] - outs["single"]).max() < 1e-14


def test_an_unknown_kernel_names_the_known_ones() -> None:
    from simulator.kernels.table import KERNELS, kernel

    with pytest.raises(ValueError, match="unknown kernel 'softmax'; kernels: attend, merge"):
        kernel("softmax")
    assert {"attend", "merge", "finalize", "reduce-sum", "copy"} <= set(KERNELS)


def test_every_kernel_a_schedule_names_is_in_the_table() -> None:
    from simulator.algorithms import REGISTRY
    from simulator.kernels.table import KERNELS

    shape = DecodeShape(batch=1, heads=2, head_dim=4, kv_heads=2, context=16, dtype="fp32")
    for name in REGISTRY:
        sched = build_schedule(name, resolve(name)[1], shape, Layout((0, 0, 1, 1)))
        assert {op.fn for op in sched.ops if op.kind in ("compute", "merge")} <= set(KERNELS), name
