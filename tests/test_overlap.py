"""Ring overlap finder: by simulation, equal to the closed form when nothing but compute and bandwidth costs."""

from __future__ import annotations

import pytest

from simulator.algorithms import Layout
from simulator.cli import main
from simulator.cluster.topology import build_cluster
from simulator.plan.overlap import find_overlap, overlap_shape
from simulator.workloads.prefill_shape import PrefillShape


def ideal_star(p: int, bw: str, launch: str | int = 0, latency: str | int = 0):
    dev = {"peak_flops": {"bf16": "1000 TFLOP/s"}, "mem_bw": "1e30 B/s", "mem": "80 GB", "launch_overhead": launch}
    raw = {"devices": {"ideal": dev}, "name": "star",
           "nodes": [{"name": f"h{i}", "kind": "gpu", "device": "ideal"} for i in range(p)]
           + [{"name": "s", "kind": "switch"}],
           "links": [{"a": f"h{i}", "b": "s", "bandwidth": bw, "latency": latency} for i in range(p)]}
    return build_cluster(raw, "<star>")


@pytest.mark.parametrize(("kv", "bw", "want"), [(8, "50 GB/s", 5000), (32, "50 GB/s", 20000), (8, "400 GB/s", 625)])
def test_found_by_simulation_equals_the_closed_form_without_overheads(kv, bw, want):
    shape = PrefillShape(1, 32, 128, kv, 1, "bf16")
    res = find_overlap(shape, ideal_star(4, bw), Layout((0, 0, 0, 0)))
    assert res.closed_form == pytest.approx(want)  # (kv / h) (e / 2) F / B
    assert res.tokens == want


def test_overheads_move_it_up():
    # a roofline device: a link's latency delays every transfer more than the kernels' launches delay the blocks
    shape = PrefillShape(1, 32, 128, 8, 1, "bf16")
    res = find_overlap(shape, ideal_star(4, "50 GB/s", launch="1 us", latency="20 us"), Layout((0, 0, 0, 0)))
    assert res.tokens is not None and res.tokens > res.closed_form == pytest.approx(5000)


def test_tiles_hide_small_shards_on_an_h100(capsys):
    # on the tile model a block of a few hundred tokens still runs whole tiles in one wave plus two launches (the
    # kernel, the merge), longer than its K/V's transfer over NVLink: the transfers hide from the smallest shard
    assert main(["overlap", "--model", "llama-3.1-8b", "--gpus", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    gpus, found, closed = out[-1].split()[:3]
    # F/B with F = 989.4 TFLOP/s x eff_flops 0.80 (H100's measured matmul efficiency): 550 tokens at eff 1
    assert gpus == "8" and int(found) == 1 and float(closed) == pytest.approx(550 * 0.80, abs=1)


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "32,5,128"], "--model: heads (32) must be a positive multiple of kv_heads (5)"),
    (["--model", "gpt"], "--model: expected a preset"),
    (["--model", "llama-3.1-8b", "--gpus", "9"], "--gpus: must be between 2 and the 8 GPUs, got 9"),
])
def test_overlap_errors(argv, message, capsys):
    assert main(["overlap", *argv]) == 2
    assert message in capsys.readouterr().err


def test_overlap_shape_of_a_preset():
    assert overlap_shape("llama-3.1-70b", "bf16").heads == 64
