"""The engine's compiled passes over columns (simulator.schedule.colpass) against the numpy forms they replace: the
timeline
order (a lexsort by start, rank, op), each rank's last end (``np.maximum.at``), dependents as CSR, and their
refusals; the stream order's added dependencies against their definition."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.schedule.colpass import dependents, group_max, stream_ordered, timeline_order
from simulator.schedule.op import OP_KINDS, P2P_STREAMS


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.integers(0, 300), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_timeline_order_is_the_lexsort(p, n, instants, seed):
    """Few distinct start times (the ops of one instant: runs long and short against the rank count, 0.0 and
    -0.0 among them), ranks in any order, some ops never ended: the order is the lexsort's, op for op."""
    rng = np.random.default_rng(seed)
    starts = rng.choice(np.array([0.0, -0.0, 1e-9, 2.5, 7.0, 1e300])[:instants + 1], size=n)
    ranks = rng.integers(0, p, size=n).astype(np.int32)
    ids = np.flatnonzero(rng.random(n) < 0.9)
    want = ids[np.lexsort((ids, ranks[ids], starts[ids]))]
    assert timeline_order(starts, ranks, ids, p).tolist() == want.tolist()


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 30), st.lists(st.floats(0, 1e6), max_size=200), st.integers(0, 2**32 - 1))
def test_group_max_is_maximum_at(k, values, seed):
    codes = np.random.default_rng(seed).integers(0, k, size=len(values))
    vals = np.array(values, dtype=float)
    want = np.full(k, -np.inf)
    np.maximum.at(want, codes, vals)
    got, seen = group_max(codes, vals, k)
    assert got.tolist() == want.tolist()
    assert seen.tolist() == np.isin(np.arange(k), codes).tolist()
    with pytest.raises(ValueError, match="codes outside"):
        group_max(np.array([k]), np.array([1.0]), k)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1000), max_size=4), max_size=60))
def test_dependents_are_each_ops_children_in_id_order(deps):
    """Op i depends on earlier ops (the drawn numbers modulo i): every op's children, in op-id order."""
    deps = [[d % i for d in ds] if i else [] for i, ds in enumerate(deps)]
    counts = np.array([len(ds) for ds in deps], dtype=np.int32)
    parents = np.array([d for ds in deps for d in ds], dtype=np.int64)
    kids, first = dependents(counts, parents)
    for d in range(len(deps)):
        assert kids[first[d]:first[d + 1]].tolist() == [i for i, ds in enumerate(deps) for x in ds if x == d]


def test_dependents_refuse_counts_and_ops_that_do_not_add_up():
    with pytest.raises(ValueError, match="do not add up"):
        dependents(np.array([1, 1], dtype=np.int32), np.array([0], dtype=np.int64))
    with pytest.raises(ValueError, match="do not add up"):
        dependents(np.array([2, -1], dtype=np.int32), np.array([0], dtype=np.int64))
    with pytest.raises(ValueError, match="does not name an op"):
        dependents(np.array([0, 1], dtype=np.int32), np.array([5], dtype=np.int64))


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 5), st.integers(0, 120), st.integers(0, 2**32 - 1), st.sampled_from(P2P_STREAMS))
def test_stream_order_is_its_definition(p, n, seed, p2p):
    """Random ops of every kind on ``p`` ranks (some ranks ordered), transfers matched in pairs, some in a
    collective, deps on earlier ops: each launch, and each send or receive outside a collective, of an ordered rank
    depends, after its own dependencies, on the last compute or merge before it on its rank, unless it did already;
    such a send or receive also depends on every end of its rank's previous group (ends with no compute, merge or launch
    between them on the rank, none depending on another) and on the end before it in its group with the same peer and
    direction, those it did not already (``per-peer``: on its rank's end before it with the same peer); nothing else
    changes."""
    rng = np.random.default_rng(seed)
    kinds = [OP_KINDS[k] for k in rng.integers(0, len(OP_KINDS), size=n)]
    rank = rng.integers(0, p, size=n)
    match = np.full(n, -1)
    coll = rng.random(n) < 0.3
    ends = [i for i, k in enumerate(kinds) if k in ("send", "recv")]
    for a, b in zip(ends[::2], ends[1::2], strict=False):  # pairs as send then recv
        kinds[a], kinds[b], match[a], match[b] = "send", "recv", b, a
    if len(ends) % 2:
        kinds[ends[-1]] = "compute"
    deps = [sorted({int(d) % i for d in rng.integers(0, 1000, size=rng.integers(0, 3))}) if i else []
            for i in range(n)]
    ordered = rng.random(p) < 0.7
    want, last, group, previous = [], {}, {}, {}  # group: a rank's open group; previous: its group before
    to_peer: dict[tuple[int, int], int] = {}  # per-peer: a rank's last end with a peer
    for i, k in enumerate(kinds):
        ds, r = list(deps[i]), rank[i]
        own = k in ("send", "recv") and not coll[i if k == "send" else match[i]]
        if (k in ("compute", "merge", "launch") or (own and set(deps[i]) & set(group.get(r, [])))) and group.get(r):
            previous[r], group[r] = group[r], []  # a kernel or launch closes the group; so does an end after its own
        if k in ("compute", "merge"):
            last[r] = i
        elif (k == "launch" or own) and ordered[r]:
            gains = [last[r]] if r in last else []
            if own and p2p == "batched":  # and the end before it in its group with the same peer and direction
                same = [d for d in group.get(r, []) if (kinds[d], rank[match[d]]) == (k, rank[match[i]])]
                gains += previous.get(r, []) + same[-1:]
            elif own:
                pair = (r, int(rank[match[i]]))
                gains += [to_peer[pair]] if pair in to_peer else []
                to_peer[pair] = i
            ds += [d for d in gains if d not in ds]
            if own:
                group.setdefault(r, []).append(i)
        want.append(ds)
    counts = np.array([len(d) for d in deps], dtype=np.int32)
    parents = np.array([d for ds in deps for d in ds], dtype=np.int32)
    kind = np.array([OP_KINDS.index(k) for k in kinds], dtype=np.uint8)
    got_counts, got_parents, added = stream_ordered(counts, parents, kind, rank, match, coll, ordered, p2p)
    bounds = np.concatenate(([0], np.cumsum(got_counts)))
    assert [got_parents[bounds[i]:bounds[i + 1]].tolist() for i in range(n)] == want
    assert added == sum(len(w) > len(d) for w, d in zip(want, deps, strict=True))
