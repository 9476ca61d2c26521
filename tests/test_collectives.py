"""Every collective decomposition computes what it promises, on real arrays, for any rank count and layout."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.collectives import ALGORITHMS, allreduce, broadcast, reduce
from simulator.numeric.decode import Executor, make_inputs
from simulator.schedule.core import Schedule

HOSTS = {5: (0, 0, 0, 1, 1), 6: (0, 0, 1, 1, 2, 2), 8: (0, 0, 0, 0, 1, 1, 1, 1), 1: (0,), 2: (0, 1), 3: (0, 0, 0)}


def run(p: int, kind: str, algo: str, op: str, n: int, root: int = 0):
    sched = Schedule(p)
    common = {"elem_bytes": 8, "dtype": "fp64", "tag": kind, "deps": {}, "algo": algo}
    ranks = list(range(p))
    if kind == "allreduce":
        allreduce(sched, ranks, HOSTS[p], "x", n, op=op, **common)
    elif kind == "reduce":
        reduce(sched, ranks, HOSTS[p], "x", n, root=root, op=op, **common)
    else:
        broadcast(sched, ranks, HOSTS[p], "x", n, root=root, **common)
    ex = Executor(sched, make_inputs(np.random.default_rng(0), 1, 1, 1, 1, 1))
    data = np.random.default_rng(p).standard_normal((p, n))
    for r in ranks:
        ex.buf[r]["x"] = data[r].copy()
    ex.run(sched)
    return data, [ex.buf[r]["x"] for r in ranks]


@pytest.mark.parametrize("algo", ALGORITHMS)
@pytest.mark.parametrize("p", sorted(HOSTS))
@pytest.mark.parametrize("op", ["sum", "max"])
def test_allreduce(algo, p, op):
    data, out = run(p, "allreduce", algo, op, n=37)
    want = data.sum(0) if op == "sum" else data.max(0)
    for got in out:
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("algo", ALGORITHMS)
@pytest.mark.parametrize("p", sorted(HOSTS))
def test_reduce_and_broadcast_to_any_root(algo, p):
    root = p - 1
    data, out = run(p, "reduce", algo, "sum", n=11, root=root)
    np.testing.assert_allclose(out[root], data.sum(0), rtol=1e-13, atol=1e-13)
    data, out = run(p, "broadcast", algo, "sum", n=11, root=root)
    for got in out:
        np.testing.assert_array_equal(got, data[root])
