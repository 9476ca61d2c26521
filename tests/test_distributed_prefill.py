"""Real runs of the prefill schedules (gloo, 2 and 4 local processes, many cases per process group) against
single-device torch autograd of dense attention; the payload rules that size their messages."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from simulator.algorithms import Layout  # noqa: E402
from simulator.algorithms.prefill import build_prefill  # noqa: E402
from simulator.payload import component_shapes, transfer_layouts  # noqa: E402
from simulator.prefill_kernels import Rows, StateRows  # noqa: E402
from simulator.prefill_numeric import PrefillExecutor, make_prefill_inputs  # noqa: E402
from simulator.workloads.layouts import LAYOUTS, positions  # noqa: E402
from simulator.workloads.prefill_shape import PrefillShape  # noqa: E402

ALGORITHMS = [("ring", {}), ("ring", {"overlap": False}), ("allgather", {}), ("ulysses", {})]


def _arrays(value: object) -> list[tuple[int, ...]]:
    if isinstance(value, Rows):
        return [tuple(a.shape) for a in value.arrays]
    assert isinstance(value, StateRows)
    return [tuple(x.shape) for x in (value.state.o, value.state.l, value.state.m)]


class _Recording(PrefillExecutor):
    """Numeric mode that keeps what every send carried."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.sent: dict[int, tuple[object, ...]] = {}

    def send(self, op):  # type: ignore[no-untyped-def]
        super().send(op)
        self.sent[op.id] = self.in_flight[op.id]


@pytest.mark.parametrize(("hosts", "layout", "backward"), [
    (hosts, layout, backward) for hosts in [(0, 0), (0, 0, 0), (0, 0, 0, 0), (0, 0, 1, 1)]
    for layout in LAYOUTS for backward in (False, True)])
def test_payload_rules_give_every_message_its_arrays_and_positions(hosts, layout, backward):
    """What the payload rules say a send carries (no execution) is what numeric mode's send holds: the same
    arrays, shapes, positions and first head."""
    p = len(hosts)
    shape = PrefillShape(2, 4, 3, 2, 4 * p + 3, "fp64", True, layout, backward)
    inp = make_prefill_inputs(np.random.default_rng(0), 2, 4, 2, 3, shape.sequence, True)
    algos = [*ALGORITHMS, ("ulysses", {"alltoall": "hierarchical"})] if len(set(hosts)) > 1 else ALGORITHMS
    for name, params in algos:
        if name == "ulysses" and shape.heads % p:
            continue
        sched = build_prefill(name, params, shape, Layout(hosts))
        layouts = transfer_layouts(sched, shape)
        ex = _Recording(sched, inp)
        ex.run(sched)
        assert set(layouts) == set(ex.sent) and layouts
        for op_id, descs in layouts.items():
            for desc, value in zip(descs, ex.sent[op_id], strict=True):
                assert component_shapes(desc, shape) == _arrays(value), (name, op_id, desc)
                got_pos = positions(desc[5] if desc[0] == "rows" else desc[4])
                assert np.array_equal(got_pos, value.pos)
                assert (desc[4] if desc[0] == "rows" else desc[3]) == value.h0


def _cases(world: int) -> list[dict[str, object]]:
    """Every layout x schedule x forward/backward, uneven n, GQA (with 4 ranks Ulysses replicates the 2 KV heads)."""
    return [{"layout": layout, "name": name, "params": params, "backward": backward, "causal": causal,
             "n": 4 * world + 3}
            for layout, (name, params), backward in itertools.product(LAYOUTS, ALGORITHMS, (False, True))
            for causal in ((True, False) if layout == "zigzag" else (True,))]


def _rank(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist

    from simulator.distributed.prefill_run import (
        check_outputs,
        gather_results,
        run_prefill_rank,
        to_torch,
        torch_reference,
    )

    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    device = torch.device("cpu")
    results = []
    for i, case in enumerate(_cases(world)):
        n = int(case["n"])  # type: ignore[call-overload]
        shape = PrefillShape(2, 4, 8, 2, n, "fp64", bool(case["causal"]), str(case["layout"]), bool(case["backward"]))
        inp = make_prefill_inputs(np.random.default_rng(i), 2, 4, 2, 8, n, shape.causal)
        sched = build_prefill(str(case["name"]), case["params"], shape, Layout((0,) * world))  # type: ignore[arg-type]
        gathered = gather_results(sched, run_prefill_rank(sched, to_torch(inp, device), device))
        if gathered is not None:
            check = check_outputs(sched, gathered, torch_reference(inp))
            results.append({**case, "out": check.max_abs_err, "grad": check.grad_max_abs_err})
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def _run(world: int, tmp_path) -> list[dict[str, object]]:
    import torch.multiprocessing as mp

    out = tmp_path / "results.json"
    mp.start_processes(_rank, args=(world, str(tmp_path / "store"), str(out)), nprocs=world, join=True,
                       start_method="fork")
    return json.loads(out.read_text())


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_real_prefill_equals_torch_autograd_of_dense_attention(world, tmp_path):
    results = _run(world, tmp_path)
    assert len(results) == len(_cases(world))
    for r in results:
        assert r["out"] < 1e-10, r
        if r["backward"]:
            assert r["grad"] < 1e-10, r
        else:
            assert math.isnan(r["grad"]), r  # type: ignore[arg-type]
