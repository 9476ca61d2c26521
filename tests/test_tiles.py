"""The attention kernels by tile (simulator.kernels.tiles): masks and tiles against brute force, the SMs' list
schedule, one tile and one kernel in closed form, the device facts, and the published FlashAttention tables."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.kernel_tables import errors
from simulator.cluster.devices import compute_time, parse_device_spec, profiled_time
from simulator.errors import InputError
from simulator.kernels.tiles import (
    FLASH_ATTENTION_2,
    FLASH_ATTENTION_3,
    AttentionCall,
    Launch,
    _list_scheduled,
    attention_time,
    call_dims,
    call_of,
    causal_launch,
    cta_tiles,
    full_launch,
    kernel_time,
    launch_pairs,
    makespan,
    tile_seconds,
)
from simulator.units import Check


def _locate(sub, err):
    return err


def _visible(launch: Launch) -> np.ndarray:
    nq, nk, off = launch
    return np.arange(nk)[None, :] <= np.arange(nq)[:, None] + off


@settings(max_examples=80, deadline=None)
@given(nq=st.integers(1, 70), nk=st.integers(1, 70), shift=st.integers(-80, 80))
def test_launch_pairs_equal_brute_force(nq, nk, shift):
    launch = Launch(nq, nk, shift)
    assert launch_pairs(launch) == int(_visible(launch).sum())


@settings(max_examples=60, deadline=None)
@given(nq=st.integers(1, 70), nk=st.integers(1, 70), shift=st.integers(-75, 75), br=st.sampled_from([8, 13, 16]),
       bc=st.sampled_from([8, 11, 16]), backward=st.booleans())
def test_cta_tiles_equal_brute_force(nq, nk, shift, br, bc, backward):
    """A CTA walks the tiles with a visible pair; a tile is clean when every element is visible and it is not the
    ragged last tile of the walk."""
    launch = Launch(nq, nk, shift)
    vis = _visible(launch)
    clean, crossed = cta_tiles(launch, backward, br, bc)
    rb, cb = -(-nq // br), -(-nk // bc)
    want_clean, want_crossed = [], []
    for own in range(cb if backward else rb):
        c = x = 0
        for walk in range(rb if backward else cb):
            qi, kj = (walk, own) if backward else (own, walk)
            tile = vis[qi * br:(qi + 1) * br, kj * bc:(kj + 1) * bc]
            if not tile.any():
                continue
            ragged = (qi + 1) * br > nq if backward else (kj + 1) * bc > nk
            c, x = (c + 1, x) if tile.all() and not ragged else (c, x + 1)
        want_clean.append(c)
        want_crossed.append(x)
    assert clean.tolist() == want_clean and crossed.tolist() == want_crossed


def test_a_causal_square_has_one_diagonal_tile_per_row_block():
    clean, crossed = cta_tiles(causal_launch(4 * 64, 4 * 64), False, 64, 64)
    assert clean.tolist() == [0, 1, 2, 3] and crossed.tolist() == [1, 1, 1, 1]
    clean, crossed = cta_tiles(full_launch(100, 4 * 64), False, 64, 64)  # no mask: the walk has no ragged tile
    assert clean.tolist() == [4, 4] and crossed.tolist() == [0, 0]


def _greedy(durations, sms):
    free = [0.0] * sms
    for d in durations:
        heapq.heapreplace(free, free[0] + d)
    return max(free)


@settings(max_examples=40, deadline=None)
@given(durations=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=300), sms=st.integers(1, 20))
def test_makespan_is_list_scheduling(durations, sms):
    assert makespan(np.array(durations), sms) == pytest.approx(_greedy(durations, sms), rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(start=st.floats(0.0, 1e3), durations=st.lists(st.floats(0.0, 10.0), max_size=400), sms=st.integers(1, 40))
def test_the_compiled_schedule_is_the_heap_walk_to_the_last_float(start, durations, sms):
    """The compiled list scheduling takes each CTA to the least free time, as heapq's walk does: the same floats."""
    free = [start / sms] * sms
    for d in durations:
        heapq.heapreplace(free, free[0] + d)
    assert _list_scheduled(start, np.array(durations, dtype=float), sms) == max(free)


@pytest.mark.parametrize("n", [1, 107, 108, 109, 5000, 20001])
def test_equal_ctas_take_whole_waves(n):
    assert makespan(np.full(n, 2.0), 108) == pytest.approx(2.0 * math.ceil(n / 108), rel=1e-12)


SPEC = {"peak_flops": {"bf16": "1 TFLOP/s", "fp32": "2 TFLOP/s"}, "mem_bw": "1 TB/s", "mem": "80 GB",
        "launch_overhead": "2 us", "eff_flops": 0.5, "eff_mem": 0.5, "sm_count": 4, "sfu_rate": "1 TFLOP/s",
        "attention_kernels": "flash-attention-2"}


def test_a_tile_in_closed_form():
    spec = parse_device_spec("g", SPEC, _locate)
    per_sm_mma, per_sm_sfu, per_sm_fp32 = 0.5e12 / 4, 1e12 / 4, 1e12 / 4  # FLOP/s, exp/s, instructions/s
    gemm = 4 * 128 * 64 * 128 / per_sm_mma
    soft = 128 * 64 * (1 / per_sm_sfu + (3.5 + 128 / 64) / per_sm_fp32)
    mask = 128 * 64 * 2 / per_sm_fp32
    assert tile_seconds(spec, FLASH_ATTENTION_2, False, "bf16", 128, 128, 64) == pytest.approx(
        (gemm + soft, gemm + soft + mask), rel=1e-12)  # FlashAttention-2: one after the other
    assert tile_seconds(spec, FLASH_ATTENTION_3, False, "bf16", 128, 128, 64) == pytest.approx(
        (max(gemm, soft), max(gemm, soft + mask)), rel=1e-12)  # FlashAttention-3's forward: overlapped
    gemm_b = 10 * 64 * 128 * 128 / per_sm_mma
    soft_b = 64 * 128 * (1 / per_sm_sfu + 4.0 / per_sm_fp32)
    assert tile_seconds(spec, FLASH_ATTENTION_3, True, "bf16", 128, 64, 128)[0] == pytest.approx(gemm_b + soft_b)


def test_a_kernel_in_closed_form():
    """No mask, 3 x 2 heads of 256 queries x 320 keys at head dim 128 (FlashAttention-2: 128 x 64 tiles): 2 row
    blocks each, 12 CTAs of 5 tiles plus one to fill the pipeline plus their Q and O through HBM, on 4 SMs: 3 waves;
    one launch."""
    spec = parse_device_spec("g", SPEC, _locate)
    t_tile = tile_seconds(spec, FLASH_ATTENTION_2, False, "bf16", 128, 128, 64)[0]
    io = 2 * 128 * 128 * 2 / (1e12 * 0.5 / 4)
    want = 2e-6 + 3 * (6 * t_tile + io)
    got = kernel_time(spec, FLASH_ATTENTION_2, False, "bf16", 128, 6, [full_launch(256, 320)])
    assert got == pytest.approx(want, rel=1e-12)
    # the op adds its elementwise kernels: a launch each and their bytes at the achievable bandwidth
    dims = call_dims((6 * 256, 320, 128, 1.0), AttentionCall(128, 6, 1, (full_launch(256, 320),), 1e6, 2))
    assert call_of(dims) == AttentionCall(128, 6, 1, (full_launch(256, 320),), 1e6, 2)
    assert attention_time(spec, False, "bf16", dims) == pytest.approx(want + 2 * 2e-6 + 1e6 / 0.5e12, rel=1e-12)
    # the engine's hook: the tile model for attention blocks; the roofline for the rest and for dims without launches
    assert profiled_time(spec, "attn-fwd", "bf16", dims) == (attention_time(spec, False, "bf16", dims), ())
    assert profiled_time(spec, "attn-fwd", "bf16", dims[:4]) is None
    assert profiled_time(spec, "attn-fwd", "fp32", dims) is None  # not a dtype FlashAttention runs


def test_a_measured_attention_efficiency_comes_before_the_tiles():
    spec = parse_device_spec("g", {**SPEC, "attention_efficiency": {"forward": 0.5}}, _locate)
    dims = call_dims((256, 256, 128, 1.0), AttentionCall(128, 1, 1, (full_launch(256, 256),)))
    assert profiled_time(spec, "attn-fwd", "bf16", dims) is None  # the roofline at the measured efficiency
    assert profiled_time(spec, "attn-bwd", "bf16", dims) is not None
    assert compute_time(spec, 1e9, 0, "bf16", launch=False, fn="attn-fwd") == pytest.approx(1e9 / 0.5e12)


def test_backward_side_kernels_and_gqa():
    """The backward adds D = rowsum(dO O) and the dQ conversion (two launches, their bytes); FlashAttention-2 sums
    the expanded dK, dV of a KV head's query heads outside the kernel, FlashAttention-3 inside it."""
    spec2 = parse_device_spec("g", SPEC, _locate)
    spec3 = parse_device_spec("g", {**SPEC, "attention_kernels": "flash-attention-3"}, _locate)
    launch = (full_launch(512, 512),)
    for spec, impl in ((spec2, FLASH_ATTENTION_2), (spec3, FLASH_ATTENTION_3)):
        kernel = kernel_time(spec, impl, True, "bf16", 128, 8, launch)
        assert kernel is not None
        q = 8 * 512 * 128
        side = 2 * 2e-6 + (q * (2 * 2 + 4) + 8 * 512 * 4 + q * (4 + 2)) / 0.5e12
        mha = call_dims((8 * 512, 512, 128, 1.0), AttentionCall(128, 8, 1, launch))
        assert attention_time(spec, True, "bf16", mha) == pytest.approx(kernel + side, rel=1e-12)
        gqa = call_dims((8 * 512, 512, 128, 1.0), AttentionCall(128, 8, 4, launch))
        extra = 0.0 if impl.gqa_in_kernel else 2 * 2e-6 + 2 * q * 2 * (2 + 1 / 4) / 0.5e12
        assert attention_time(spec, True, "bf16", gqa) == pytest.approx(kernel + side + extra, rel=1e-12)


def test_head_dims_run_in_the_bucket_that_holds_them():
    assert FLASH_ATTENTION_2.tiles(False, 80, False) == (128, 64)  # hdim96's kernel
    assert FLASH_ATTENTION_3.tiles(False, 128, True) == (128, 128) and FLASH_ATTENTION_3.tiles(False, 128, False) \
        == (128, 176)
    assert FLASH_ATTENTION_3.tiles(True, 300, False) is None
    spec = parse_device_spec("g", SPEC, _locate)
    dims = call_dims((512, 512, 512, 1.0), AttentionCall(512, 1, 1, (full_launch(512, 512),)))
    assert attention_time(spec, False, "bf16", dims) is None  # beyond FlashAttention's head dims: the roofline


def test_device_facts_are_checked():
    assert parse_device_spec("g", SPEC, _locate).sm_count == 4
    with pytest.raises(InputError, match="unknown implementation 'flash-attention-9'; valid: flash-attention-2"):
        parse_device_spec("g", {**SPEC, "attention_kernels": "flash-attention-9"}, _locate)
    with pytest.raises(InputError, match="whole number"):
        parse_device_spec("g", {**SPEC, "sm_count": 1.5}, _locate)
    with pytest.raises(InputError, match="give a unit"):
        parse_device_spec("g", {**SPEC, "sfu_rate": 3e12}, _locate, Check())  # a user's file: units written
    no_tiles = parse_device_spec("g", {k: v for k, v in SPEC.items() if k != "sm_count"}, _locate)
    dims = call_dims((256, 256, 128, 1.0), AttentionCall(128, 1, 1, (full_launch(256, 256),)))
    assert attention_time(no_tiles, False, "bf16", dims) is None


def test_published_flashattention_tables_within_ten_percent():
    """benchmarks/kernel_tables.py: FlashAttention-2 on A100 (forward + backward) and FlashAttention-3 on H100
    (forward; backward), 72 published points, nothing fitted to them."""
    rel = sorted(abs(model / published - 1) for _key, _n, published, model in errors())
    assert len(rel) == 72
    assert float(np.median(rel)) <= 0.10


@settings(max_examples=40, deadline=None)
@given(launches=st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 3000), st.integers(-3000, 3000)),
                         min_size=1, max_size=3),
       rows=st.integers(1, 40), backward=st.booleans(), impl=st.sampled_from([FLASH_ATTENTION_2, FLASH_ATTENTION_3]),
       tail=st.sampled_from([5, 64, 10**9]))
def test_a_large_grid_walked_in_chunks_takes_the_time_of_the_whole_grid(launches, rows, backward, impl, tail):
    """Over :data:`EXACT_GRID` CTAs the grid is never built: summed in chunks, its tail scheduled by index. Forced
    on small grids (tiny chunks, any tail), it gives the whole grid's time."""
    import simulator.kernels.tiles as tiles

    spec = parse_device_spec("g", {**SPEC, "attention_kernels": impl.name}, _locate)
    calls = [Launch(*launch) for launch in launches]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tiles, "EXACT_TAIL", tail)
        whole = kernel_time(spec, impl, backward, "bf16", 128, rows, calls)
        m.setattr(tiles, "EXACT_GRID", 0)
        m.setattr(tiles, "_CHUNK", 7)
        chunked = kernel_time(spec, impl, backward, "bf16", 128, rows, calls)
    assert chunked == pytest.approx(whole, rel=1e-12)


def test_a_billion_token_kernel_stays_small_in_memory():
    """One causal forward over 2^30 queries (8M CTAs per head, 32 heads): the grid would be 2 GB of floats; walked
    in chunks it takes a few tens of MB, and the time is the work spread over the SMs (the tail is a rounding)."""
    import tracemalloc

    spec = parse_device_spec("g", {**SPEC, "attention_kernels": "flash-attention-3"}, _locate)
    launch = causal_launch(2**30, 2**30)
    tracemalloc.start()
    try:
        got = kernel_time(spec, FLASH_ATTENTION_3, False, "bf16", 128, 32, [launch])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200e6, peak
    t_clean, t_masked = tile_seconds(spec, FLASH_ATTENTION_3, False, "bf16", 128, 128, 128)
    blocks = 2**30 // 128
    tiles_ = blocks * (blocks + 1) // 2  # causal, 128 x 128 tiles: the diagonal ones masked
    io = 2 * 128 * 128 * 2 / (1e12 * 0.5 / 4)
    work = 32 * ((tiles_ - blocks) * t_clean + blocks * t_masked + blocks * (t_clean + io))
    assert got == pytest.approx(2e-6 + work / 4, rel=1e-6)
