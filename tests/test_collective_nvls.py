"""NVLS's traffic, rate and latency, and the links' efficiency inside a server: closed forms, and the auto choice."""

from __future__ import annotations

import math
from typing import Any

import pytest
from conftest import ZERO_COMPUTE

from simulator.cluster.topology import build_cluster, load_topology
from simulator.collectives import collective, fabric_of
from simulator.collectives.channels import Choice, choice_wire
from simulator.collectives.goodput import link_efficiency, link_wire
from simulator.collectives.nvls import nvls_bus_bandwidth, nvls_slices, nvls_time, nvls_wire
from simulator.collectives.protocols import base_latency, hop_latency
from simulator.collectives.standalone import bus_factor, collective_schedule
from simulator.collectives.tuner import candidates, choose, predict
from simulator.engine.core import simulate
from simulator.schedule.core import Schedule

REL = 1e-9
GIB = 1 << 30


def test_nvls_wire_is_the_multimem_traffic_over_nvlink_data_rate_and_nvls_efficiency():
    # ld_reduce + st: (n + 1) / n each way; NCCL's NVLink figure over the line rate (topo.h 20.6 of 25 GB/s on Hopper,
    # 40.1 of 50 on Blackwell); nvlsEfficiency (tuning.cc: 0.85, 0.74)
    for n in (2, 5, 8):
        assert math.isclose(nvls_wire("hopper", n), (n + 1) / n / (20.6 / 25 * 0.85), rel_tol=REL)
        assert math.isclose(nvls_wire("blackwell", n), (n + 1) / n / (40.1 / 50 * 0.74), rel_tol=REL)
    with pytest.raises(ValueError, match="NVLS runs on"):
        nvls_wire("ampere", 8)
    # the bus bandwidth of a large NVLS allreduce: 2 (n - 1) / n of what the link moves of payload
    assert math.isclose(nvls_bus_bandwidth(450e9, "hopper", 8), 2 * 7 / 8 * 450e9 * 8 / 9 * 20.6 / 25 * 0.85,
                        rel_tol=REL)
    # per GPU, the payload rate falls short of the link as n / (n + 1): more GPUs, closer to it
    rates = [450e9 / nvls_wire("hopper", n) for n in (5, 6, 7, 8)]
    assert rates == sorted(rates)
    assert math.isclose(rates[-1] / rates[0], (8 / 9) / (5 / 6), rel_tol=REL)


def test_nvls_slices_are_the_simple_steps():
    assert nvls_slices(1) == 1
    assert nvls_slices(2 * 512 * 1024) == 2
    assert nvls_slices(2 * 512 * 1024 + 1) == 3
    assert nvls_slices(16 * GIB) == 64  # at most ring.MAX_SLICES


@pytest.mark.parametrize("gpus", [5, 8])
@pytest.mark.parametrize("nbytes", [3 << 20, GIB])
def test_an_nvls_allreduce_takes_its_closed_form_in_the_engine_and_the_tuner(gpus, nbytes):
    """launch + NCCL's NVLS latency once (the first slice up; its way down pays its route) + (slices + 1) slice times
    at the link's rate, each slice's bytes on the wire ``payload x nvls_wire``."""
    cluster = load_topology("dgx-h100", {"gpus_per_node": gpus})
    fabric = fabric_of(cluster)
    n = nbytes // 2
    sched, choice = collective_schedule(cluster, fabric, "allreduce", n, 2, "bf16", algo="nvls")
    assert choice == Choice("nvls", "Simple", 1)
    got = simulate(sched, cluster).makespan
    gpu, switch = cluster.ranks[0], fabric.switch[0]
    edge = cluster.graph.edges[gpu, switch]
    route = cluster.message_overhead_s + edge["latency"]
    wire = (gpus + 1) / gpus / (20.6 / 25 * 0.85)
    slices = min(64, math.ceil(nbytes / (512 * 1024)))
    want = (max(cluster.collective_start_s, base_latency("nvls", "Simple"))
            + max(route, hop_latency("nvls", "Simple", "nvlink")) + route
            + (slices + 1) * nbytes * wire / slices / edge["bandwidth"])
    assert math.isclose(got, want, rel_tol=REL)
    assert math.isclose(want - max(cluster.collective_start_s, 0.0),
                        nvls_time(nbytes, wire, slices, edge["bandwidth"],
                                  max(route, hop_latency("nvls", "Simple", "nvlink")), route), rel_tol=REL)
    assert math.isclose(predict("allreduce", list(range(gpus)), n, choice, fabric, elem_bytes=2, dtype="bf16"), want,
                        rel_tol=REL)
    if nbytes == GIB:  # the bus bandwidth nccl-tests would print: the closed form's, less the fill and the latency
        busbw = bus_factor("allreduce", gpus) * nbytes / got
        assert busbw < nvls_bus_bandwidth(edge["bandwidth"], "hopper", gpus)
        assert busbw > 0.98 * nvls_bus_bandwidth(edge["bandwidth"], "hopper", gpus) * slices / (slices + 1)


def test_every_gpu_link_carries_its_buffer_and_its_share_each_way():
    cluster = load_topology("dgx-h100")
    fabric = fabric_of(cluster)
    n = 64 << 20
    sched = Schedule(9, placement=(*cluster.ranks, fabric.switch[0]))
    collective(sched, "allreduce", list(range(8)), "x", n, fabric, algo="nvls", protocol="Simple", elem_bytes=1,
               dtype="bf16", tag="ar", deps={}, switch_rank=8)
    up = [sum(op.nbytes for op in sched.ops if op.kind == "send" and op.rank == r) for r in range(8)]
    down = [sum(op.nbytes for op in sched.ops if op.kind == "recv" and op.rank == r) for r in range(8)]
    line = n * 9 / 8 / (20.6 / 25 * 0.85)
    assert all(math.isclose(b, line, rel_tol=REL) for b in (*up, *down))
    assert not any(op.rank == 8 and op.alloc for op in sched.ops)  # the switch holds no memory


def test_auto_on_one_dgx_h100_picks_ncclS_ring_ll_then_nvls():
    """NCCL on 8 x H100 (nccl-tests issue 309, NCCL_DEBUG=TUNING): ring/LL from 8 B to 1 MiB, NVLS/Simple from 2 MiB
    to 16 GiB."""
    cluster = load_topology("dgx-h100")
    fabric = fabric_of(cluster)
    for log2 in range(3, 35, 3):
        nbytes = 1 << log2
        got = choose("allreduce", list(range(8)), nbytes // 2, fabric, elem_bytes=2, dtype="bf16")
        want = ("ring", "LL") if nbytes <= 1 << 20 else ("nvls", "Simple")
        assert (got.algo, got.protocol) == want, nbytes
    assert choose("allreduce", list(range(8)), GIB, fabric, elem_bytes=2).algo == "nvls"
    # NCCL's rules: NVLS with Simple only, one channel here (the switch's); none without NVLink SHARP or across servers
    options = candidates("allreduce", "auto", "auto", list(range(8)), fabric, None, GIB)
    assert {(c.protocol, c.channels) for c in options if c.algo == "nvls"} == {("Simple", 1)}
    for name, params in (("dgx-a100", {}), ("dgx-h100", {"nodes": 2}), ("mi300x", {})):
        other = load_topology(name, params)
        ranks = list(range(len(other.ranks)))
        assert "nvls" not in {c.algo for c in candidates("allreduce", "auto", "auto", ranks, fabric_of(other),
                                                            None, GIB)}


def _xgmi_mesh(p: int, device: str = "mi300x") -> Any:
    raw: dict[str, Any] = {
        "devices": {device: ZERO_COMPUTE}, "name": "xgmi",
        "nodes": [{"name": f"n0.gpu{i}", "kind": "gpu", "device": device} for i in range(p)],
        "links": [{"a": f"n0.gpu{a}", "b": f"n0.gpu{b}", "bandwidth": "64 GB/s", "latency": "0 s",
                   "class": "infinity-fabric"} for a in range(p) for b in range(a + 1, p)],
    }
    return build_cluster(raw, "<xgmi>")


def test_link_efficiency_is_amds_usable_xgmi_share_inside_one_mi300x_server():
    assert link_efficiency("mi300x", "infinity-fabric") == link_efficiency("MI300X", "xgmi") == 48 / 64
    assert link_efficiency("h100-sxm", "nvlink") == link_efficiency("mi300x", "pcie") == 1.0
    one, two = load_topology("mi300x"), load_topology("mi300x", {"nodes": 2})
    assert math.isclose(link_wire(fabric_of(one), range(8)), 64 / 48, rel_tol=REL)
    assert link_wire(fabric_of(two), range(16)) == 1.0  # across servers: the network's hops have no factor here
    assert math.isclose(link_wire(fabric_of(two), range(8)), 64 / 48, rel_tol=REL)  # the first server's GPUs alone
    assert link_wire(fabric_of(load_topology("dgx-h100")), range(8)) == 1.0  # NVLink rings: the line rate
    assert math.isclose(choice_wire(Choice("ring", "LL128", 7), fabric_of(one), range(8)), 128 / 120 * 64 / 48,
                        rel_tol=REL)


@pytest.mark.parametrize("protocol", ["LL", "Simple"])
def test_a_ring_allreduce_over_xgmi_is_the_closed_form_at_the_usable_bandwidth(protocol):
    p = 8
    cluster = _xgmi_mesh(p)
    fabric = fabric_of(cluster)
    channels = fabric.default_channels(range(p))
    assert channels == 7
    n = 1_000_000 * p * channels
    sched = Schedule(p, placement=cluster.ranks)
    _, choice = collective(sched, "allreduce", list(range(p)), "x", n, fabric, algo="ring", protocol=protocol,
                           elem_bytes=1, dtype="fp32", tag="ar", deps={})
    got = simulate(sched, cluster).makespan
    line = {"LL": 2.0, "Simple": 1.0}[protocol]
    want = (base_latency("ring", protocol) + 2 * (p - 1) * hop_latency("ring", protocol, "nvlink")
            + 2 * (p - 1) / p * n * line / (channels * 48e9))
    assert math.isclose(got, want, rel_tol=REL)
    assert math.isclose(predict("allreduce", list(range(p)), n, choice, fabric, elem_bytes=1), want, rel_tol=REL)
    # the same mesh between GPUs without a published link efficiency runs at the line rate
    plain = _xgmi_mesh(p, device="zero")
    sched = Schedule(p, placement=plain.ranks)
    collective(sched, "allreduce", list(range(p)), "x", n, fabric_of(plain), algo="ring", protocol=protocol,
               elem_bytes=1, dtype="fp32", tag="ar", deps={})
    assert math.isclose(simulate(sched, plain).makespan - (want - 2 * (p - 1) / p * n * line / (channels * 48e9)),
                        2 * (p - 1) / p * n * line / (channels * 64e9), rel_tol=REL)
