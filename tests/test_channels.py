"""Collectives as NCCL runs them: channels, protocols, the auto choice, closed forms, data, memory."""

from __future__ import annotations

import math
import tracemalloc
from typing import Any

import numpy as np
import pytest
from conftest import ZERO_COMPUTE

from simulator.cluster.topology import Cluster, build_cluster, load_topology
from simulator.collectives import chunk_bounds, collective, fabric_of
from simulator.collectives.channels import Choice, build
from simulator.collectives.protocols import base_latency, forward_grain, hop_latency, step_payload, wire_factor
from simulator.collectives.tuner import candidates, predict
from simulator.engine.core import simulate
from simulator.errors import InputError
from simulator.numeric.decode import Executor, make_inputs
from simulator.schedule.core import Schedule

REL = 1e-9
BW = 50e9  # bytes/s per link direction


def mesh(p: int, bw: str = "50 GB/s", lat: str = "0 s", pairs: list[tuple[int, int]] | None = None) -> Cluster:
    """``p`` GPUs of one server (n0.gpu*), a direct full-duplex link between every pair (or only ``pairs``, and a
    slow host joining the GPUs, as no route passes through a GPU: no ring over the pairs takes it)."""
    host = pairs is not None
    pairs = pairs if pairs is not None else [(a, b) for a in range(p) for b in range(a + 1, p)]
    raw: dict[str, Any] = {
        "devices": {"zero": ZERO_COMPUTE}, "name": "mesh",
        "nodes": [{"name": f"n0.gpu{i}", "kind": "gpu", "device": "zero"} for i in range(p)],
        "links": [{"a": f"n0.gpu{a}", "b": f"n0.gpu{b}", "bandwidth": bw, "latency": lat, "class": "nvlink"}
                  for a, b in pairs],
    }
    if host:
        raw["nodes"].append({"name": "n0.host", "kind": "cpu"})
        raw["links"] += [{"a": f"n0.gpu{i}", "b": "n0.host", "bandwidth": "1 GB/s", "latency": "1 ms",
                          "class": "pcie"} for i in range(p)]
    return build_cluster(raw, "<mesh>")


def run(cluster: Cluster, operation: str, n: int, *, algo: str = "ring", protocol: str = "Simple",
        channels: int | None = None, elem_bytes: int = 1) -> tuple[float, Choice]:
    fabric = fabric_of(cluster)
    p = len(cluster.ranks)
    sched = Schedule(p, placement=cluster.ranks)
    _, choice = collective(sched, operation, list(range(p)), "x", n, fabric, algo=algo, protocol=protocol,
                           channels=channels, elem_bytes=elem_bytes, dtype="fp32", tag=operation, deps={})
    return simulate(sched, cluster).makespan, choice


@pytest.mark.parametrize("p", [4, 5, 8])
@pytest.mark.parametrize("protocol", ["LL", "LL128", "Simple"])
def test_ring_allreduce_over_disjoint_channels_is_the_closed_form(p, protocol):
    cluster = mesh(p)
    channels = fabric_of(cluster).default_channels(range(p))
    assert channels == {4: 2, 5: 4, 8: 7}[p]  # rings of distinct links: every link where the digraph allows
    arcs = [(a, b) for ring in fabric_of(cluster).rings(list(range(p)), channels)
            for a, b in zip(ring, [*ring[1:], ring[0]], strict=True)]
    assert len(arcs) == len(set(arcs)) == channels * p
    n = 1_000_000 * p * channels
    got, choice = run(cluster, "allreduce", n, protocol=protocol)
    assert choice == Choice("ring", protocol, channels)
    want = (base_latency("ring", protocol) + 2 * (p - 1) * hop_latency("ring", protocol, "nvlink")
            + 2 * (p - 1) / p * n * wire_factor("ring", protocol) / (channels * BW))
    assert math.isclose(got, want, rel_tol=REL)


def test_two_channels_forced_onto_one_link_take_twice_as_long_as_one():
    n = 4_000_000
    one, _ = run(mesh(2), "allreduce", n, channels=1)
    two, _ = run(mesh(2), "allreduce", n, channels=2)  # both rings over the one link
    latency = base_latency("ring", "Simple") + 2 * hop_latency("ring", "Simple", "nvlink")
    assert math.isclose(one - latency, n / BW, rel_tol=REL)
    assert math.isclose(two, one, rel_tol=REL)  # each channel moves half the bytes at half the rate
    # two channels on two distinct rings of a 4-GPU mesh against the same two on a ring of shared links
    p, n = 4, 8_000_000
    distinct, _ = run(mesh(p), "allreduce", n, channels=2)
    shared, _ = run(mesh(p, pairs=[(0, 1), (1, 2), (2, 3), (0, 3)]), "allreduce", n, channels=2)
    latency = base_latency("ring", "Simple") + 2 * (p - 1) * hop_latency("ring", "Simple", "nvlink")
    assert math.isclose(shared - latency, 2 * (distinct - latency), rel_tol=REL)


def test_default_channels_follow_nccls_search():
    h2 = fabric_of(load_topology("dgx-h100", {"nodes": 2}))
    assert h2.default_channels(range(16)) == 8  # one ring per NIC rail
    for ring in h2.rings(list(range(16)), 8):
        hops = list(zip(ring, [*ring[1:], ring[0]], strict=True))
        inter = [(a, b) for a, b in hops if h2.hosts[a] != h2.hosts[b]]
        assert len(inter) == 2 and all(h2.local[a] == h2.local[b] for a, b in inter)  # rail to rail
    sends = [h2.local[a] for ring in h2.rings(list(range(16)), 8)
             for a, b in zip(ring, [*ring[1:], ring[0]], strict=True) if h2.hosts[a] == 0 and h2.hosts[b] == 1]
    assert sorted(sends) == list(range(8))  # every NIC of the server sends for exactly one channel
    assert fabric_of(load_topology("mi300x")).default_channels(range(8)) == 7  # every xGMI link, both ways
    one = fabric_of(load_topology("dgx-h100"))
    assert one.default_channels(range(8)) == 1 and one.nvls and not fabric_of(load_topology("dgx-a100")).nvls


def test_auto_picks_ring_inside_a_node_and_tree_across_nodes_for_small_messages():
    assert run(load_topology("dgx-h100"), "allreduce", 16384, algo="auto", protocol="auto")[1].algo == "ring"
    small = run(load_topology("dgx-h100", {"nodes": 2}), "allreduce", 16384, algo="auto", protocol="auto")[1]
    assert (small.algo, small.protocol) == ("tree", "LL")


def test_auto_is_the_candidate_with_the_lowest_predicted_time():
    cluster = load_topology("dgx-h100", {"nodes": 2})
    fabric = fabric_of(cluster)
    for n in (1 << 12, 1 << 20, 1 << 26):
        options = candidates("allreduce", "auto", "auto", list(range(16)), fabric, None, n, switch=False)
        assert {c.algo for c in options} == {"ring", "tree"}
        best = min(options, key=lambda c: predict("allreduce", list(range(16)), n, c, fabric, elem_bytes=1))
        assert run(cluster, "allreduce", n, algo="auto", protocol="auto")[1] == best


def test_predicted_time_matches_the_simulated_ring():
    cluster = load_topology("dgx-h100", {"nodes": 2})
    fabric = fabric_of(cluster)
    for protocol in ("LL", "Simple"):
        t, choice = run(cluster, "allreduce", 1 << 20, protocol=protocol)
        assert math.isclose(predict("allreduce", list(range(16)), 1 << 20, choice, fabric, elem_bytes=1), t,
                            rel_tol=0.02)


@pytest.mark.parametrize("algo", ["ring", "tree", "hierarchical", "recursive-doubling", "double-binary-tree"])
def test_allreduce_with_channels_computes_the_sum(algo):
    cluster = load_topology("dgx-h100", {"nodes": 3, "gpus_per_node": 4})
    values = _numeric(cluster, "allreduce", algo, 4 * 12 * 3 + 5)
    for got in values["out"]:
        np.testing.assert_allclose(got, values["data"].sum(0), rtol=1e-13, atol=1e-13)


def test_reduce_scatter_allgather_broadcast_and_reduce_on_channels():
    cluster = load_topology("dgx-h100", {"nodes": 2, "gpus_per_node": 4})
    fabric = fabric_of(cluster)
    n = 8 * 4 * 8 + 3
    total = _numeric(cluster, "reduce-scatter", "ring", n)
    for c, (lo, hi) in enumerate(chunk_bounds(n, 4)):  # 4 channels: each reduces its share over its ring
        ring = fabric.rings(list(range(8)), 4)[c]
        for i, (a, b) in enumerate(chunk_bounds(hi - lo, 8)):
            np.testing.assert_allclose(total["out"][ring[i]][lo + a:lo + b], total["data"].sum(0)[lo + a:lo + b],
                                       rtol=1e-13)
    gathered = _numeric(cluster, "allgather", "ring", n)
    want = np.empty(n)
    for c, (lo, hi) in enumerate(chunk_bounds(n, 4)):
        ring = fabric.rings(list(range(8)), 4)[c]
        for i, (a, b) in enumerate(chunk_bounds(hi - lo, 8)):
            want[lo + a:lo + b] = gathered["data"][ring[i]][lo + a:lo + b]
    for got in gathered["out"]:
        np.testing.assert_array_equal(got, want)
    bcast = _numeric(cluster, "broadcast", "ring", n, root=5)
    for got in bcast["out"]:
        np.testing.assert_array_equal(got, bcast["data"][5])
    red = _numeric(cluster, "reduce", "ring", n, root=5)
    np.testing.assert_allclose(red["out"][5], red["data"].sum(0), rtol=1e-13)


def _numeric(cluster: Cluster, operation: str, algo: str, n: int, root: int | None = None) -> dict[str, Any]:
    p = len(cluster.ranks)
    sched = Schedule(p, placement=cluster.ranks)
    fabric = fabric_of(cluster)
    collective(sched, operation, list(range(p)), "x", n, fabric, algo=algo, protocol="Simple", root=root,
               channels=fabric.default_channels(range(p)), elem_bytes=8, dtype="fp64", tag=operation, deps={})
    ex = Executor(sched, make_inputs(np.random.default_rng(0), 1, 1, 1, 1, 1))
    data = np.random.default_rng(p).standard_normal((p, n))
    for r in range(p):
        ex.buf[r]["x"] = data[r].copy()
    ex.run(sched)
    return {"data": data, "out": [ex.buf[r]["x"] for r in range(p)]}


def test_memory_and_ops_do_not_grow_with_the_message_size():
    assert chunk_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    cluster = load_topology("dgx-h100")
    fabric = fabric_of(cluster)
    counts = []
    for nbytes in (1 << 20, 16 << 30):
        tracemalloc.start()
        sched = Schedule(8, placement=cluster.ranks)
        build(sched, "allreduce", list(range(8)), "x", nbytes // 2, Choice("ring", "Simple", 1), fabric,
              elem_bytes=2, dtype="bf16", tag="ar", deps={})
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 5e6  # bytes: the schedule, not the message
        counts.append(len(sched.ops))
        assert math.isclose(sum(op.nbytes for op in sched.ops if op.kind == "send"), 2 * 7 * nbytes, rel_tol=1e-9)
    assert counts[0] == counts[1]


def test_auto_needs_the_switch_as_a_rank_to_pick_nvls():
    cluster = load_topology("dgx-h100")
    options = candidates("allreduce", "auto", "auto", list(range(8)), fabric_of(cluster), None, 1 << 30, switch=False)
    assert "nvls" not in {c.algo for c in options}
    assert run(cluster, "allreduce", 1 << 30, algo="auto", protocol="auto")[1].algo == "ring"
    with pytest.raises(InputError, match="nvls needs one NVSwitch server"):
        run(load_topology("dgx-a100"), "allreduce", 1 << 20, algo="nvls")


def test_nvls_reduces_in_the_switch_and_beats_the_ring_on_large_messages():
    cluster = load_topology("dgx-h100")
    fabric = fabric_of(cluster)
    n = 1 << 30
    times = {}
    for algo in ("ring", "nvls"):
        sched = Schedule(9, placement=(*cluster.ranks, fabric.switch[0]))
        collective(sched, "allreduce", list(range(8)), "x", n, fabric, algo=algo, protocol="Simple", elem_bytes=1,
                   dtype="bf16", tag="ar", deps={}, switch_rank=8)
        times[algo] = simulate(sched, cluster).makespan
        if algo == "nvls":
            # each GPU's link carries, each way, its buffer and its head's share (ld_reduce, st: 9/8 of n) at NVLink's
            # data rate (NCCL's 20.6 GB/s of a 25 GB/s Hopper link) and NCCL's NVLS efficiency (0.85)
            wire = 9 / 8 / (20.6 / 25 * 0.85)
            sent = [sum(op.nbytes for op in sched.ops if op.kind == "send" and op.rank == r) for r in range(9)]
            assert all(math.isclose(s, n * wire, rel_tol=1e-9) for s in sent[:8])
            assert math.isclose(sent[8], 8 * n * wire, rel_tol=1e-9)  # the switch sends every GPU the result
    assert times["nvls"] < times["ring"]


def test_alltoall_uses_every_gpus_own_nic():
    cluster = load_topology("dgx-h100", {"nodes": 2})
    _, choice = run(cluster, "alltoall", 16 * (1 << 20), algo="auto", protocol="Simple")
    assert choice.algo == "pairwise"
    fabric = fabric_of(cluster)
    sched = Schedule(16, placement=cluster.ranks)
    build(sched, "alltoall", list(range(16)), "x", 16 << 20, choice, fabric, elem_bytes=1, dtype="bf16",
          tag="a2a", deps={})
    used = {(u, v) for op in sched.ops if op.kind == "send" and fabric.hosts[op.rank] != fabric.hosts[op.peer]
            for u, v in cluster.route(cluster.ranks[op.rank], cluster.ranks[op.peer]) if ".nic" in u and "rail" in v}
    assert {u for u, _ in used if u.startswith("n0.")} == {f"n0.nic{k}" for k in range(8)}


@pytest.mark.parametrize(("protocol", "step"), [("LL", 32768), ("LL128", 576000), ("Simple", 524288)])
def test_broadcast_pipelines_in_the_protocols_step(protocol, step):
    # NCCL's channel buffer over 8 steps, less the protocol's flags (src/init.cc): the steps a broadcast pipelines
    # (a chunk of ops each); uncontended, m units down a chain of p ranks take m + p - 2 unit times after the launch
    # and the first unit's hop latencies, a unit the step with Simple (store-and-forward), with LL and LL128 the
    # grain a rank passes on as it arrives (a warp's lines: cut-through inside a server)
    assert step_payload(protocol) == step
    p, m = 4, 5
    cluster = mesh(p)
    sched = Schedule(p, placement=cluster.ranks)
    collective(sched, "broadcast", list(range(p)), "x", m * step, fabric_of(cluster), algo="ring", protocol=protocol,
               root=0, channels=1, elem_bytes=1, dtype="fp32", tag="b", deps={})
    sends = [op for op in sched.ops if op.kind == "send"]
    grain = forward_grain(protocol) or step
    units = m * step / grain
    assert units == {"LL": 640, "LL128": 1500, "Simple": 5}[protocol]
    if protocol == "Simple":  # a step an op
        assert len(sends) == m * (p - 1) and {op.nbytes for op in sends} == {step * wire_factor("ring", protocol)}
    else:  # a step a chunk of three ops: its first grain, the grains between, its last grain
        assert len(sends) == 3 * m * (p - 1)
        assert min(op.nbytes for op in sends) == grain * wire_factor("ring", protocol)
    unit_s = grain * wire_factor("ring", protocol) / BW
    latency = base_latency("ring", protocol) + (p - 1) * hop_latency("ring", protocol, "nvlink")  # the fill
    assert math.isclose(simulate(sched, cluster).makespan, latency + (units + p - 2) * unit_s, rel_tol=REL)


@pytest.mark.parametrize("protocol", ["LL", "LL128"])
def test_a_chain_holds_whole_steps_only_across_servers(protocol):
    """LL and LL128 down a chain over two servers of two GPUs: the hops inside a server pass a grain on as it
    arrives, the hop between the servers holds back one NCCL step (NCCL's proxy sends whole steps), and the tuner's
    price of the chain is the engine's time."""
    cluster = load_topology("dgx-h100", {"nodes": 2, "gpus_per_node": 2})
    fabric = fabric_of(cluster)
    p, n = len(cluster.ranks), 1 << 20
    sched = Schedule(p, placement=cluster.ranks)
    _, choice = collective(sched, "broadcast", list(range(p)), "x", n, fabric, algo="ring", protocol=protocol,
                           root=0, channels=1, elem_bytes=1, dtype="fp32", tag="b", deps={})
    first: dict[tuple[int, int], float] = {}
    for op in sched.ops:
        if op.kind == "send":
            first.setdefault((op.rank, op.peer), op.nbytes)
    grain, step, wire = forward_grain(protocol), step_payload(protocol), wire_factor("ring", protocol)
    assert grain is not None
    for (a, b), nbytes in first.items():
        if fabric.hosts[a] != fabric.hosts[b]:  # a step (at most its chunk less two grains)
            assert 0.9 * step * wire <= nbytes <= step * wire, (a, b, nbytes)
        else:
            assert math.isclose(nbytes, grain * wire, rel_tol=1e-2), (a, b, nbytes)  # parts of whole elements
    predicted = predict("broadcast", list(range(p)), n, choice, fabric, elem_bytes=1, dtype="fp32", root=0)
    assert math.isclose(simulate(sched, cluster).makespan, predicted, rel_tol=1e-6)


@pytest.mark.parametrize("channels", [1, 2, 4])
@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
def test_the_tuner_prices_a_chain_of_steps_per_channel(kind, channels):
    """Each channel pipelines its own share of the steps down its chain (its fill: p - 2 of its steps), so the
    tuner's price of a broadcast or reduce on channels over distinct links is the engine's time, whatever the
    channel count (it once counted the steps of the whole message: 0.82 of the engine with 4 channels)."""
    p, step = 8, step_payload("Simple")
    cluster = mesh(p)
    n = 16 * int(step) * channels  # 16 steps a channel
    sched = Schedule(p, placement=cluster.ranks)
    _, choice = collective(sched, kind, list(range(p)), "x", n, fabric_of(cluster), algo="ring", protocol="Simple",
                           root=0, channels=channels, elem_bytes=1, dtype="fp32", tag="c", deps={})
    assert choice == Choice("ring", "Simple", channels)
    got = simulate(sched, cluster).makespan
    predicted = predict(kind, list(range(p)), n, choice, fabric_of(cluster), elem_bytes=1, dtype="fp32", root=0)
    assert math.isclose(got, predicted, rel_tol=REL)
