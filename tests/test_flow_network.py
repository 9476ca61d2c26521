"""The flow network's incremental max-min (per connected component, counts kept per link, the next finish kept
between allocations) against the whole-network reference :func:`max_min_rates`, and its finishing order against a
dense replay."""

from __future__ import annotations

import math
from collections.abc import Hashable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.network import FlowNetwork, max_min_rates

LINKS = 6
CAPACITY = [10.0, 20.0, 30.0, 15.0, 40.0, 25.0]

routes_st = st.lists(st.integers(0, LINKS - 1), min_size=1, max_size=4).map(tuple)  # repeats: a link crossed twice
events_st = st.lists(st.tuples(st.booleans(), routes_st, st.floats(1.0, 1e3), st.sampled_from([0.0, 0.0, 5.0, 12.5])),
                     min_size=1, max_size=25)


def _assert_reference_rates(net: FlowNetwork, active: dict[int, tuple[tuple[int, ...], float]],
                            capacity: list[float]) -> None:
    """Every active flow (its route, its cap: 0 for none) rated exactly as the reference rates them (a cap as a
    link of its own)."""
    caps = list(capacity)
    full: dict[Hashable, tuple[int, ...]] = {}
    for f, (r, c) in active.items():
        if c > 0:
            caps.append(c)
            r = (*r, len(caps) - 1)
        full[f] = r
    assert {f: net.rate(f) for f in active} == max_min_rates(full, caps)


@settings(max_examples=150, deadline=None)
@given(events_st)
def test_incremental_rates_equal_max_min_over_all_active_flows(events):
    """After any sequence of flows starting (with or without a rate cap) and finishing, every active flow's rate
    is exactly the max-min fair rate computed afresh over all active flows (caps as private links)."""
    net = FlowNetwork(CAPACITY)
    active: dict[int, tuple[tuple[int, ...], float]] = {}
    for i, (start, route, nbytes, cap) in enumerate(events):
        if start or not active:
            net.add(i, route, nbytes, now=0.0, cap=cap)
            active[i] = (route, cap)
        else:
            gone = sorted(active)[i % len(active)]
            net.remove(gone)
            del active[gone]
        net.allocate(0.0)
        _assert_reference_rates(net, active, CAPACITY)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_ties_by_the_hundred_then_finish_after_finish_keep_the_reference_rates(seed):
    """Many flows (some capped) on few links of capacities that divide unevenly (a share recomputed after a flow
    freezes at a tie can round an ulp below the last one: the filling's heap must still pop links in the
    reference's order), drained a finish or two at a time, now and then a flow starting beside them (a component
    that only lost flows is filled on from the steps before them; one a flow joined, afresh): after every
    allocation each flow's rate is the reference's float exactly."""
    rng = np.random.default_rng(seed)
    capacity = rng.choice([10.0 / 3.0, 7.1, 0.3, 1.0 / 7.0, 25.0], size=8).tolist()
    net = FlowNetwork(capacity)
    active: dict[int, tuple[tuple[int, ...], float]] = {}

    def start(f: int) -> None:
        route = tuple(int(x) for x in rng.choice(8, size=int(rng.integers(1, 5)), replace=False))
        cap = float(rng.choice([0.0, 0.0, 0.0, 0.05, 1.0 / 3.0]))
        net.add(f, route, 1.0, now=0.0, cap=cap)
        active[f] = (route, cap)

    flows = int(rng.integers(20, 120))
    for f in range(flows):
        start(f)
    while active:
        net.allocate(0.0)
        _assert_reference_rates(net, active, capacity)
        if rng.random() < 0.2:
            start(flows)
            flows += 1
        for _ in range(min(len(active), int(rng.integers(1, 3)))):
            gone = sorted(active)[int(rng.integers(len(active)))]
            net.remove(gone)
            del active[gone]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(routes_st, st.floats(1.0, 1e3)), min_size=1, max_size=12))
def test_flows_finish_when_their_bytes_run_out(flows):
    """Draining every flow to the end, finish by finish: each flow's finish is where its bytes, at the rates it
    had along the way (recomputed densely after every finish), run out; flows due together finish together."""
    net = FlowNetwork(CAPACITY)
    left = {}
    for i, (route, nbytes) in enumerate(flows):
        net.add(i, route, nbytes, now=0.0)
        left[i] = (route, nbytes)
    now = 0.0
    net.allocate(now)
    while left:
        when, due = net.next_finish()
        rates = max_min_rates({f: r for f, (r, _) in left.items()}, CAPACITY)
        first = min(b / rates[f] for f, (_, b) in left.items())
        assert math.isclose(when, now + first, rel_tol=1e-9)
        dense_due = sorted(f for f, (_, b) in left.items() if now + b / rates[f] - (now + first) <= 1e-9 * when)
        assert due and set(due) <= set(dense_due)  # the engine groups finishes within FINISH_RTOL, tighter
        for f, (r, b) in list(left.items()):
            left[f] = (r, b - rates[f] * (when - now))
        now = when
        for f in due:
            net.remove(f)
            del left[f]
        net.allocate(now)


def test_a_recurring_component_gets_the_rates_of_the_reference_each_time():
    """A pipeline meets the same component again with new flows (new keys, reused slots and cap links): its rates
    equal the whole-network reference exactly every time."""
    net = FlowNetwork(CAPACITY)
    shapes = [((0, 1), 0.0), ((1, 2), 7.0), ((0, 2), 0.0), ((1, 2), 7.0)]
    for round_ in range(3):
        ids = [100 * round_ + i for i in range(len(shapes))]
        for f, (route, cap) in zip(ids, shapes, strict=True):
            net.add(f, route, 1e3, now=float(round_), cap=cap)
        net.allocate(float(round_))
        capacity = [*CAPACITY, 7.0, 7.0]
        expected = max_min_rates({0: (0, 1), 1: (1, 2, 6), 2: (0, 2), 3: (1, 2, 7)}, capacity)
        assert [net.rate(f) for f in ids] == [expected[i] for i in range(len(shapes))]
        for f in ids:
            net.remove(f)


def test_many_long_flows_grow_the_arrays_and_keep_the_reference_rates():
    """Hundreds of flows (past the first slots), routes longer than the first route width (the incidence lists
    re-laid out), caps handing out private links past the first link block, flows finishing and their slots
    reused: after every allocation each active flow's rate is the reference's exactly."""
    rng = np.random.default_rng(7)
    capacity = rng.uniform(1.0, 100.0, size=40).tolist()
    net = FlowNetwork(capacity)
    active: dict[int, tuple[tuple[int, ...], float]] = {}
    for i in range(600):
        if len(active) < 5 or rng.random() < 0.6:
            route = tuple(int(x) for x in rng.integers(0, len(capacity), size=int(rng.integers(1, 13))))
            cap = float(rng.choice([0.0, 0.0, 3.0, 40.0]))
            net.add(i, route, 1e3, now=0.0, cap=cap)
            active[i] = (route, cap)
        else:
            gone = sorted(active)[int(rng.integers(len(active)))]
            net.remove(gone)
            del active[gone]
        if i % 7 and i < 590:
            continue  # several changes per allocation
        net.allocate(0.0)
        _assert_reference_rates(net, active, capacity)
    assert len(active) > 64  # past the first block of slots


def test_a_finished_flows_prediction_does_not_finish_the_flow_that_reuses_its_slot():
    net = FlowNetwork([10.0])
    net.add(1, (0,), 10.0, now=0.0)
    net.allocate(0.0)
    assert net.next_finish() == (1.0, [1])
    net.remove(1)
    net.add(2, (0,), 50.0, now=0.5)  # the same slot, rated once more (the same rate as its predecessor)
    net.allocate(0.5)
    assert net.next_finish() == (5.5, [2])
    net.remove(2)
    net.allocate(5.5)
    assert net.next_finish() == (math.inf, [])


def test_a_flow_taking_a_finished_flows_slot_has_no_finish_before_it_is_rated():
    net = FlowNetwork([10.0])
    net.add(1, (0,), 10.0, now=0.0)
    net.allocate(0.0)
    net.remove(1)
    net.add(2, (0,), 50.0, now=0.5)  # flow 1's slot; its prediction (1.0) is not flow 2's
    assert net.next_finish() == (math.inf, [])


@pytest.mark.parametrize("weighted", [False, True])
def test_churn_between_allocations_then_rates_finishes_and_loads_match_a_reference(weighted):
    """Flows (capped ones among them; weighted ones in the second run) coming and going many times between two
    allocations, past the first block of slots: the allocation then rates every active flow as the reference does
    (``max_min_rates``; weighted: a fresh network holding only the active flows), the next finish is the earliest
    of bytes / rate, and each link's load is the sum of its flows' rates (weighted where they are)."""
    rng = np.random.default_rng(11)
    capacity = rng.uniform(5.0, 50.0, size=12).tolist()
    net = FlowNetwork(capacity)
    active: dict[int, tuple[tuple[int, ...], float, float, tuple[float, ...] | None]] = {}
    for i in range(400):
        if len(active) < 3 or rng.random() < 0.6:
            route = tuple(int(x) for x in rng.integers(0, len(capacity), size=int(rng.integers(1, 11))))
            cap = float(rng.choice([0.0, 0.0, 4.0]))
            weights = tuple(float(w) for w in rng.uniform(0.5, 2.0, size=len(route))) if weighted and i % 3 else None
            nbytes = float(rng.uniform(1.0, 100.0))
            net.add(i, route, nbytes, now=0.0, cap=cap, weights=weights)
            active[i] = (route, cap, nbytes, weights)
        else:
            gone = sorted(active)[int(rng.integers(len(active)))]
            net.remove(gone)
            del active[gone]
    net.allocate(0.0)
    assert len(active) > 64
    rates = {f: net.rate(f) for f in active}
    if weighted:
        fresh = FlowNetwork(capacity)
        for f, (r, c, b, w) in active.items():
            fresh.add(f, r, b, now=0.0, cap=c, weights=w)
        fresh.allocate(0.0)
        for f in active:
            assert math.isclose(rates[f], fresh.rate(f), rel_tol=1e-12)
    else:
        caps = list(capacity)
        full: dict[int, tuple[int, ...]] = {}
        for f, (r, c, _, _) in active.items():
            if c > 0:
                caps.append(c)
                r = (*r, len(caps) - 1)
            full[f] = r
        assert rates == max_min_rates(full, caps)
    when, due = net.next_finish()
    first = min(b / rates[f] for f, (_, _, b, _) in active.items())
    assert math.isclose(when, first, rel_tol=1e-12)
    assert due == sorted(f for f, (_, _, b, _) in active.items() if b / rates[f] - first <= 1e-12 * first)
    for link in range(len(capacity)):
        used = sum(rates[f] * (1.0 if w is None else w[i]) for f, (r, _, _, w) in active.items()
                   for i, x in enumerate(r) if x == link)
        assert math.isclose(net.load(link), used, rel_tol=1e-12, abs_tol=1e-9)
        assert net.load(link) <= capacity[link] * (1 + 1e-9)


def test_a_route_naming_a_link_the_network_does_not_have_is_refused():
    net = FlowNetwork([1.0, 2.0])
    with pytest.raises(ValueError, match=r"route \(0, 2\) names a link outside 0..1"):
        net.add(0, (0, 2), 1.0, now=0.0)
    with pytest.raises(ValueError, match="outside"):
        net.add(1, (-1,), 1.0, now=0.0)
    assert net.load(7) == 0.0
