"""What makes plans fast gives the same floats: schedules combined as columns (ids and ranks shifted) are the ops
combined one by one; an attention layer builds each head group's schedule once per set of servers; a dense layer on
alike servers built on the first only (:func:`simulator.models.step.dense_on_one_server`) simulates to the whole
layer's makespan, critical rank and compute; a whole decode step and prefill are unchanged in what plans read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from simulator.algorithms import Layout, build_schedule, resolve
from simulator.algorithms.prefill import PREFILL_REGISTRY
from simulator.cli import main
from simulator.cluster import load_topology
from simulator.cluster.symmetry import server_size
from simulator.cluster.topology import Cluster
from simulator.engine.core import simulate
from simulator.models.presets import PRESETS
from simulator.models.step import attention_layer, dense_layer, dense_on_one_server, model_step, prefill_model
from simulator.plan.decode import PlanRequest, _row, _Search, _search_tp, plan, tp_candidates
from simulator.plan.search import Search, TtftRequest
from simulator.plan.ttft import _base
from simulator.schedule.core import Schedule
from simulator.schedule.oplist import Indexed
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.shape import DecodeShape

MODEL = PRESETS["llama-3.1-70b"]


def _decode(context: int = 1 << 20) -> DecodeShape:
    return DecodeShape(batch=1, heads=MODEL.heads, head_dim=MODEL.head_dim, kv_heads=MODEL.kv_heads,
                       context=context, dtype="bf16")


def _combined_op_by_op(parts: list[tuple[Schedule, list[str]]]) -> list:
    """Schedule.combine's ops as it made them before: each op's ``_replace``."""
    out, rank_off, id_off = [], 0, 0
    for sched, _ in parts:
        for op in sched.ops:
            out.append(op._replace(
                id=op.id + id_off, rank=op.rank + rank_off, deps=tuple(d + id_off for d in op.deps),
                peer=None if op.peer is None else op.peer + rank_off,
                root=None if op.root is None else op.root + rank_off,
                match=None if op.match is None else op.match + id_off))
        rank_off += sched.ranks
        id_off += len(sched.ops)
    return out


def _mixed(ranks: int, root: object) -> Schedule:
    """A schedule of every kind of segment: tuples, a transfer block, a compute block and an OpBlock with roots."""
    s = Schedule(ranks)
    a = s.add_compute(0, "k", flops=1e9, nbytes=1e6, dtype="bf16")
    s.add_transfer(0, 1, 1e6, "t", send_deps=[a], coll="c")
    s.add_launch(1, "l", root=0, fn="broadcast")
    first = s.add_transfers([0, 1], [1, 2], [1e3, 2e3], ["x", "y"], [(a,), ()], [(), (a,)], coll="c")
    s.add_computes([1, 2], ["m", "m"], [1.0, 2.0], [3.0, 4.0], [(), ()], [(first + 1,), (first + 3,)])
    kinds = np.array([4, 2, 3, 0], dtype=np.uint8)  # launch, send, recv, compute
    s.add_ops(kinds, np.array([0, 0, 2, 2]), [(), (len(s.ops),), (), (len(s.ops) + 2,)],
              np.array([-1, len(s.ops) + 2, len(s.ops) + 1, -1]), root=root, nbytes=np.array([0, 5.0, 5.0, 0]))
    return s


@pytest.mark.parametrize("root", [1, None, np.array([0, 1, 2, 0]), Indexed([None, 2], np.array([0, 1, 1, 0]))])
def test_combine_shifts_every_segment_as_op_by_op(root):
    cluster = load_topology("dgx-h100", {"nodes": 2})
    gpus = list(cluster.ranks)
    parts = [(_mixed(3, root), gpus[k:k + 3]) for k in (0, 3, 6)]
    combined = Schedule.combine(parts)
    assert list(combined.ops) == _combined_op_by_op(parts)
    assert combined.placement == tuple(gpus[:9])
    ref = Schedule(9, ops=_combined_op_by_op(parts), placement=combined.placement)  # the engine reads the same
    a, b = simulate(combined, cluster), simulate(ref, cluster)
    assert (a.makespan, a.events, a.bytes_sent()) == (b.makespan, b.events, b.bytes_sent())


@pytest.mark.parametrize("algorithm", ["ring", "tree", "tree-p2p"])
@pytest.mark.parametrize("tp", [2, 8])
def test_attention_layer_builds_a_schedule_once_per_servers(algorithm, tp):
    cluster = load_topology("dgx-h100", {"nodes": 3})
    name, params = resolve(algorithm, field="algorithms.0")
    layer = attention_layer(name, params, _decode(), tp, cluster)
    part = dataclasses.replace(_decode(), heads=MODEL.heads // tp, kv_heads=max(1, MODEL.kv_heads // tp))
    parts = []
    for j in range(tp):  # each head group's schedule built on its own, as before
        nodes = [cluster.ranks[g * tp + j] for g in range(len(cluster.ranks) // tp)]
        sched = build_schedule(name, params, part, Layout(cluster.host_indices(nodes)))
        parts.append((sched, nodes[:sched.ranks]))
    assert list(layer.ops) == _combined_op_by_op(parts)
    assert layer.placement == tuple(n for _, nodes in parts for n in nodes)


def _same_run(a, b) -> None:
    assert (a.makespan, a.critical_rank(), a.critical_split()) == (b.makespan, b.critical_rank(), b.critical_split())


@pytest.mark.parametrize(("topology", "nodes"), [("dgx-h100", 2), ("dgx-h100", 7), ("hgx-b200", 3), ("mi300x", 2),
                                                 ("dgx-a100", 4)])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_dense_layer_on_one_of_alike_servers_is_the_whole_layer(topology, nodes, tp):
    cluster = load_topology(topology, {"nodes": nodes})
    gpn = server_size(cluster)
    assert gpn == len(cluster.ranks) // nodes
    full = dense_layer(MODEL, _decode(), tp, cluster)
    with dense_on_one_server():
        one = dense_layer(MODEL, _decode(), tp, cluster)
    assert len(one.ops) * nodes == len(full.ops)  # the first server's ops only
    assert set(op.rank for op in one.ops) == set(range(gpn))
    _same_run(simulate(full, cluster), simulate(one, cluster))


def test_dense_layer_on_servers_unlike_or_uneven_is_built_whole():
    cluster = load_topology("dgx-h100", {"nodes": 3})
    graph = cluster.graph.copy()
    graph.edges["n2.gpu3", "n2.nvswitch"]["bandwidth"] /= 2  # one link of the last server is slower
    slower = dataclasses.replace(cluster, graph=graph)
    assert server_size(cluster) == 8 and server_size(slower) is None
    for c, rows in ((slower, None), (cluster, [1] * 8 + [2] * 16)):  # or its servers transform other rows
        with dense_on_one_server():
            whole = dense_layer(MODEL, _decode(), 8, c, rows=rows)
        assert list(whole.ops) == list(dense_layer(MODEL, _decode(), 8, c, rows=rows).ops)
        assert {op.rank for op in whole.ops} == set(range(24))
    one_node = load_topology("dgx-h100", {"nodes": 1})
    assert server_size(one_node) is None  # one server: nothing to leave out


def test_servers_sharing_host_cores_are_never_alike():
    cluster = load_topology("dgx-h100", {"nodes": 2})
    shared = dataclasses.replace(cluster, host_cores={"n0": 4, "n1": 4})
    assert isinstance(shared, Cluster) and server_size(shared) is None


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
@pytest.mark.parametrize("tp", [2, 8])
def test_a_decode_step_is_the_same_for_the_plan(algorithm, tp):
    cluster = load_topology("dgx-h100", {"nodes": 4})
    name, params = resolve(algorithm, field="algorithms.0")
    full = model_step(MODEL, name, params, _decode(), tp, cluster)
    with dense_on_one_server():
        fast = model_step(MODEL, name, params, _decode(), tp, cluster)
    for key in ("latency_s", "compute_s", "peaks", "dense_s", "attention_s", "attention_compute_s", "head_s"):
        assert getattr(fast, key) == getattr(full, key), key


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_a_whole_prefill_is_the_same_for_the_plan(layout):
    cluster = load_topology("dgx-h100", {"nodes": 3})
    shape = PrefillShape(batch=1, heads=MODEL.heads, head_dim=MODEL.head_dim, kv_heads=MODEL.kv_heads,
                         sequence=48 * 1024, dtype="bf16", causal=True, layout=layout)
    name, params = resolve("ring", field="algorithms.0", registry=PREFILL_REGISTRY)
    full = prefill_model(MODEL, name, params, shape, 4, cluster)
    with dense_on_one_server():
        fast = prefill_model(MODEL, name, params, shape, 4, cluster)
    for key in ("latency_s", "compute_s", "peaks", "dense_s", "attention_s", "attention_compute_s", "head_s"):
        assert getattr(fast, key) == getattr(full, key), key


def test_a_dense_layer_reads_neither_context_nor_sequence_nor_layout():
    # the planners' memo shares one dense layer between steps and layouts that differ only there (step._DENSE_BLIND)
    cluster = load_topology("dgx-h100", {"nodes": 2})
    decode = [dense_layer(MODEL, _decode(context), 4, cluster) for context in (1 << 10, 1 << 20)]
    assert list(decode[0].ops) == list(decode[1].ops)
    rows = [300] * 16
    prefill = [dense_layer(MODEL, PrefillShape(batch=1, heads=MODEL.heads, head_dim=MODEL.head_dim,
                                               kv_heads=MODEL.kv_heads, sequence=seq, dtype="bf16", layout=layout),
                           4, cluster, rows=rows, elementwise=True)
               for seq, layout in ((4800, "zigzag"), (9600, "contiguous"))]
    assert list(prefill[0].ops) == list(prefill[1].ops)


def test_one_memo_across_layouts_and_strategies_gives_each_its_own_floats():
    cluster = load_topology("dgx-h100", {"nodes": 2})
    memo: dict = {}
    for layout in ("zigzag", "contiguous"):
        for strategy in ("ring", "allgather"):
            shape = PrefillShape(batch=1, heads=MODEL.heads, head_dim=MODEL.head_dim, kv_heads=MODEL.kv_heads,
                                 sequence=32 * 1024, dtype="bf16", causal=True, layout=layout)
            name, params = resolve(strategy, field="algorithms.0", registry=PREFILL_REGISTRY)
            with dense_on_one_server(memo):
                fast = prefill_model(MODEL, name, params, shape, 4, cluster)
            full = prefill_model(MODEL, name, params, shape, 4, cluster)
            assert (fast.latency_s, fast.compute_s, fast.peaks, fast.dense_s) == \
                (full.latency_s, full.compute_s, full.peaks, full.dense_s)
    assert sum(key[0] == "dense" for key in memo) == 1  # one dense layer for all four


def test_the_decode_plan_bounded_by_its_best_answers_as_the_whole_search(capsys):
    # tp 8 meets 30 ms on one node (8 GPUs); tp 4 and 2 need two nodes' memory at least: not searched
    req = PlanRequest(model="llama-3.1-70b", context=1 << 20, tbt_s=0.03, topology="dgx-h100",
                      algorithms=["tree"], max_nodes=4)
    (row,) = plan(req)
    assert row.met and row.best is not None and (row.best.nodes, row.best.tp) == (1, 8)
    assert (row.evaluated, row.space) == (1, 4 * 4)
    whole = _Search(req, None)  # every tp searched in full, in order, as before the bound
    found, fit_at = [], {}
    for tp in tp_candidates(8, 64, 8):
        evs, n_fit = _search_tp(whole, "tree", tp, 8)
        found += evs
        if n_fit is not None:
            fit_at[tp] = n_fit
    unbounded = _row("tree", found, fit_at, req, len(whole.cache))
    assert (unbounded.best, unbounded.binding, unbounded.met) == (row.best, row.binding, row.met)
    assert unbounded.evaluated > row.evaluated
    assert main(["plan", "--model", "llama-3.1-70b", "--context", "1M", "--tbt", "30ms", "--algorithms", "tree",
                 "--max-nodes", "4"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "(simulated 1 of 16 configurations)"


def test_a_ttft_count_of_nodes_is_judged_as_from_every_configuration(tmp_path):
    # plan-ttft.yaml: tp 2 holds 70.6 GB of weights per GPU, and with 1/4 of the prompt's KV cache on one node it is
    # over 72 GB on every layout: not simulated; whether a count meets is any() of all its configurations
    req = TtftRequest(scenario=str(Path(__file__).parent.parent / "scenarios" / "plan-ttft.yaml"), ttft_s=5.0,
                      tbt_s=0.02, max_nodes=2)
    s = Search(req, _base(req), None)
    assert s.cannot_fit(1, 2) and not s.cannot_fit(1, 4)
    assert all(c.oom for c in s.at(1, [2]))
    for nodes in (1, 2):
        assert s.meets_at(nodes, [2, 4, 8]) == any(map(s.meets, s.at(nodes, [2, 4, 8])))


@pytest.mark.parametrize(("model", "context", "tbt_s", "max_nodes"), [
    ("llama-3.1-8b", 1 << 20, 4.5e-3, 6), ("llama-3.1-8b", 1 << 20, 9e-3, 6), ("llama-3.1-8b", 4 << 20, 6e-3, 8),
    ("llama-3.1-70b", 4 << 20, 40e-3, 8)])
def test_the_bound_never_changes_an_answer(model, context, tbt_s, max_nodes):
    req = PlanRequest(model=model, context=context, tbt_s=tbt_s, topology="dgx-h100", algorithms=["tree", "ring"],
                      max_nodes=max_nodes)
    rows = plan(req)
    whole = _Search(req, None)
    preset = PRESETS[model]
    for row in rows:
        found, fit_at = [], {}
        for tp in tp_candidates(8, preset.heads, preset.kv_heads):
            evs, n_fit = _search_tp(whole, row.algorithm, tp, 8)
            found += evs
            if n_fit is not None:
                fit_at[tp] = n_fit
        unbounded = _row(row.algorithm, found, fit_at, req, 0)
        assert (unbounded.best, unbounded.binding, unbounded.met) == (row.best, row.binding, row.met)
