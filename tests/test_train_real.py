"""Real training steps of a small model (2 layers, 4 heads, GQA) on gloo ranks over TP x CP x PP x DP, attention by
the simulator's prefill schedules: every rank's gradient of every weight equals single-process autograd of the same
model and data (float64), the loss too; several layouts per process group (issue 43, "Real runs")."""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from simulator.models.presets import custom_model  # noqa: E402

MODEL = custom_model(layers=2, hidden=16, heads=4, kv_heads=2, head_dim=4, intermediate=24, vocab=32)
REL = 1e-10

# (tp, cp, pp, dp, cp_algorithm, layout, micro-batches per replica, micro_batch, optimizer, placement)
CASES: dict[int, list[tuple[int, int, int, int, str, str, int, int, str, str]]] = {
    4: [(2, 2, 1, 1, "ring", "zigzag", 1, 1, "adam", "tp-cp-pp-dp"),
        (1, 2, 2, 1, "allgather", "contiguous", 3, 1, "sgd", "tp-cp-pp-dp"),
        (1, 1, 2, 2, "ring", "zigzag", 2, 2, "adam", "tp-cp-pp-dp"),
        (2, 1, 1, 2, "ring", "striped", 1, 1, "adam", "tp-cp-pp-dp"),
        (1, 4, 1, 1, "ulysses", "zigzag", 1, 1, "adam", "tp-cp-pp-dp"),
        (1, 2, 2, 1, "ring", "zigzag", 2, 1, "adam", "pp-tp-dp-cp")],  # the stages next to each other
    8: [(2, 2, 2, 1, "ring", "zigzag", 2, 1, "adam", "tp-cp-pp-dp")],
}


def _rank(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)  # as the launcher's ranks run (OMP_NUM_THREADS=1): many ranks share two CPUs
    from simulator.distributed.train_run import TrainRank, TrainSpec, check_step

    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    results = []
    for tp, cp, pp, dp, algo, layout, m, mb, opt, order in CASES[world]:
        spec = TrainSpec(MODEL, 16, m * mb * dp, mb, tp, cp, pp, dp, algo, layout, "fp64", opt, seed=tp + 3 * cp,
                         placement=tuple(order.split("-")))
        trank = TrainRank(spec, torch.device("cpu"), [0] * world)
        result = trank.step().run_rank()
        check = check_step(spec, trank, result)
        # the same check of gradients one part in a million off: it must see them
        off = check_step(spec, trank, {"grads": {n: g * (1 + 1e-6) for n, g in result["grads"].items()},
                                       "losses": result["losses"]})
        if check is not None and off is not None:
            results.append({"case": [tp, cp, pp, dp, algo, layout, m, mb], "rel": check.grad_max_rel_err,
                            "loss": check.loss_abs_err, "weights": check.weights, "off": off.grad_max_rel_err})
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def _run(world: int, tmp_path: Any) -> list[dict[str, Any]]:
    import multiprocessing

    import torch.multiprocessing as mp

    # the ranks fork from a server that imported torch and the step once (spawning 8 fresh interpreters that each
    # import them takes seconds of CPU apiece); nothing in the server has started a thread pool
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "simulator.distributed.train_run"])
    out = tmp_path / "results.json"
    mp.start_processes(_rank, args=(world, str(tmp_path / "store"), str(out)), nprocs=world, join=True,
                       start_method="forkserver")
    results: list[dict[str, Any]] = json.loads(out.read_text())
    return results


@pytest.mark.parametrize("world", [4, 8])
def test_real_step_gradients_equal_single_process_autograd(world: int, tmp_path: Any) -> None:
    results = _run(world, tmp_path)
    assert len(results) == len(CASES[world])
    for r in results:
        assert r["weights"] == 1 + 9 * MODEL.layers + 2, r  # every weight's gradient was compared
        assert r["rel"] < REL, r
        assert r["loss"] < 1e-12, r
        assert r["off"] > 1e-7, r


def test_placement_is_treerings_tp_then_cp_then_pp_then_dp() -> None:
    """Process ranks take the simulator's coordinates: TP groups consecutive, DP groups as simulator.training.dp
    forms them, the stages tp x cp apart."""
    from simulator.distributed.train_run import TrainSpec
    from simulator.training.dp import dp_groups

    spec = TrainSpec(MODEL, 16, 2, 1, tp=2, cp=3, pp=2, dp=2)
    replica = spec.tp * spec.cp * spec.pp
    groups = dp_groups(replica, spec.dp, range(replica))
    for r in range(spec.world):
        t, c, s, d = spec.coords(r)
        assert spec.rank(t, c, s, d) == r == t + 2 * (c + 3 * (s + 2 * d))
        if d == 0:
            assert groups[r] == [spec.rank(t, c, s, dd) for dd in range(spec.dp)]
    assert [spec.rank(t, 1, 1, 0) for t in range(2)] == [8, 9]
    assert list(spec.stage_layers(0)) == [0] and list(spec.stage_layers(1)) == [1]
    # another placement: the simulator's placed order, and every rank once
    from simulator.training.placement import placed_order

    other = TrainSpec(MODEL, 16, 2, 1, tp=2, cp=3, pp=2, dp=2, placement=("pp", "tp", "dp", "cp"))
    order = placed_order({"tp": 2, "cp": 3, "pp": 2, "dp": 2}, ("pp", "tp", "dp", "cp"))
    assert [other.rank(*spec.coords(i)) for i in range(spec.world)] == order
    assert sorted(order) == list(range(spec.world)) and other.rank(0, 0, 1, 0) == 1  # stages adjacent


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_optimizer_equals_torchs(name: str) -> None:
    from simulator.distributed.train_optimizer import Optimizer

    g = torch.Generator().manual_seed(0)
    ours = [torch.randn(5, 3, generator=g, dtype=torch.float64) for _ in range(2)]
    theirs = [p.clone().requires_grad_(True) for p in ours]
    opt = Optimizer(name, ours, 1e-2)
    ref = torch.optim.Adam(theirs, lr=1e-2) if name == "adam" else torch.optim.SGD(theirs, lr=1e-2, momentum=0.9)
    for _ in range(3):
        grads = [torch.randn(5, 3, generator=g, dtype=torch.float64) for _ in ours]
        for p, q, gr in zip(ours, theirs, grads, strict=True):
            p.grad, q.grad = gr.clone(), gr.clone()
        opt.step()
        ref.step()
    for p, q in zip(ours, theirs, strict=True):
        assert torch.allclose(p, q.detach(), rtol=1e-12, atol=1e-14)


SCENARIO = """
name: real-train
topology: cluster
topology_params: {nodes: 1, gpus_per_node: 2}
workload:
  kind: train
  model: {layers: 2, hidden: 16, heads: 4, kv_heads: 2, head_dim: 4, intermediate: 24, vocab: 32}
  sequence: 16
  sequences: 4
  dtype: fp64
  parallel: {tp: 1, cp: 2, pp: 1, dp: 1, cp_algorithm: ring, layout: zigzag}
  recompute: selective
sweep:
  workload.parallel:
    - {tp: 1, cp: 2, pp: 1, dp: 1, cp_algorithm: ring, layout: zigzag}
    - {tp: 1, cp: 1, pp: 2, dp: 1}
"""


def _scenario(tmp_path: Any, text: str = SCENARIO) -> str:
    path = tmp_path / "t.yaml"
    path.write_text(text.lstrip())
    return str(path)


def test_validate_runs_train_points_and_compares_with_the_prediction(tmp_path: Any, capsys: Any) -> None:
    import pandas as pd

    from simulator.cli import main

    out = tmp_path / "o"
    rc = main(["validate", _scenario(tmp_path), "--procs", "2", "--iters", "4", "--warmup", "1", "-o", str(out),
               "--timeout", "120"])
    assert rc == 0, capsys.readouterr().err
    df = pd.read_csv(out / "validation.csv")
    assert len(df) == 2 and (df["phase"] == "train-step").all() and list(df["pp"]) == [1, 2]
    assert (df["grad_max_rel_err"] < REL).all() and (df["loss_abs_err"] < 1e-12).all()
    assert (df["measured_s"] > 0).all() and (df["predicted_s"] > 0).all() and df["floor_pct"].notna().all()
    assert (df["predicted_bubble_frac"] > 0).tolist() == [False, True]
    summary = (out / "summary.md").read_text()
    assert "training steps (2)" in summary and "floor of identical runs" in summary


@pytest.mark.parametrize(("edit", "where"), [
    (("recompute: selective", "recompute: none"), ":11: workload.recompute: a real step's attention backward"),
    (("dtype: fp64", "dtype: bf16"), ":9: workload.dtype: a real step runs in fp64 or fp32"),
    (("vocab: 32", "vocab: 33"), ":6: workload.model: heads, kv_heads, intermediate and vocab must divide by tp"),
    (("sequences: 4", "sequences: 4\n  zero: 1"), ":9: workload.zero: a real step runs ZeRO 0"),
])
def test_validate_refuses_what_a_real_step_does_not_run(tmp_path: Any, capsys: Any, edit: tuple[str, str],
                                                       where: str) -> None:
    from simulator.cli import main

    text = SCENARIO.replace(*edit).replace("    - {tp: 1, cp: 1, pp: 2, dp: 1}\n", "")
    if "vocab: 33" in text:
        text = text.replace("tp: 1, cp: 2", "tp: 2, cp: 1")
    out = tmp_path / "o"
    assert main(["validate", _scenario(tmp_path, text), "--procs", "2", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and where in err and err.startswith("treering: error: "), err
    assert not out.exists()


def test_validate_refuses_a_train_layout_of_other_ranks(tmp_path: Any, capsys: Any) -> None:
    from simulator.cli import main

    assert main(["validate", _scenario(tmp_path), "--procs", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err == "treering: error: --procs: the layout needs tp x cp x pp x dp = 1 x 2 x 1 x 1 = 2 ranks, got 4"


@pytest.mark.parametrize(("algorithm", "layout"),
                         [("ring", "zigzag"), ("allgather", "striped"), ("ulysses", "contiguous")])
def test_own_rows_give_the_runner_the_buffers_of_the_whole_sequence(algorithm: str, layout: str) -> None:
    """A training step's attention hands the runner only its rank's rows (``own_rows``): the rank's initial buffers
    equal those taken from whole-sequence tensors, and no other row can be read (no process group needed)."""
    import dataclasses

    import numpy as np

    from simulator.algorithms import Layout
    from simulator.algorithms.prefill import build_prefill
    from simulator.distributed.runner import PrefillRankRunner
    from simulator.kernels.payload import transfer_layouts
    from simulator.numeric.prefill import PrefillInputs
    from simulator.workloads.layouts import positions
    from simulator.workloads.prefill_shape import PrefillShape

    shape = PrefillShape(batch=2, heads=4, head_dim=3, kv_heads=2, sequence=19, dtype="fp64", causal=True,
                         layout=layout, backward=True)
    g = torch.Generator().manual_seed(0)
    whole = [torch.randn(2, h, 19, 3, generator=g, dtype=torch.float64) for h in (4, 2, 2, 4)]
    for backward in (False, True):
        sched = build_prefill(algorithm, {}, dataclasses.replace(shape, backward=backward), Layout((0, 0)))
        layouts = transfer_layouts(sched, sched.meta["shape"])
        for rank in range(2):
            pos = torch.from_numpy(positions(sched.meta["runs"][rank]))
            rows = [x[:, :, pos].contiguous() for x in whole]
            want = PrefillRankRunner(sched, PrefillInputs(whole[0], whole[1], whole[2], whole[3], 0.5, True), rank,
                                     layouts)
            got = PrefillRankRunner(sched, PrefillInputs(rows[0], rows[1], rows[2], rows[3], 0.5, True), rank,
                                    layouts, own_rows=True)
            assert want.buf[rank].keys() == got.buf[rank].keys() and got.buf[rank]
            for name, blk in want.buf[rank].items():
                assert np.array_equal(blk.pos, got.buf[rank][name].pos)
                assert all(torch.equal(a, b) for a, b in zip(blk.arrays, got.buf[rank][name].arrays, strict=True))
            with pytest.raises(IndexError):
                got.inp.q[:, :, np.arange(19)]
