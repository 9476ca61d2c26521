"""``collective_stall``: a collective start's mean cost beyond its typical (median) one, measured by ``treering
calibrate`` from the all_reduce latencies' tail and charged once per collective start by the engine."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
import yaml

from simulator.algorithms import Layout, build_schedule
from simulator.cluster.topology import build_cluster, load_topology
from simulator.collectives import allreduce
from simulator.distributed.calibrate import _topology, stall_of
from simulator.engine.core import simulate
from simulator.errors import InputError
from simulator.schedule.core import Schedule
from simulator.workloads.shape import DecodeShape

REL = 1e-12


def _raw(p: int, zero: bool = False, **extra: str) -> dict[str, object]:
    """p hosts on a switch; a device that computes in no time (``zero``) or a slow one."""
    device = ({"peak_flops": {"fp32": "1e30 FLOP/s"}, "mem_bw": "1e30 B/s", "launch_overhead": 0} if zero
              else {"peak_flops": {"fp32": "1e12 FLOP/s"}, "mem_bw": "1e11 B/s", "launch_overhead": "5 us"})
    return {"nodes": [{"name": f"h{i}", "kind": "gpu", "device": "d"} for i in range(p)]
            + [{"name": "s", "kind": "switch"}],
            "devices": {"d": device},
            "links": [{"a": f"h{i}", "b": "s", "bandwidth": "25 GB/s", "latency": "1.5 us"} for i in range(p)],
            "message_overhead": "2 us", "comm_overhead": "3 us", "collective_overhead": "40 us", **extra}


def _allreduce(p: int, n: int) -> Schedule:
    sched = Schedule(p, placement=tuple(f"h{i}" for i in range(p)))
    allreduce(sched, list(range(p)), (0,) * p, "x", n, op="sum", elem_bytes=1, dtype="fp32", tag="ar", deps={},
              algo="ring")
    return sched


@pytest.mark.parametrize("p", [2, 4])
def test_a_stall_adds_exactly_itself_to_each_collective_start(p):
    n = 1_000_000 * p
    base = simulate(_allreduce(p, n), build_cluster(_raw(p, zero=True), "<t>")).makespan
    stalled = simulate(_allreduce(p, n), build_cluster(_raw(p, zero=True, collective_stall="700 us"), "<t>"))
    # collective_overhead + stall, then 2(P-1) steps of message overhead + two links' latency + a chunk
    assert math.isclose(stalled.makespan, 40e-6 + 700e-6 + 2 * (p - 1) * (2e-6 + 3e-6 + n / (p * 25e9)),
                        rel_tol=1e-9)
    assert math.isclose(stalled.makespan - base, 700e-6, rel_tol=1e-9)


def test_tree_decode_pays_the_stall_once_per_allreduce_and_p2p_merges_not_at_all():
    shape = DecodeShape(2, 4, 64, 4, 4096, "fp32")
    plain, stalled = build_cluster(_raw(2), "<t>"), build_cluster(_raw(2, collective_stall="1 ms"), "<t>")
    layout = Layout((0, 0))
    tree = build_schedule("tree", {}, shape, layout)
    assert sum(op.kind == "launch" for op in tree.ops if op.rank == 0) == 2  # allreduce(max) of m, (sum) of (o, l)
    assert math.isclose(simulate(tree, stalled).makespan - simulate(tree, plain).makespan, 2e-3, rel_tol=1e-9)
    p2p = build_schedule("tree-p2p", {}, shape, layout)
    assert simulate(p2p, stalled).makespan == simulate(p2p, plain).makespan


def test_without_the_key_a_collective_starts_as_before():
    cluster = build_cluster(_raw(2), "<t>")
    assert cluster.collective_stall_s == 0.0
    assert cluster.collective_start_s == 40e-6
    assert build_cluster(_raw(2, collective_stall="0.25 ms"), "<t>").collective_start_s == pytest.approx(290e-6,
                                                                                                        rel=REL)


@pytest.mark.parametrize(("value", "message"), [("-3 us", "collective_stall"), ("5 GB", "collective_stall"),
                                                ("fast", "collective_stall")])
def test_a_bad_stall_is_rejected_with_its_line(tmp_path, value, message):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(_raw(2), sort_keys=False) + f"collective_stall: {value}\n")
    with pytest.raises(InputError) as exc:
        load_topology(str(path))
    text = str(exc.value)
    assert text.startswith(f"{path}:{len(path.read_text().splitlines())}: collective_stall: "), text


def test_stall_of_is_the_trimmed_mean_beyond_the_median():
    assert stall_of([1e-3] * 19 + [0.1]) == (1e-3, 0.0)  # one preemption dropped: no stall
    median, stall = stall_of([0.4e-3] * 12 + [2.4e-3] * 8)  # bimodal: 8 of 20 calls slow; the slowest one dropped
    assert median == 0.4e-3
    assert stall == pytest.approx((12 * 0.4e-3 + 7 * 2.4e-3) / 19 - 0.4e-3, rel=REL)
    assert stall_of([1.0, 3.0] * 10)[1] == 0.0  # a mean below the median is no stall
    with pytest.raises(ValueError):
        stall_of([])


def test_calibrate_writes_the_stall_it_measured(tmp_path):
    args = argparse.Namespace(min_r2=0.9, backend="gloo", heads=16, head_dim=128, kernels_from=None)
    pp = [(8 * 4**k, 50e-6 + 8 * 4**k / 3e9) for k in range(12)]
    exchanges = [(n, n * 2 / 3e9, n * 2 / 4e9) for n in (16 * 2**20, 64 * 2**20, 256 * 2**20)]
    attend = [(float(b), 100e-6 + b / 9e9) for b in (4e6, 16e6, 64e6, 256e6, 1e9)]
    median, stall = stall_of([0.4e-3] * 12 + [2.4e-3] * 8)
    text = _topology(args, 2, pp, exchanges, (median, stall, 0.3e-3), 100e-6, attend, attend, [1e11, 5e10],
                     (2, 1.8e10, 5e9), [])
    body = yaml.safe_load(text)
    assert body["collective_stall"] == f"{stall * 1e6:.6g} us"
    assert "collective_stall" in text.split("\nname:")[0]  # the comment says how it was measured
    path = tmp_path / "t.yaml"
    path.write_text(text)
    cluster = load_topology(str(path))
    overhead = float(np.polyfit([s for s, _ in pp], [t for _, t in pp], 1, w=[1 / t for _, t in pp])[1])
    assert cluster.collective_stall_s == pytest.approx(stall, rel=1e-5)
    assert cluster.collective_start_s == pytest.approx(median - 2 * overhead + stall, rel=1e-4)
