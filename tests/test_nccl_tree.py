"""NCCL's tree allreduce as NCCL pipelines it (chunks reduced up and broadcast down at once, on a double binary
tree): NCCL's trees, the closed form, the data, the choice."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from conftest import ZERO_COMPUTE

from simulator.cluster.topology import Cluster, build_cluster, load_topology
from simulator.collectives import channels, collective, fabric_of, nccl_tree
from simulator.collectives.caps import fabric_cap
from simulator.collectives.channels import Choice
from simulator.collectives.nccl_tree import btree_parent, channel_trees, dtree_parents, tree_chunks, tree_step
from simulator.collectives.protocols import base_latency, forward_grain, hop_latency, wire_factor
from simulator.collectives.tuner import predict
from simulator.engine.core import simulate
from simulator.numeric.decode import Executor, make_inputs
from simulator.schedule.core import Schedule

REL = 1e-9
MiB = 1 << 20


def line(bws: list[float], device: dict[str, Any] | None = None, lat: str = "0 s",
         overhead: str = "0 s") -> Cluster:
    """GPUs of one server in a line, a full-duplex link of ``bws[i]`` bytes/s between GPU i and i + 1 (and, as no
    route passes through a GPU, a slow host that joins the others: no route of the tree takes it)."""
    raw: dict[str, Any] = {
        "devices": {"gpu": device or ZERO_COMPUTE}, "name": "line", "message_overhead": overhead,
        "nodes": [*({"name": f"n0.gpu{i}", "kind": "gpu", "device": "gpu"} for i in range(len(bws) + 1)),
                  {"name": "n0.host", "kind": "cpu"}],
        "links": [*({"a": f"n0.gpu{i}", "b": f"n0.gpu{i + 1}", "bandwidth": bw, "latency": lat, "class": "nvlink"}
                    for i, bw in enumerate(bws)),
                  *({"a": f"n0.gpu{i}", "b": "n0.host", "bandwidth": "1 GB/s", "latency": "1 ms", "class": "pcie"}
                    for i in range(len(bws) + 1))],
    }
    return build_cluster(raw, "<line>")


def mesh(p: int, bw: float) -> Cluster:
    raw: dict[str, Any] = {
        "devices": {"zero": ZERO_COMPUTE}, "name": "mesh",
        "nodes": [{"name": f"n0.gpu{i}", "kind": "gpu", "device": "zero"} for i in range(p)],
        "links": [{"a": f"n0.gpu{a}", "b": f"n0.gpu{b}", "bandwidth": bw, "latency": "0 s", "class": "nvlink"}
                  for a in range(p) for b in range(a + 1, p)],
    }
    return build_cluster(raw, "<mesh>")


def tree(cluster: Cluster, n: int, protocol: str, channels: int | None = 1, elem_bytes: int = 1,
         dtype: str = "fp32") -> tuple[float, float, Choice]:
    """(simulated, predicted) seconds of NCCL's tree allreduce of ``n`` elements, and the choice that ran."""
    fabric = fabric_of(cluster)
    p = len(cluster.ranks)
    sched = Schedule(p, placement=cluster.ranks)
    _, choice = collective(sched, "allreduce", list(range(p)), "x", n, fabric, algo="tree", protocol=protocol,
                           channels=channels, elem_bytes=elem_bytes, dtype=dtype, tag="ar", deps={})
    predicted = predict("allreduce", list(range(p)), n, choice, fabric, elem_bytes=elem_bytes, dtype=dtype)
    return simulate(sched, cluster).makespan, predicted, choice


def test_ncclS_binary_tree_and_its_mirror():
    """ncclGetBtree's illustration (src/graph/trees.cc, 14 ranks) and ncclGetDtree's two trees: every rank is
    interior in at most one of them (the double binary tree's point: a rank sends up at most one full half)."""
    assert [btree_parent(14, r) for r in range(14)] == [-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 12, 10, 8, 12]
    for n in range(2, 40):
        both = [dtree_parents(n, which) for which in (0, 1)]
        interior = []
        for parents in both:
            assert parents.count(-1) == 1
            kids = [parents.count(r) for r in range(n)]
            assert max(kids) <= 2
            interior.append({r for r in range(n) if kids[r] and parents[r] >= 0})
        assert not interior[0] & interior[1], n
    assert dtree_parents(4, 1) == [1, 3, 1, -1]  # the mirror of [-1, 2, 0, 2]


@pytest.mark.parametrize("protocol", ["LL", "LL128", "Simple"])
@pytest.mark.parametrize("nbytes", [3 * MiB // 2, 48 * MiB])
def test_uncontended_tree_on_a_mesh_is_the_pipeline_closed_form(protocol, nbytes):
    """One channel on 4 fully linked GPUs: a chain 0-1-2-3, up and down on the two directions of distinct links.
    NCCL's step 0 climbs 3 hops and comes down 3, each at the protocol's per-hop latency and bytes / bandwidth; the
    other S - 1 steps follow one step time apart (S: the message over NCCL's tree chunk with Simple, over the
    protocol's forwarding grain with LL and LL128, which pass lines on as they arrive inside a server)."""
    bw = 40e9
    got, predicted, choice = tree(mesh(4, bw), nbytes, protocol)
    assert choice == Choice("tree", protocol, 1)
    steps, _, head = tree_chunks(nbytes, tree_step(nbytes, 1, protocol, 1, 4), 1, forward_grain(protocol))
    assert steps == {(3 * MiB // 2, "Simple"): 3, (48 * MiB, "Simple"): 96, (3 * MiB // 2, "LL"): 6144,
                     (48 * MiB, "LL"): 196608, (3 * MiB // 2, "LL128"): 820}.get((nbytes, protocol), steps)
    assert head == {"Simple": 1, "LL": 128}.get(protocol, head)  # LL: 32 KiB steps of 256-byte grains
    step = nbytes / steps * wire_factor("tree", protocol) / bw
    want = base_latency("tree", protocol) + 6 * (hop_latency("tree", protocol, "nvlink") + step) \
        + (steps - 1) * step
    rel = REL if nbytes % steps == 0 else 1e-6  # steps whole elements: equal to the element
    assert math.isclose(got, want, rel_tol=rel)
    assert math.isclose(predicted, want, rel_tol=rel)


@pytest.mark.parametrize("protocol", ["LL", "Simple"])
def test_uncontended_tree_on_a_line_of_unequal_links_is_the_closed_form(protocol):
    """Five GPUs in a line, the last link the slowest, a message overhead on every transfer, a chunk per step (8
    steps: one op per step and connection): the first step pays every hop's latency floor (the overhead or the
    protocol's), the later ones follow at the slowest stage's bytes (their latency hidden: NCCL's steps in flight)."""
    bws = [50e9, 80e9, 30e9, 20e9]
    overhead = 2e-6
    nbytes = int(8 * tree_step(1 << 30, 1, protocol, 1, 5))
    got, predicted, _ = tree(line(bws, overhead="2 us"), nbytes, protocol)
    steps, chunks, _ = tree_chunks(nbytes, tree_step(nbytes, 1, protocol, 1, 5), 1, forward_grain(protocol))
    assert chunks == 8 and steps == (8 if protocol == "Simple" else 8 * 128)  # LL: a step is 128 grains
    size = nbytes / steps * wire_factor("tree", protocol)
    hop = max(overhead, hop_latency("tree", protocol, "nvlink"))
    want = (base_latency("tree", protocol) + 2 * sum(hop + size / bw for bw in bws)
            + (steps - 1) * size / min(bws))
    assert math.isclose(got, want, rel_tol=REL)
    assert math.isclose(predicted, want, rel_tol=REL)


@pytest.mark.parametrize("protocol", ["LL", "Simple"])
def test_the_tuner_prices_a_chunks_three_ops_as_the_engine_runs_them(protocol):
    """The same line with a message overhead and link latencies, and many steps a chunk: the tuner's longest path
    over a chunk's first, middle and last ops is the engine's time."""
    nbytes = 3 * 64 * 512 * 1024
    got, predicted, _ = tree(line([50e9, 80e9, 30e9, 20e9], overhead="2 us", lat="0.5 us"), nbytes, protocol)
    steps, chunks, _ = tree_chunks(nbytes, tree_step(nbytes, 1, protocol, 1, 5), 1, forward_grain(protocol))
    assert steps > 2 * chunks
    assert math.isclose(got, predicted, rel_tol=REL)


def test_reductions_are_a_stage_of_the_pipeline():
    """On a device whose memory is slower than the links, every rank's reduction of a step (reading two operands,
    writing one) paces the pipeline: the engine and the closed form agree."""
    slow = {**ZERO_COMPUTE, "mem_bw": "30 GB/s"}
    nbytes = 24 * MiB
    got, predicted, _ = tree(line([50e9, 50e9, 50e9], device=slow), nbytes, "Simple")
    steps, _, _ = tree_chunks(nbytes, tree_step(nbytes, 1, "Simple", 1, 4), 1)
    link = nbytes / steps / 50e9
    reduce = 3 * nbytes / steps / 30e9
    assert reduce > link
    # step 0 up 3 hops with a reduction after each, the others one reduction apart behind it at the root, the last
    # one down 3 hops (no per-hop latency: the pipeline is full)
    want = base_latency("tree", "Simple") + 3 * (hop_latency("tree", "Simple", "nvlink") + link + reduce) \
        + (steps - 1) * reduce + 3 * link
    assert math.isclose(got, want, rel_tol=REL)
    assert math.isclose(predicted, want, rel_tol=REL)


@pytest.mark.parametrize("case", ["line", "slow-memory", "two-servers"])
def test_a_chunks_first_middle_and_last_ops_run_as_its_steps_one_op_each(case, monkeypatch):
    """The split (simulator.collectives.steps) against simulating every NCCL step as an op of its own (the chunk
    bound lifted): the same makespan where stages run at their own pace and steps pay no fixed seconds (a line of
    unequal links; reductions slower than the links). On two servers of 4 GPUs (two trees, one channel) each rank's
    reductions of both trees share its compute stream, where a middle op holds it for all its steps at once:
    within 0.5 %."""
    if case == "line":
        cluster, n, elem = line([50e9, 80e9, 30e9, 20e9]), 12 * MiB, 1
    elif case == "slow-memory":
        cluster, n, elem = line([50e9, 50e9, 50e9], device={**ZERO_COMPUTE, "mem_bw": "30 GB/s"}), 9 * MiB, 1
    else:  # no fixed seconds on any link: every step would pay them, the three ops once each
        zero = {k: "0 s" for k in ("intra_latency", "pcie_latency", "nic_latency", "fabric_latency")}
        cluster, n, elem = load_topology("dgx-h100", {"nodes": 2, "gpus_per_node": 4, **zero}), 12 * MiB, 2
    split, _, _ = tree(cluster, n, "Simple", elem_bytes=elem)
    steps = math.ceil(n * elem / tree_step(n * elem, 1, "Simple", 2, 8))
    assert steps > 2 * tree_chunks(n * elem, tree_step(n * elem, 1, "Simple", 2, 8), 2)[1]  # middles ran
    monkeypatch.setattr(nccl_tree, "TREE_CHUNKS", 2 * steps)
    assert tree_chunks(n * elem, tree_step(n * elem, 1, "Simple", 2, 8), 2) == (steps, steps, 1)
    each, _, _ = tree(cluster, n, "Simple", elem_bytes=elem)
    assert math.isclose(split, each, rel_tol=5e-3 if case == "two-servers" else REL), (split, each)


@pytest.mark.parametrize("protocol", ["LL", "LL128"])
def test_ll_passes_lines_on_inside_a_server_and_whole_steps_across_servers(protocol, monkeypatch):
    """LL and LL128 carry a flag in every line: inside a server a rank forwards a warp's lines as they arrive, while
    across servers NCCL's proxy sends a step only once all of it is in (``sendProxyProgress``). So a network
    connection's first op of a chunk holds one NCCL step (what follows it waits for the whole step), a connection
    inside a server one grain; the tuner prices the same ops (two servers of two GPUs, one channel: nothing shared).
    The hold costs time (against the same grains without it), and forwarding whole steps everywhere costs more."""
    cluster = load_topology("dgx-h100", {"nodes": 2, "gpus_per_node": 2})
    fabric = fabric_of(cluster)
    p, n = len(cluster.ranks), 1 << 19  # 1 MiB of bf16

    def run() -> tuple[Schedule, float, Choice]:
        sched = Schedule(p, placement=cluster.ranks)
        _, choice = collective(sched, "allreduce", list(range(p)), "x", n, fabric, algo="tree", protocol=protocol,
                               channels=1, elem_bytes=2, dtype="bf16", tag="ar", deps={})
        return sched, simulate(sched, cluster).makespan, choice

    sched, got, choice = run()
    # a chunk of LL128 grains (274 of 1,920 bytes here) is not whole elements: the builder rounds its parts
    assert math.isclose(got, predict("allreduce", list(range(p)), n, choice, fabric, elem_bytes=2, dtype="bf16"),
                        rel_tol=1e-5)
    first: dict[tuple[int, int], float] = {}  # each connection's first send, in op order
    for op in sched.ops:
        if op.kind == "send":
            first.setdefault((op.rank, op.peer), op.nbytes)
    wire = wire_factor("tree", protocol)
    step = tree_step(2 * n, 1, protocol, 2, p)
    grain = forward_grain(protocol)
    assert grain is not None and step > grain
    for (a, b), nbytes in first.items():
        crosses = fabric.hosts[a] != fabric.hosts[b]
        want = math.ceil(step / grain) * grain if crosses else grain  # a step of whole grains, or one grain
        # LL's grains are whole elements (exact); LL128's parts are rounded to elements
        assert math.isclose(nbytes, want * wire, rel_tol=1e-12 if protocol == "LL" else 1e-2), (a, b, nbytes)
    assert {fabric.hosts[a] != fabric.hosts[b] for a, b in first} == {True, False}
    real = nccl_tree.grain_steps
    monkeypatch.setattr(nccl_tree, "grain_steps", lambda *args: (*real(*args)[:2], 1))  # no connection holds
    _, free, _ = run()
    assert got > 1.03 * free
    monkeypatch.setattr(channels, "forward_grain", lambda proto: None)  # whole steps everywhere (Simple's way)
    _, whole, _ = run()
    assert got < whole


def test_up_and_down_run_at_once():
    """NCCL's tree is one pipeline, not a reduce then a broadcast: on one NVSwitch server the chunks going up and
    those going down move at once, each direction at half the channel's cap (NCCL's tree cap, below the link's 300
    GB/s here: 0.92 of its search's speed), so the whole takes the payload at that rate (plus the fill), not twice as
    long as the sequential phases would."""
    cluster = load_topology("dgx-a100")
    n = 1 << 29
    got, predicted, _ = tree(cluster, n, "Simple", elem_bytes=2, dtype="bf16")
    cap = fabric_cap(fabric_of(cluster), "allreduce", "tree", "Simple", list(range(8)), 1)
    assert cap < 300e9
    assert n * 2 / (cap / 2) < got < 1.25 * n * 2 / (cap / 2)
    assert math.isclose(predicted, got, rel_tol=0.01)


@pytest.mark.parametrize(("nodes", "gpus"), [(3, 4), (2, 8)])
def test_tree_allreduce_computes_the_sum_across_servers(nodes, gpus):
    cluster = load_topology("dgx-h100", {"nodes": nodes, "gpus_per_node": gpus})
    p = len(cluster.ranks)
    fabric = fabric_of(cluster)
    trees = channel_trees(fabric, fabric.rings(list(range(p)), 1)[0], 0)
    assert len(trees) == 2 and trees[0].root != trees[1].root
    n = 40 * 1024 * 1024 // 8 + 5  # 40 MiB of fp64: several chunks per tree on every channel
    sched = Schedule(p, placement=cluster.ranks)
    collective(sched, "allreduce", list(range(p)), "x", n, fabric, algo="tree", protocol="Simple",
               elem_bytes=8, dtype="fp64", tag="ar", deps={})
    ex = Executor(sched, make_inputs(np.random.default_rng(0), 1, 1, 1, 1, 1))
    data = np.random.default_rng(p).standard_normal((p, n))
    want = data.sum(0)
    for r in range(p):  # its own row of data (rows do not overlap; copies would add 0.67 GB at 16 ranks)
        ex.buf[r]["x"] = data[r]
    del data
    ex.run(sched)
    for r in range(p):
        np.testing.assert_allclose(ex.buf[r]["x"], want, rtol=1e-12, atol=1e-12)


def test_auto_keeps_the_ring_for_a_large_allreduce_on_one_dgx_a100():
    """The defect this fixes: the tuner predicted the tree 2.2x faster than the schedule it emitted ran, so auto
    picked a tree that then reached half the ring's bus bandwidth."""
    cluster = load_topology("dgx-a100")
    n = 1 << 29
    ring, _ = simulate_choice(cluster, n, "ring")
    auto, choice = simulate_choice(cluster, n, "auto")
    assert choice.algo == "ring" and auto == ring
    tree_t, predicted, _ = tree(cluster, n, "Simple", elem_bytes=2, dtype="bf16")
    assert tree_t > ring and predicted > ring


def simulate_choice(cluster: Cluster, n: int, algo: str) -> tuple[float, Choice]:
    fabric = fabric_of(cluster)
    p = len(cluster.ranks)
    sched = Schedule(p, placement=cluster.ranks)
    _, choice = collective(sched, "allreduce", list(range(p)), "x", n, fabric, algo=algo, protocol="auto",
                           elem_bytes=2, dtype="bf16", tag="ar", deps={})
    return simulate(sched, cluster).makespan, choice


@pytest.mark.parametrize("nodes", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_predicted_tree_time_is_close_to_the_simulated_one_across_dgx_h100_nodes(nodes):
    """Where connections share links (both trees and 8 channels on every NVLink and NIC) the prediction is not
    exact: 1 MiB within 2 %, 1 GiB within 15 % (pessimistic: the shared links' bytes plus the whole fill and drain;
    benchmarks/nccl_tree.py)."""
    cluster = load_topology("dgx-h100", {"nodes": nodes})
    for n, tol in ((1 << 19, 0.02), (1 << 29, 0.15)):
        got, predicted, choice = tree(cluster, n, "Simple", channels=None, elem_bytes=2, dtype="bf16")
        assert choice.channels == 8
        assert abs(predicted / got - 1) <= tol, (n, got, predicted)
