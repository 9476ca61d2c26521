"""Prefill on a cached prefix (issue 42): numeric mode exact against dense attention, FLOPs and transfer volumes of
pass-KV (``ring``) and pass-Q (``ring-q``) against their closed forms, the launches' pairs against the layouts'
counts, ``cached: 0`` as the plain prefill, memory holding the cache, and the refusals."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import pytest

from simulator.algorithms import Layout
from simulator.algorithms.prefill import build_prefill
from simulator.algorithms.prefill.rule import pass_volumes
from simulator.cli import main
from simulator.kernels.launches import launch_matrix, prefix_launch_matrix
from simulator.kernels.tiles import Launch, launch_pairs
from simulator.models.presets import PRESETS
from simulator.models.step import prefill_model
from simulator.numeric.prefill import make_prefill_inputs, run_prefill_numeric
from simulator.run.prepared import cluster_for
from simulator.run.scenario import load_scenario
from simulator.workloads.layouts import LAYOUTS, layout_runs, pair_matrix, positions, prefix_runs, run_tokens
from simulator.workloads.prefill_shape import PrefillShape

HEADS, HEAD_DIM, BATCH = 4, 8, 2
SCHEDULES = ("ring", "ring-q", "single", "auto")


def _shape(n: int, cached: int, layout: str, kv: int = 2, causal: bool = True, dtype: str = "fp64") -> PrefillShape:
    return PrefillShape(BATCH, HEADS, HEAD_DIM, kv, n, dtype, causal, layout, False, cached=cached)


def _sends(sched, prefix: str = "") -> float:
    return sum(op.nbytes for op in sched.ops if op.kind == "send" and op.name.startswith(prefix))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("name", SCHEDULES)
def test_cached_prefix_prefill_equals_dense_fp64(name, p, layout):
    n = 2 * p + 3
    for cached in (1, 2 * p + 1, 5 * n):  # fewer cached tokens than ranks, uneven, mostly cached
        for kv, causal in ((HEADS, True), (2, True), (1, True), (2, False)):
            shape = _shape(n, cached, layout, kv, causal)
            sched = build_prefill(name, {}, shape, Layout((0,) * p))
            inp = make_prefill_inputs(np.random.default_rng(cached), BATCH, HEADS, kv, HEAD_DIM, cached + n, causal)
            assert run_prefill_numeric(sched, inp).max_abs_err < 1e-12, (name, p, layout, cached, kv, causal)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
def test_flops_and_volumes_equal_their_closed_forms(layout, causal):
    p, n, cached = 4, 37, 501
    shape = _shape(n, cached, layout, causal=causal, dtype="bf16")
    pairs = n * cached + n * (n + 1) // 2 if causal else n * (cached + n)  # per head
    kv_elem = 2 * BATCH * 2 * HEAD_DIM * 2  # K and V, 2 KV heads, bf16: bytes per token
    q_elem = BATCH * HEADS * HEAD_DIM * 2
    state = BATCH * HEADS * (HEAD_DIM + 2) * 2  # o, l, m of one row
    for name in ("ring", "ring-q", "single"):
        sched = build_prefill(name, {}, shape, Layout((0, 0, 1, 1)))
        flops = sum(op.flops for op in sched.ops if op.fn == "attn-fwd")
        assert flops == 4 * BATCH * HEADS * HEAD_DIM * pairs
    ring = build_prefill("ring", {}, shape, Layout((0, 0, 1, 1)))
    assert _sends(ring) == (p - 1) * (cached + n) * kv_elem  # every shard, cache and all, to the 3 others
    ring_q = build_prefill("ring-q", {}, shape, Layout((0, 0, 1, 1)))
    assert _sends(ring_q, "q[") == (p - 1) * n * q_elem
    assert _sends(ring_q, "partial[") == (p - 1) * n * state  # every new row sees every rank's cache
    v = pass_volumes(shape, p)
    assert (v.pass_kv, v.queries, v.partials) == (_sends(ring), _sends(ring_q, "q["), _sends(ring_q, "partial["))


def test_the_engine_moves_the_closed_form_bytes(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""
        name: s
        topology: dgx-h100
        topology_params: {nodes: 2}
        workload: {kind: prefill, model: llama-3.1-8b, sequence: 2000, cached: 30000}
        algorithms: [ring, ring-q]
        """))
    out = tmp_path / "o"
    assert main(["run", str(path), "-o", str(out), "--no-report", "--jobs", "1"]) == 0
    rows = pd.read_csv(out / "results.csv").set_index("algorithm")
    v = pass_volumes(PrefillShape(1, 32, 128, 8, 2000, "bf16", cached=30000), 16)
    assert rows.loc["ring", "bytes_moved"] == pytest.approx(v.pass_kv, rel=1e-12)
    assert rows.loc["ring-q", "bytes_moved"] == pytest.approx(v.pass_q, rel=1e-12)
    assert (rows["cached"] == 30000).all()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cached", [0, 3, 40])
def test_prefix_launches_see_exactly_the_blocks_pairs(layout, causal, cached):
    p, n = 4, 29
    runs, keys = prefix_runs(layout, cached, n, p)
    want = pair_matrix(runs, causal, keys)
    arrays = prefix_launch_matrix(layout, runs, keys, causal)
    for r in range(p):
        for j in range(p):
            got = sum(launch_pairs(Launch(*(int(a[r, j]) for a in arrays[i:i + 3]))) for i in (0, 3))
            if want[r, j]:
                assert got == want[r, j], (r, j)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_prefix_is_the_plain_layout(layout):
    runs = layout_runs(layout, 41, 4)
    q, k = prefix_runs(layout, 0, 41, 4)
    assert q == runs and k == runs
    assert (pair_matrix(runs, True, runs) == pair_matrix(runs, True)).all()
    plain = launch_matrix(layout, runs, True)
    prefixed = prefix_launch_matrix(layout, runs, runs, True)
    assert all((a == b).all() for a, b in zip(plain, prefixed[:3], strict=True)) and not prefixed[3].any()
    shape = _shape(41, 0, layout)
    sched = build_prefill("ring", {}, shape, Layout((0, 0, 1, 1)))
    assert "kv_runs" not in sched.meta and shape.total_pairs == 41 * 42 // 2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_cache_is_sharded_by_the_layout(layout):
    """Rank r holds the cache of its share of positions 0..C-1 under the layout, then its new positions."""
    cached, n, p = 50, 23, 4
    runs, keys = prefix_runs(layout, cached, n, p)
    old = layout_runs(layout, cached, p)
    for r in range(p):
        kpos = positions(keys[r])
        assert list(kpos[:run_tokens(old[r])]) == list(positions(old[r]))
        assert list(kpos[run_tokens(old[r]):]) == list(positions(runs[r])) == list(positions(layout_runs(
            layout, n, p)[r]) + cached)
    assert sorted(int(x) for r in range(p) for x in positions(keys[r])) == list(range(cached + n))


def test_memory_holds_the_cached_kv(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\ntopology: dgx-h100\nworkload: {kind: prefill, model: llama-3.1-8b, scope: model, "
                    "tp: 8, sequence: 4096}\nalgorithms: [ring]\n")
    cluster = cluster_for(load_scenario(str(path))[0])
    model = PRESETS["llama-3.1-8b"]
    plain = PrefillShape(1, 32, 128, 8, 4096, "bf16")
    cached = PrefillShape(1, 32, 128, 8, 4096, "bf16", cached=100_000)
    a = prefill_model(model, "ring", {"overlap": True}, plain, 8, cluster)
    b = prefill_model(model, "ring", {"overlap": True}, cached, 8, cluster)
    per_layer = 2 * 100_000 * 1 * 128 * 2  # K and V of the cache, 1 KV head per GPU (tp 8), bf16
    assert min(y - x for x, y in zip(a.peaks, b.peaks, strict=True)) >= model.layers * per_layer
    sched = build_prefill("ring", {}, PrefillShape(1, 32, 128, 8, 4096, "bf16", cached=100_000),
                          Layout((0, 0, 1, 1)))
    assert sum(sched.initial[r]["kv"] for r in range(4)) == 2 * (100_000 + 4096) * 8 * 128 * 2


@pytest.mark.parametrize(("workload", "message"), [
    ("{kind: prefill, model: llama-3.1-8b, sequence: 4096, cached: 1000, backward: true}",
     "s.yaml:3: workload: cached (1000 tokens) is a prefill on a KV cache, forward only"),
    ("{kind: prefill, model: llama-3.1-8b, sequence: 4096, cached: 1000}\nalgorithms: [ulysses]",
     "s.yaml:3: workload.cached: ulysses does not prefill on a cached prefix"),
    ("{kind: prefill, model: llama-3.1-8b, sequence: 4096, cached: -1}",
     "s.yaml:3: workload.cached:"),
])
def test_refusals_are_one_located_line(tmp_path, capsys, workload, message):
    path = tmp_path / "s.yaml"
    algos = "" if "algorithms" in workload else "\nalgorithms: [ring]"
    path.write_text(f"name: s\ntopology: dgx-h100\nworkload: {workload}{algos}\n")
    assert main(["run", str(path), "-o", str(tmp_path / "o"), "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def _real_rank(rank: int, world: int, store: str, out: str) -> None:
    """One process of a real (gloo) run of pass-KV and pass-Q on a cached prefix, against torch autograd."""
    import json

    import torch
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
    for i, (layout, name) in enumerate((lay, nm) for lay in LAYOUTS for nm in ("ring", "ring-q")):
        shape = _shape(4 * world + 3, 9, layout)
        inp = make_prefill_inputs(np.random.default_rng(i), BATCH, HEADS, 2, HEAD_DIM, shape.keys, True)
        sched = build_prefill(name, {}, shape, Layout((0,) * world))
        gathered = gather_results(sched, run_prefill_rank(sched, to_torch(inp, device), device))
        if gathered is not None:
            results.append((layout, name, check_outputs(sched, gathered, torch_reference(inp)).max_abs_err))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def test_real_runs_on_a_cached_prefix_equal_torch_autograd(tmp_path):
    import json

    pytest.importorskip("torch")
    import torch.multiprocessing as mp

    out = tmp_path / "results.json"
    mp.start_processes(_real_rank, args=(2, str(tmp_path / "store"), str(out)), nprocs=2, join=True,
                       start_method="spawn")
    results = json.loads(out.read_text())
    assert len(results) == 2 * len(LAYOUTS)
    assert all(err < 1e-10 for _, _, err in results), results
