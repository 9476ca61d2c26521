"""Each layout's kernels as the reference implementations launch them (simulator.kernels.launches): the launches
hold exactly each block's unmasked pairs, the arrays equal the block-by-block rules, the reference code's shapes,
and zigzag and striped differing where the hardware makes them differ."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.algorithms import Layout
from simulator.algorithms.prefill import build_prefill
from simulator.cluster.topology import load_topology
from simulator.engine.core import simulate
from simulator.kernels.launches import block_launches, gathered_launches, launch_matrix, sequence_launch
from simulator.kernels.tiles import Launch, call_of, causal_launch, full_launch, launch_pairs
from simulator.workloads.layouts import LAYOUTS, layout_runs, pair_matrix, rank_pairs
from simulator.workloads.prefill_shape import PrefillShape


@settings(max_examples=60, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), p=st.integers(1, 8), extra=st.integers(0, 50), causal=st.booleans())
def test_launches_hold_the_blocks_pairs(layout, p, extra, causal):
    n = p + extra  # uneven shards too
    runs = layout_runs(layout, n, p)
    pairs = pair_matrix(runs, causal)
    nq, nk, off = launch_matrix(layout, runs, causal)
    for r in range(p):
        for j in range(p):
            launches = block_launches(layout, runs[r], runs[j], causal)
            assert sum(launch_pairs(lc) for lc in launches) == pairs[r, j]
            assert launches == ((Launch(int(nq[r, j]), int(nk[r, j]), int(off[r, j])),) if nq[r, j] else ())
        gathered = gathered_launches(layout, runs[r], runs, n, causal)
        assert sum(launch_pairs(lc) for lc in gathered) == rank_pairs(runs[r], n, causal)
    assert sum(launch_pairs(lc) for lc in sequence_launch(n, causal)) == (n * (n + 1) // 2 if causal else n * n)


def test_the_reference_kernels_of_each_layout():
    """P = 4, 64 tokens (equal shards of 16, zigzag chunks of 8): rank 1 against each shard."""
    runs = {layout: layout_runs(layout, 64, 4) for layout in LAYOUTS}
    zig = [block_launches("zigzag", runs["zigzag"][1], runs["zigzag"][j], True) for j in range(4)]
    # step 0 causal over both chunks; an earlier shard's first chunk against all queries; a later shard whole
    # against the second chunk of queries; all unmasked but the first
    assert zig == [(full_launch(16, 8),), (causal_launch(16, 16, 0),), (full_launch(8, 16),), (full_launch(8, 16),)]
    stripe = [block_launches("striped", runs["striped"][1], runs["striped"][j], True) for j in range(4)]
    # every step causal: the earlier and own shards whole, the later ones q[1:] against k[:-1]
    assert stripe == [(causal_launch(16, 16, 0),)] * 2 + [(causal_launch(15, 15, 0),)] * 2
    ring = [block_launches("contiguous", runs["contiguous"][1], runs["contiguous"][j], True) for j in range(4)]
    assert ring == [(full_launch(16, 16),), (causal_launch(16, 16, 0),), (), ()]
    # no mask: every layout, every step one unmasked launch (the zigzag and stripe functions require a mask)
    assert all(block_launches(layout, runs[layout][1], runs[layout][j], False) == (full_launch(16, 16),)
               for layout in LAYOUTS for j in range(4))
    # allgather (zigzag): each chunk against the keys up to its end, causal from the bottom right
    assert gathered_launches("zigzag", runs["zigzag"][1], runs["zigzag"], 64, True) == (
        causal_launch(8, 16), causal_launch(8, 56))


def test_ring_ops_carry_their_launches_and_merges():
    s = PrefillShape(1, 8, 64, 8, 64, "bf16", causal=True, layout="zigzag", backward=True)
    sched = build_prefill("ring", {"overlap": True}, s, Layout((0,) * 4))
    calls = [(op.fn, op.rank, call_of(op.dims)) for op in sched.ops if op.fn in ("attn-fwd", "attn-bwd")]
    assert len(calls) == 2 * 4 * 4  # every zigzag block has pairs
    fwd = [c for fn, r, c in calls if fn == "attn-fwd" and r == 1]
    assert all(c is not None for c in fwd)
    # rank 1 holds shards 1, 0, 3, 2 in turn: its own (causal), an earlier one, two later ones
    assert [c.launches for c in fwd if c is not None] == [(causal_launch(16, 16, 0),), (full_launch(16, 8),),
                                                          (full_launch(8, 16),), (full_launch(8, 16),)]
    assert fwd[0] is not None and fwd[1] is not None
    first, later = fwd[0].extra_bytes, fwd[1].extra_bytes
    assert first == s.merge_extra(16, True)[0] and later > first  # the first step converts, the others merge
    assert all(c is not None and c.rows == 8 and c.group == 1 for _, _, c in calls)


@pytest.fixture(scope="module")
def a100():
    return load_topology("dgx-a100", {"nodes": 1})


@pytest.mark.parametrize("backward", [False, True])
def test_zigzag_and_striped_differ_on_a_gpu(a100, backward):
    """8 A100s, Llama-3-8B attention, 64k tokens: zigzag runs unmasked half blocks, striped a masked diagonal in
    every block; striped is the slower, by more than a percent."""
    def latency(layout):
        s = PrefillShape(1, 32, 128, 8, 65536, "bf16", causal=True, layout=layout, backward=backward)
        return simulate(build_prefill("ring", {"overlap": True}, s, Layout((0,) * 8)), a100).makespan
    zig, stripe = latency("zigzag"), latency("striped")
    assert stripe > 1.03 * zig
