"""Real runs of the prefill schedules (gloo, 2 and 4 local processes, many cases per process group) against
single-device torch autograd of dense attention; the payload rules that size their messages."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from simulator.algorithms import Layout  # noqa: E402
from simulator.algorithms.prefill import build_prefill  # noqa: E402
from simulator.kernels.payload import component_shapes, transfer_layouts  # noqa: E402
from simulator.kernels.prefill import Rows, StateRows  # noqa: E402
from simulator.numeric.prefill import PrefillExecutor, make_prefill_inputs  # noqa: E402
from simulator.workloads.layouts import LAYOUTS, positions  # noqa: E402
from simulator.workloads.prefill_shape import PrefillShape  # noqa: E402

ALGORITHMS = [("ring", {}), ("ring", {"overlap": False}), ("ring-q", {}), ("allgather", {}), ("ulysses", {}),
              ("usp", {})]


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
                       start_method="spawn")
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


P2P_CASES = [("ring", "contiguous", True, "batched"), ("ring", "contiguous", True, "per-peer"),
             ("ring-q", "zigzag", False, "batched")]


def _p2p_shape(layout: str, backward: bool) -> PrefillShape:
    return PrefillShape(2, 4, 8, 2, 13, "fp64", True, layout, backward)


def _p2p_rank(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist

    from simulator.distributed.prefill_run import check_outputs, gather_results, to_torch, torch_reference
    from simulator.distributed.runner import PrefillRankRunner

    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    device = torch.device("cpu")
    results = []
    for name, layout, backward, p2p in P2P_CASES:
        shape = _p2p_shape(layout, backward)
        inp = make_prefill_inputs(np.random.default_rng(7), 2, 4, 2, 8, shape.sequence, True)
        sched = build_prefill(name, {"p2p": p2p}, shape, Layout((0,) * world))
        runner = PrefillRankRunner(sched, to_torch(inp, device), rank, transfer_layouts(sched, shape), device)
        gathered = gather_results(sched, runner.run_rank())
        posted: list[list[int]] = [[] for _ in range(world)]
        dist.all_gather_object(posted, runner.batches_posted)
        if gathered is not None:
            check = check_outputs(sched, gathered, torch_reference(inp))
            results.append({"posted": posted, "out": check.max_abs_err, "grad": check.grad_max_abs_err})
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def test_the_real_runner_posts_a_ranks_point_to_point_batches_as_the_engine_orders_them(tmp_path):
    """With ``p2p: batched`` each rank posts its ends issued back to back as one ``batch_isend_irecv``: the groups
    :func:`p2p_batches` defines (the engine's stream order), including a new group where an end waits for one of the
    open group (a contiguous ring's rank that forwards keys and values without attending); ``per-peer`` posts each
    end alone. Either way the outputs and gradients equal dense autograd."""
    import torch.multiprocessing as mp

    from simulator.schedule.colpass import p2p_batches

    world, out = 2, tmp_path / "results.json"
    mp.start_processes(_p2p_rank, args=(world, str(tmp_path / "store"), str(out)), nprocs=world, join=True,
                       start_method="spawn")
    results = json.loads(out.read_text())
    split = False  # two batches of a rank back to back (an end waited for one of the batch before)
    for (name, layout, backward, p2p), got in zip(P2P_CASES, results, strict=True):
        assert got["out"] < 1e-10 and (got["grad"] < 1e-10 if backward else math.isnan(got["grad"])), got
        sched = build_prefill(name, {"p2p": p2p}, _p2p_shape(layout, backward), Layout((0,) * world))
        cols = sched.ops.columns()
        batch = p2p_batches(cols.dep_count, cols.parents, cols.kind, cols.rank, cols.match, cols.coll)
        for r in range(world):
            mine = batch[(cols.rank == r) & (batch >= 0)]
            want = [] if p2p == "per-peer" else np.unique(mine, return_counts=True)[1].tolist()
            assert got["posted"][r] == want and (p2p == "per-peer" or want), (name, layout, p2p, r)
            seq = batch[cols.rank == r]
            split |= bool(((seq[1:] >= 0) & (seq[:-1] >= 0) & (seq[1:] != seq[:-1])).any())
    assert split


SCENARIO = """
name: real-prefill
topology: cluster
topology_params: {nodes: 1, gpus_per_node: 4}
workload: {kind: prefill, model: {heads: 4, kv_heads: 2, head_dim: 8}, batch: 2, sequence: 19, dtype: fp64,
           causal: true, layout: zigzag, backward: true}
algorithms: [ring, allgather, ulysses, single]
sweep:
  workload.backward: [false, true]
"""


@pytest.mark.slow
def test_validate_runs_prefill_points_and_writes_the_gradient_error(tmp_path, capsys):
    from simulator.cli import main

    path = tmp_path / "p.yaml"
    path.write_text(SCENARIO.lstrip())
    out = tmp_path / "o"
    rc = main(["validate", str(path), "--procs", "2", "--iters", "1", "--warmup", "0", "-o", str(out),
               "--timeout", "120"])
    assert rc == 0, capsys.readouterr().err
    df = pd.read_csv(out / "validation.csv")
    assert len(df) == 8 and set(df["phase"]) == {"prefill", "train"}
    assert (df["max_abs_err"] < 1e-12).all() and df["bitwise_equal_to_sim"].all()
    assert (df.loc[df["phase"] == "train", "grad_max_abs_err"] < 1e-12).all()
    assert df.loc[df["phase"] == "prefill", "grad_max_abs_err"].isna().all()
    assert (df["measured_s"] > 0).all() and (df["predicted_s"] > 0).all()
    assert "dQ, dK, dV against torch autograd" in (out / "summary.md").read_text()


def test_reference_by_blocks_equals_the_closed_form_backward():
    """The blocked torch-autograd reference of validate equals dense attention's closed-form backward (numpy)."""
    from simulator.distributed.prefill_validate import reference_by_blocks
    from simulator.kernels.dense import dense_backward, dense_forward, visible

    for causal in (True, False):
        inp = make_prefill_inputs(np.random.default_rng(3), 2, 4, 2, 5, 23, causal)
        pos = np.arange(23)
        mask = visible(pos, pos, causal)[None, None]
        want = (dense_forward(inp.q, inp.k, inp.v, inp.scale, mask)[0],
                *dense_backward(inp.q, inp.k, inp.v, inp.scale, mask, inp.dout))
        got = reference_by_blocks(inp, block_scores=2 * 4 * 23 * 3)  # 3 query rows per block
        for a, b in zip(got, want, strict=True):
            assert np.abs(a - b).max() < 1e-12


def test_validate_refuses_other_workloads_before_any_rank_starts(tmp_path, capsys):
    from simulator.cli import main

    path = tmp_path / "c.yaml"
    path.write_text("name: c\ntopology: dgx-h100\nworkload: {kind: collective, collective: allreduce, bytes: 1 MiB}\n"
                    "algorithms: [ring]\n")
    assert main(["validate", str(path), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("treering: error: ") and "workload.kind: validate needs a decode or prefill workload" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "o").exists()
