"""Contention: a point-to-point transfer in flight holds its NCCL channels' SMs on both GPUs, and a kernel running
there takes its duration on the SMs left (closed forms: a roofline kernel's compute side stretches by S / (S - h),
its launch and memory side do not; an attention block of one wave takes two); NCCL's channel counts (its rules, by
hand); the row's split (contention is communication's time, not compute's); the trace's contention_us."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.algorithms.prefill import build_prefill
from simulator.cluster.devices import duration_with_sms_held
from simulator.cluster.topology import build_cluster, load_topology
from simulator.collectives.p2p import P2pChannels, p2p_channels
from simulator.engine import core
from simulator.engine.core import simulate
from simulator.engine.reference import simulate_reference
from simulator.kernels.tiles import AttentionCall, attention_time, call_dims, full_launch
from simulator.report.trace import chrome_trace
from simulator.run.prepared import layout_of
from simulator.run.timing import critical_timing
from simulator.schedule.core import Schedule
from simulator.workloads.prefill_shape import PrefillShape

MB = 1 << 20


@pytest.fixture(scope="module")
def h100() -> object:
    return load_topology("dgx-h100", {"nodes": 1})


def _alone(sched: Schedule, cluster: object) -> core.SimResult:
    """The same schedule with no transfer holding any SM."""
    with mock.patch.object(core, "p2p_channels", return_value=None):
        return simulate(sched, cluster)


@pytest.mark.parametrize(("preset", "nodes", "every", "per_peer", "channels", "sizes"), [
    # one server of 8 H100s: NVLink 2 x floor(450 / 20.6) = 42 -> 64, capped by the 16 P2P channels (NCCL's 14
    # collective channels, rounded up); per op 16 x 8 ranks > 16 halves it to 2; a 4 KB message 1 (4 KB / 64 KB)
    ("dgx-h100", 1, 1, 16, 16, {4096: 1, MB: 2, 32 * MB: 2, 64 * MB: 4}),
    # 16 servers, one GPU each: max(1 NIC, ceil(50 / 14)) = 4 (4 x ceil(16 / 8) = 8 <= 16 keeps it); per op 4 x 16
    # > 16 halves to 1, then doubled while a part exceeds a 128 KB chunk: 4
    ("dgx-h100", 16, 8, 4, 16, {4096: 1, MB: 4, 32 * MB: 4}),
    # 128 GPUs on 16 servers: 4 x ceil(128 / 8) = 64 > 16 halves the per-peer count to 1
    ("dgx-h100", 16, 1, 1, 16, {4096: 1, MB: 1, 32 * MB: 1}),
])
def test_channels_follow_nccls_rules(preset, nodes, every, per_peer, channels, sizes):
    cluster = load_topology(preset, {"nodes": nodes})
    got = p2p_channels(cluster, cluster.ranks[::every])
    assert got is not None and (got.per_peer, got.channels) == (per_peer, channels)
    assert {b: got.of(b) for b in sizes} == sizes


@given(per_peer=st.sampled_from([1, 2, 4, 8, 16, 32]), channels=st.sampled_from([2, 4, 8, 16, 32, 64]),
       ranks=st.integers(2, 512), nodes=st.integers(1, 64), nbytes=st.floats(0, 1e10))
def test_an_operation_runs_on_one_to_per_peer_channels(per_peer, channels, ranks, nodes, nbytes):
    chunk = 128 * 1024 if nodes > 1 else 512 * 1024
    assert 1 <= P2pChannels(per_peer, channels, ranks, nodes, chunk).of(nbytes) <= per_peer


def test_no_channels_off_nvidia_gpus():
    cluster = load_topology("mi300x", {"nodes": 1})
    assert p2p_channels(cluster, cluster.ranks) is None


def _step(cluster: object, flops: float, nbytes: float, first: str) -> tuple[Schedule, int, int]:
    """Rank 0 runs one kernel of ``flops`` (bf16, fused: no launch) and sends ``nbytes`` to rank 1: ``first`` says
    how (``after``: the send depends on the kernel; ``with``: the send is issued first, the kernel beside it)."""
    sched = Schedule(2)
    if first == "after":  # the kernel ends before the send is posted
        k = sched.add_compute(0, "k", flops=flops, dtype="bf16", fused=True)
        snd, _ = sched.add_transfer(0, 1, nbytes, "x", send_deps=[k])
    else:  # issued before the kernel, the send is posted at once (stream order)
        snd, _ = sched.add_transfer(0, 1, nbytes, "x")
        k = sched.add_compute(0, "k", flops=flops, dtype="bf16", fused=True)
    return sched, k, snd


def test_an_overlapped_kernel_stretches_by_the_sms_its_transfer_holds(h100):
    """Kernel of duration d, SM-bound; the send (h SMs of S) in flight for t < d: the kernel runs at (S - h) / S
    for t, then at full speed: it ends at d + t h / S, and the send's time is unchanged."""
    sched, k, snd = _step(h100, 2e12, 32 * MB, "with")
    res, alone = simulate(sched, h100), _alone(sched, h100)
    d, t = alone.end[k] - alone.start[k], alone.end[snd] - alone.start[snd]
    sms, held = 132, p2p_channels(h100, h100.ranks[:2]).of(32 * MB)  # type: ignore[union-attr]
    assert held == 8 and t < d  # two ranks: 16 per peer, halved while x 2 ranks > 16 P2P channels
    assert res.end[snd] == alone.end[snd]
    assert res.end[k] == pytest.approx(d + t * held / sms, rel=1e-12)
    assert res.slowed[k] == pytest.approx(t * held / sms, rel=1e-9)  # type: ignore[index]
    assert (res.end == simulate_reference(sched, h100).end).all()


def test_a_kernel_longer_than_nothing_it_overlaps_is_not_slowed(h100):
    sched, k, snd = _step(h100, 2e12, 32 * MB, "after")  # the send waits for the kernel
    res, alone = simulate(sched, h100), _alone(sched, h100)
    assert res.end[k] == alone.end[k] and res.end[snd] == alone.end[snd]
    assert res.slowed[k] == 0.0  # type: ignore[index]


def test_a_memory_bound_kernel_is_not_slowed(h100):
    """Its SM-bound share f is small: (S - h) / (S f) > 1, it runs at full speed beside the transfer."""
    sched = Schedule(2)
    sched.add_transfer(0, 1, 32 * MB, "x")
    k = sched.add_compute(0, "k", nbytes=4e9, flops=1e9, dtype="bf16", fused=True)
    res, alone = simulate(sched, h100), _alone(sched, h100)
    assert res.end[k] == alone.end[k]


def test_a_kernel_under_a_whole_transfer_and_the_receiver_too(h100):
    """The receiver holds its channels from its post (at once: nothing before it on its rank; its kernel spins while
    the send waits for the sender's kernel) to the transfer's end: a kernel there, covering all that, ends
    ``end(transfer) h / S`` later; on the sender, whose send waits for its kernel, nothing is slowed. Where the op
    order is not a program, the ends hold their SMs from the transfer's start: ``t h / S``."""
    for program in (True, False):
        sched = Schedule(2, program_order=program)
        k0 = sched.add_compute(0, "k0", flops=1e12, dtype="bf16", fused=True)
        snd, _ = sched.add_transfer(0, 1, 64 * MB, "x", send_deps=[k0])
        k1 = sched.add_compute(1, "k1", flops=4e12, dtype="bf16", fused=True)  # issued after the receive
        res, alone = simulate(sched, h100), _alone(sched, h100)
        held = p2p_channels(h100, h100.ranks[:2]).of(64 * MB)  # type: ignore[union-attr]
        t = alone.end[snd] - alone.start[snd]
        assert held == 8 and alone.end[snd] < alone.end[k1] and alone.start[snd] == alone.end[k0] > 0
        waited = alone.end[snd] if program else t
        assert res.end[k1] == pytest.approx(alone.end[k1] + waited * held / 132, rel=1e-12)
        assert res.end[k0] == alone.end[k0]
        assert (res.end == simulate_reference(sched, h100).end).all()


def test_contention_is_communications_time_in_the_row(h100):
    """A ring's compute_s is its kernels' durations whatever the SMs held; comm_s and the latency take what
    contention adds; comm_hidden_frac falls below the share of transfer time run under kernels."""
    shape = PrefillShape(batch=1, heads=32, head_dim=128, kv_heads=8, sequence=8 * 8192, dtype="bf16", causal=True,
                         layout="zigzag", backward=True)
    sched = build_prefill("ring", {"overlap": True}, shape, layout_of(h100))
    res, alone = simulate(sched, h100), _alone(sched, h100)
    got, base = critical_timing(res, 8), critical_timing(alone, 8)
    assert res.makespan > alone.makespan
    assert got["compute_s"] == pytest.approx(base["compute_s"], rel=1e-12)
    assert got["comm_hidden_frac"] < got["comm_under_compute_frac"] <= 1.0
    assert res.slowed is not None and alone.slowed is None


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.sampled_from([4096.0, 1e6, 3e7, 2e8]), min_size=1, max_size=12),
       flops=st.lists(st.sampled_from([0.0, 1e10, 1e12, 5e12]), min_size=1, max_size=12), seed=st.integers(0, 99))
def test_no_kernel_runs_faster_than_alone(h100, sizes, flops, seed):
    """Random kernels and transfers over 8 GPUs: each kernel lasts at least its duration and at most its duration
    stretched as if every SM the most transfers may hold were held throughout; the compiled loop is the reference's
    float for float."""
    rng = np.random.default_rng(seed)
    sched = Schedule(8)
    for i in range(max(len(sizes), len(flops))):
        a, b = (int(x) for x in rng.choice(8, 2, replace=False))
        deps = [int(rng.integers(len(sched.ops)))] if sched.ops and rng.random() < 0.5 else []
        sched.add_compute(a, "k", flops=flops[i % len(flops)], nbytes=1e6, dtype="bf16", deps=deps)
        sched.add_transfer(a, b, sizes[i % len(sizes)], "x", send_deps=deps)
    res, alone = simulate(sched, h100), _alone(sched, h100)
    kernels = np.flatnonzero(res.kind_of <= 1)
    lasted, dur = (res.end - res.start)[kernels], (alone.end - alone.start)[kernels]
    assert (lasted >= dur * (1 - 1e-12)).all()
    assert (lasted <= dur * 132 / (132 - 16) * (1 + 1e-12) + 1e-15).all()  # at most the 16 P2P channels held
    assert math.isclose(res.makespan, simulate_reference(sched, h100).makespan, rel_tol=0, abs_tol=0)


def test_the_trace_says_what_contention_added_to_a_kernel(h100):
    sched, k, _ = _step(h100, 2e12, 32 * MB, "with")
    res = simulate(sched, h100)
    trace = chrome_trace([("x", res, h100.ranks[:2])], h100)
    (kernel,) = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["args"].get("op") == k]
    assert kernel["args"]["contention_us"] == pytest.approx(res.slowed[k] * 1e6)  # type: ignore[index]
    assert all("contention_us" not in e["args"] for e in trace["traceEvents"]
               if e.get("ph") == "X" and e["args"].get("op") != k)


def test_a_launch_does_not_stretch_and_the_rest_runs_on_the_sms_left(h100):
    """A roofline kernel with its launch (not fused), wholly under a transfer: launch + t_flops S / (S - h)."""
    spec = h100.specs[h100.ranks[0]]
    sched = Schedule(2)
    sched.add_transfer(0, 1, 256 * MB, "x")  # far longer than the kernel
    k = sched.add_compute(0, "k", flops=2e10, dtype="bf16")
    res, alone = simulate(sched, h100), _alone(sched, h100)
    held = p2p_channels(h100, h100.ranks[:2]).of(256 * MB)  # type: ignore[union-attr]
    t_flops = 2e10 / (spec.flops_for("bf16") * spec.eff_flops)
    assert alone.end[k] - alone.start[k] == pytest.approx(spec.launch_s + t_flops, rel=1e-12)
    assert res.end[k] - res.start[k] == pytest.approx(spec.launch_s + t_flops * 132 / (132 - held), rel=1e-12)


def test_a_one_wave_attention_kernel_takes_two_when_sms_are_held(h100):
    """Wave quantization (the tile model on the SMs left): a forward of exactly 132 CTAs (132 heads x one 128-row
    block) is one wave on 132 SMs and two on 124, so with 8 SMs held throughout its tiles take twice as long (an
    H100 GEMM of 132 CTAs beside a 24-CTA all-gather "nearly doubles", NVIDIA developer forum, thread 337991)."""
    spec = h100.specs[h100.ranks[0]]
    call = AttentionCall(128, 132, 1, (full_launch(128, 2048),))
    dims = call_dims((132 * 128, 2048, 128, 1.0), call)
    alone = attention_time(spec, False, "bf16", dims)
    held = duration_with_sms_held(spec, 8, 0.0, 0.0, "bf16", "attn-fwd", dims, False)
    overhead = spec.launch_s  # one launch, outside the waves
    assert alone is not None and (held - overhead) / (alone - overhead) == pytest.approx(2.0, rel=1e-9)
    one_more = duration_with_sms_held(spec, 1, 0.0, 0.0, "bf16", "attn-fwd", dims, False)
    assert one_more == pytest.approx(held, rel=1e-12)  # one SM short is a second wave already


def test_gpus_of_few_sms_beside_others_and_the_reference_agree():
    """A cluster of H100s and GPUs of 8 SMs (fewer than the H100s' transfers may hold): every kernel's rates stop at
    its own GPU's SMs but one, and the compiled loop is the reference's float for float."""
    devices = {"h100": {"peak_flops": {"bf16": "989.4 TFLOP/s", "fp32": "67 TFLOP/s"}, "mem_bw": "3.35 TB/s",
                        "mem": "80 GB", "launch_overhead": "3 us", "sm_count": 132},
               "tiny": {"peak_flops": {"bf16": "60 TFLOP/s", "fp32": "4 TFLOP/s"}, "mem_bw": "0.2 TB/s",
                        "mem": "8 GB", "launch_overhead": "3 us", "sm_count": 8}}
    kinds = ["h100", "tiny", "h100", "tiny"]
    raw = {"devices": devices, "name": "mix",
           "nodes": [{"name": f"h{i}", "kind": "gpu", "device": d} for i, d in enumerate(kinds)]
           + [{"name": "s", "kind": "switch"}],
           "links": [{"a": f"h{i}", "b": "s", "bandwidth": "400 GB/s", "latency": "1 us"} for i in range(4)]}
    cluster = build_cluster(raw, "<mix>")
    sched = Schedule(4)
    sched.add_transfer(0, 2, 64e6, "x")
    sched.add_transfer(1, 3, 64e6, "y")
    for r in range(4):
        sched.add_compute(r, "k", flops=1e12, dtype="bf16")
    res, ref = simulate(sched, cluster), simulate_reference(sched, cluster)
    np.testing.assert_array_equal(res.end, ref.end)
    assert res.slowed is not None and res.slowed[4] > 0 and res.slowed[5] > 0  # the kernels of ranks 0 and 1
