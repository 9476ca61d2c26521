"""NCCL's per-channel bandwidth caps (the flow engine's per-flow cap, the tuner, the channels) and NVLS in the
decode tree."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from conftest import ZERO_COMPUTE

from simulator.algorithms.base import Layout
from simulator.algorithms.tree import build_tree
from simulator.cluster.topology import Cluster, build_cluster, load_topology
from simulator.collectives import collective, fabric_of
from simulator.collectives.caps import arch_of, channel_cap, nccl_speed, nccl_width
from simulator.collectives.channels import Choice
from simulator.collectives.protocols import base_latency, hop_latency, wire_factor
from simulator.collectives.tuner import predict
from simulator.engine.core import simulate
from simulator.engine.network import FlowNetwork, max_min_rates
from simulator.numeric.decode import make_inputs, run_numeric
from simulator.schedule.core import Schedule
from simulator.workloads.shape import DecodeShape

REL = 1e-9


def mesh(p: int, device: str, bw: float) -> Cluster:
    """``p`` fully linked GPUs of one server, named as ``device`` (its architecture picks NCCL's caps), no compute."""
    raw: dict[str, Any] = {
        "devices": {device: ZERO_COMPUTE}, "name": "mesh",
        "nodes": [{"name": f"n0.gpu{i}", "kind": "gpu", "device": device} for i in range(p)],
        "links": [{"a": f"n0.gpu{a}", "b": f"n0.gpu{b}", "bandwidth": bw, "latency": "0 s", "class": "nvlink"}
                  for a in range(p) for b in range(a + 1, p)],
    }
    return build_cluster(raw, "<mesh>")


def ring_allreduce(cluster: Cluster, n: int, protocol: str) -> tuple[float, float, Choice]:
    """(simulated, predicted) seconds of a ring allreduce of ``n`` bytes over the fabric's channels."""
    fabric = fabric_of(cluster)
    p = len(cluster.ranks)
    sched = Schedule(p, placement=cluster.ranks)
    _, choice = collective(sched, "allreduce", list(range(p)), "x", n, fabric, algo="ring", protocol=protocol,
                           elem_bytes=1, dtype="fp32", tag="ar", deps={})
    predicted = predict("allreduce", list(range(p)), n, choice, fabric, elem_bytes=1, dtype="fp32")
    return simulate(sched, cluster).makespan, predicted, choice


def test_a_capped_flow_leaves_the_rest_of_its_link_to_the_others():
    net = FlowNetwork([100.0])
    net.add(1, [0], 1000.0, 0.0, cap=20.0)
    net.add(2, [0], 1000.0, 0.0)
    net.allocate(0.0)
    assert (net.rate(1), net.rate(2)) == (20.0, 80.0)
    assert max_min_rates({1: [0, 1], 2: [0]}, [100.0, 20.0]) == {1: 20.0, 2: 80.0}  # the cap as a private link
    net.remove(1)  # its private link is reused by the next capped flow
    net.add(3, [0], 1000.0, 0.0, cap=70.0)
    net.allocate(0.0)
    assert net.rate(3) == 50.0 and net.rate(2) == 50.0 and len(net.capacity) == 2
    net.remove(2)  # flow 3 alone on its route: its narrowest link is its cap
    net.allocate(0.0)
    assert net.rate(3) == 70.0
    net.remove(3)  # the same route with the private link reused at another cap: not a cached rate
    net.add(4, [0], 1000.0, 0.0, cap=30.0)
    net.allocate(0.0)
    assert net.rate(4) == 30.0


def test_ll_on_a_fast_link_is_capped_at_ncclS_ll_bandwidth():
    """H100, one node: NCCL caps LL's bus bandwidth at llMaxBws = 141 GB/s, shared by the channels."""
    p, n = 4, 24_000_000
    cluster = mesh(p, "h100-sxm", 1000e9)
    got, predicted, choice = ring_allreduce(cluster, n, "LL")
    c = choice.channels
    cap = channel_cap("hopper", "allreduce", "ring", "LL", nodes=1, channels=c, width=1)
    assert c == 2 and cap == pytest.approx(141e9 / c)
    want = (base_latency("ring", "LL") + 2 * (p - 1) * hop_latency("ring", "LL", "nvlink")
            + 2 * (p - 1) / p * n / (c * cap))
    assert math.isclose(got, want, rel_tol=REL)
    assert math.isclose(predicted, want, rel_tol=REL)


def test_ll128_per_channel_cap_binds_on_ampere_and_not_on_hopper():
    """LL128: perChMaxRingLL128Bws (Ampere 20 GB/s, Hopper 36.7) x the NCCL channels one of ours stands for (a
    50 GB/s link: 1 channel at NCCL's speed 40 (Ampere) / 50 (Hopper), doubled: 2)."""
    p, n, bw = 4, 24_000_000, 50e9
    latency = base_latency("ring", "LL128") + 2 * (p - 1) * hop_latency("ring", "LL128", "nvlink")
    assert nccl_width("ampere", bw, 1) == 2 and nccl_width("hopper", bw, 1) == 2
    got, predicted, choice = ring_allreduce(mesh(p, "a100-sxm", bw), n, "LL128")
    cap = 2 * 20e9  # below the link's 50 GB/s x 120/128 of payload
    want = latency + 2 * (p - 1) / p * n / (choice.channels * cap)
    assert math.isclose(got, want, rel_tol=REL) and math.isclose(predicted, want, rel_tol=REL)
    got, predicted, choice = ring_allreduce(mesh(p, "h100-sxm", bw), n, "LL128")  # 2 x 36.7 > 50: the link binds
    want = latency + 2 * (p - 1) / p * n * wire_factor("ring", "LL128") / (choice.channels * bw)
    assert math.isclose(got, want, rel_tol=REL) and math.isclose(predicted, want, rel_tol=REL)


def test_simple_and_unknown_devices_are_not_capped():
    p, n, bw = 4, 24_000_000, 1000e9
    for device in ("h100-sxm", "mi300x"):
        got, _, choice = ring_allreduce(mesh(p, device, bw), n, "Simple" if device == "h100-sxm" else "LL")
        proto = choice.protocol
        want = (base_latency("ring", proto) + 2 * (p - 1) * hop_latency("ring", proto, "nvlink")
                + 2 * (p - 1) / p * n * wire_factor("ring", proto) / (choice.channels * bw))
        assert math.isclose(got, want, rel_tol=REL)
    assert arch_of("mi300x") == "" and arch_of("H100-SXM") == "hopper" and arch_of("rtx4090") == "ampere"


def test_ll_across_dgx_h100_nodes_runs_at_most_ncclS_multi_node_ll_bandwidth():
    """llMaxBws for 2 and 4 nodes (Intel hosts): 39.0 and 20.4 GB/s of bus bandwidth."""
    for nodes, cap in ((2, 39.0e9), (4, 20.4e9)):
        cluster = load_topology("dgx-h100", {"nodes": nodes})
        p, n = len(cluster.ranks), 1 << 28
        got, _, _ = ring_allreduce(cluster, n, "LL")
        busbw = 2 * (p - 1) / p * n / got
        assert 0.9 * cap < busbw <= cap


def _tree_decode(batch: int) -> tuple[Schedule, Any, Any]:
    cluster = load_topology("dgx-h100")
    fabric = fabric_of(cluster)
    shape = DecodeShape(batch=batch, heads=16, kv_heads=16, head_dim=128, context=80_000, dtype="bf16")
    sched = build_tree(shape, Layout(cluster.host_indices(cluster.ranks), fabric))
    return sched, simulate(sched, cluster), (cluster, fabric, shape)


def test_a_large_decode_allreduce_on_dgx_h100_runs_in_the_nvswitch():
    sched, result, (cluster, fabric, shape) = _tree_decode(4096)
    assert sched.meta["allreduce"] == "max: ring/LL, sum: nvls/Simple"
    assert sched.ranks == 9 and sched.meta["compute_ranks"] == 8 and sched.placement[-1] == fabric.switch[0]
    assert sorted(r for r, _ in sched.meta["outputs"]) == list(range(8))  # outputs on the GPUs only
    ends = result.op_ends()
    start = max(ends[op.id] for op in sched.ops if op.name == "rescale")
    end = max(ends[op.id] for op in sched.ops if op.coll == "allreduce-sum")
    n_ol = shape.batch * shape.model_dim + shape.ml_elems
    payload = n_ol * shape.elem_bytes
    slices = min(64, math.ceil(payload / (512 * 1024)))  # NCCL's 512 KiB pipeline slices
    gpu, switch = cluster.ranks[0], fabric.switch[0]
    bw = cluster.graph.edges[gpu, switch]["bandwidth"]
    # a GPU's link carries, each way, 9/8 of the payload (ld_reduce and st) at NVLink's data rate (NCCL's 20.6 GB/s of
    # a 25 GB/s link) and NCCL's NVLS efficiency (0.85)
    wire = 9 / 8 / (20.6 / 25 * 0.85)
    route = cluster.graph.edges[gpu, switch]["latency"] + cluster.message_overhead_s  # one hop, either way
    # launch, NCCL's NVLS latency once (the first slice up; its way down pays its route), slices + 1 slice times
    # (the later slices stream behind the first: no latency of their own)
    want = (max(cluster.collective_start_s, base_latency("nvls", "Simple"))
            + max(hop_latency("nvls", "Simple", "nvlink"), route) + route
            + (slices + 1) * payload * wire / slices / bw)
    # exact up to the engine's clock: it finishes flows within FINISH_RTOL of the absolute time (here 0.11 s)
    assert math.isclose(end - start, want, rel_tol=REL, abs_tol=REL * end)
    assert math.isclose(want, predict("allreduce", list(range(8)), n_ol, Choice("nvls", "Simple", 1), fabric,
                                      elem_bytes=shape.elem_bytes, dtype=shape.dtype), rel_tol=REL)
    assert not any(op.rank == 8 and op.alloc for op in sched.ops)  # the switch holds no memory


def test_a_small_decode_allreduce_keeps_ncclS_ring():
    sched, _, _ = _tree_decode(1)
    assert sched.meta["allreduce"] == "max: ring/LL, sum: ring/LL"
    assert sched.ranks == 8 and sched.placement is None


def test_the_decode_tree_through_the_nvswitch_computes_attention():
    """The switch adds every GPU's slice to the first one's, numerically: the output is dense attention's."""
    cluster = load_topology("dgx-h100")
    # a batch of 2048 makes the sum's payload large enough for auto to pick NVLS; one token per GPU keeps the KV cache
    # (batch x context x heads x head_dim) at 0.27 GB instead of 2.1 GB at 64 tokens (the test's process peaked at
    # 7.5 GB): the sum through the switch is the same merge of eight partial outputs whatever each GPU's token count
    shape = DecodeShape(batch=2048, heads=16, kv_heads=16, head_dim=128, context=8, dtype="fp32")
    sched = build_tree(shape, Layout(cluster.host_indices(cluster.ranks), fabric_of(cluster)))
    assert sched.meta["allreduce"].endswith("sum: nvls/Simple")
    inp = make_inputs(np.random.default_rng(0), shape.batch, shape.heads, shape.kv_heads, shape.head_dim,
                      shape.context, np.float32)
    assert run_numeric(sched, inp).max_abs_err < 1e-5


def test_tree_cap_is_ncclS_min_of_its_search_speed_and_perChMaxTreeBw():
    """tuning.cc: tree allreduce busBw = min(nChannels x bw x .92, nChannels x perChMaxTreeBw), bw the speed NCCL's
    search gives a channel. A 50 GB/s NIC across 2 Hopper servers: speed 48, doubled into 2 channels of 24 GB/s;
    .92 x 24 = 22.08 < 41.4 binds. A 450 GB/s NVLink on one Hopper server: 7 channels at 60, doubled: 14 of 30
    GB/s; .92 x 30 = 27.6 < 38.7 binds too. With 80 GB/s per NCCL channel, perChMaxTreeBw binds."""
    assert nccl_speed("hopper", 50e9, 2) == pytest.approx(24.0) and nccl_width("hopper", 50e9, 2) == 2
    assert channel_cap("hopper", "allreduce", "tree", "Simple", nodes=2, channels=8, width=2,
                       speed=24.0) == pytest.approx(2 * 0.92 * 24.0e9)
    assert nccl_speed("hopper", 450e9, 1) == pytest.approx(30.0) and nccl_width("hopper", 450e9, 1) == 14
    assert channel_cap("hopper", "allreduce", "tree", "Simple", nodes=1, channels=1, width=14,
                       speed=30.0) == pytest.approx(14 * 0.92 * 30.0e9)
    assert channel_cap("hopper", "allreduce", "tree", "Simple", nodes=1, channels=1, width=1,
                       speed=80.0) == pytest.approx(38.7e9)
