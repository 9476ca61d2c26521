"""Bandwidth by message size: the curve, the flow network's weighted max-min, and the engine pricing a loopback
message at its size (closed forms), with the topology's errors."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cluster.size_curve import SizeCurve
from simulator.cluster.topology import build_cluster
from simulator.engine.core import simulate
from simulator.engine.network import FlowNetwork
from simulator.errors import InputError
from simulator.schedule.core import Schedule

CAPACITY = [10.0, 20.0, 30.0, 15.0, 40.0, 25.0]


def test_curve_hits_its_points_and_is_a_power_law_between_them():
    c = SizeCurve((1e3, 1e5, 1e7), (1e9, 4e9, 2e9))
    assert [c.at(s) for s in c.sizes] == [1e9, 4e9, 2e9]
    assert math.isclose(c.at(1e4), 2e9, rel_tol=1e-12)  # halfway in log size: the geometric mean
    assert c.at(1.0) == 1e9 and c.at(1e12) == 2e9  # flat beyond the ends
    assert c.weight(2e9, 1e7) == 1.0 and c.weight(2e9, 1e3) == 2.0


def test_unit_weights_give_the_unweighted_rates_exactly():
    routes = {0: (0, 1), 1: (1, 2), 2: (0, 2, 3), 3: (3, 3), 4: (4,)}
    plain, weighted = FlowNetwork(CAPACITY), FlowNetwork(CAPACITY)
    for f, r in routes.items():
        plain.add(f, r, 100.0, now=0.0)
        weighted.add(f, r, 100.0, now=0.0, weights=(1.0,) * len(r))
    plain.allocate(0.0)
    weighted.allocate(0.0)
    assert {f: weighted.rate(f) for f in routes} == {f: plain.rate(f) for f in routes}


flows_st = st.lists(st.tuples(st.lists(st.tuples(st.integers(0, len(CAPACITY) - 1), st.floats(0.25, 4.0)),
                                       min_size=1, max_size=4),
                              st.sampled_from([0.0, 0.0, 3.0]), st.booleans()),
                    min_size=1, max_size=10)


@settings(max_examples=150, deadline=None)
@given(flows_st)
def test_weighted_rates_are_max_min_fair(flows):
    """Max-min fairness over weighted loads, checked from its definition (not by running the same filling): no
    link carries more than its capacity (rate x weight, summed), and every flow has a bottleneck: a full link (or
    its cap) on which no flow goes faster than it."""
    net = FlowNetwork(CAPACITY)
    for i, (hops, cap, weighted) in enumerate(flows):
        route = tuple(link for link, _ in hops)
        net.add(i, route, 1.0, now=0.0, cap=cap, weights=tuple(w for _, w in hops) if weighted else None)
    net.allocate(0.0)
    rate = {i: net.rate(i) for i in range(len(flows))}
    use = [0.0] * len(CAPACITY)
    on: dict[int, set[int]] = {}
    for i, (hops, _, weighted) in enumerate(flows):
        for link, w in hops:
            use[link] += rate[i] * (w if weighted else 1.0)
            on.setdefault(link, set()).add(i)
    assert all(u <= c * (1 + 1e-9) for u, c in zip(use, CAPACITY, strict=True))
    for i, (hops, cap, _) in enumerate(flows):
        assert rate[i] > 0
        capped = cap > 0 and math.isclose(rate[i], cap, rel_tol=1e-9)
        bottleneck = any(math.isclose(use[link], CAPACITY[link], rel_tol=1e-9)
                         and all(rate[g] <= rate[i] * (1 + 1e-9) for g in on[link]) for link, _ in hops)
        assert capped or bottleneck, (i, rate, use)


events_st = st.lists(st.tuples(st.booleans(), st.lists(st.tuples(st.integers(0, len(CAPACITY) - 1),
                                                                 st.floats(0.25, 4.0)), min_size=1, max_size=4),
                               st.sampled_from([0.0, 0.0, 3.0]), st.booleans()), min_size=1, max_size=25)


@settings(max_examples=100, deadline=None)
@given(events_st)
def test_incremental_weighted_rates_equal_a_fresh_allocation(events):
    """Flows with and without weights starting and finishing: after every allocation, each active flow's rate is
    the one a network holding only the active flows gives them at once (the components recomputed, the slack links
    skipped: none of it changes a weighted rate)."""
    net = FlowNetwork(CAPACITY)
    active: dict[int, tuple[tuple[int, ...], float, tuple[float, ...] | None]] = {}
    for i, (start, hops, cap, weighted) in enumerate(events):
        if start or not active:
            route, weights = tuple(link for link, _ in hops), tuple(w for _, w in hops) if weighted else None
            net.add(i, route, 1.0, now=0.0, cap=cap, weights=weights)
            active[i] = (route, cap, weights)
        else:
            gone = sorted(active)[i % len(active)]
            net.remove(gone)
            del active[gone]
        net.allocate(0.0)
        fresh = FlowNetwork(CAPACITY)
        for f, (route, cap_, weights) in active.items():
            fresh.add(f, route, 1.0, now=0.0, cap=cap_, weights=weights)
        fresh.allocate(0.0)
        for f in active:
            assert math.isclose(net.rate(f), fresh.rate(f), rel_tol=1e-12), (f, active)


def _loopback(by_size: dict[str, list[object]] | None, copy: dict[str, list[object]] | None = None) -> dict:
    """Two ranks on one host, a star as calibrate writes it: per-flow links of 2 GB/s, an aggregate of 3 GB/s."""
    agg: dict[str, object] = {"src": "h.tx", "dst": "h.rx", "bandwidth": "3 GB/s"}
    if by_size is not None:
        agg["bandwidth_by_size"] = by_size
    raw: dict = {"devices": {"d": {"peak_flops": {"fp32": "1 TFLOP/s"}, "mem_bw": "10 GB/s", "mem": "1 GiB"}},
                 "nodes": [{"name": f"h.r{r}", "kind": "gpu", "device": "d"} for r in (0, 1)]
                 + [{"name": "h.tx", "kind": "switch"}, {"name": "h.rx", "kind": "switch"}],
                 "links": [{"src": f"h.r{r}", "dst": "h.tx", "bandwidth": "2 GB/s"} for r in (0, 1)] + [agg]
                 + [{"src": "h.rx", "dst": f"h.r{r}", "bandwidth": "2 GB/s"} for r in (0, 1)],
                 "message_overhead": "100 us"}
    if copy is not None:
        raw.update(host_cores={"h": 2}, host_copy_bw={"h": "4 GB/s"}, host_copy_bw_by_size={"h": copy})
    return raw


def _exchange(nbytes: float) -> Schedule:
    s = Schedule(2)
    s.add_transfer(0, 1, nbytes, "a")
    s.add_transfer(1, 0, nbytes, "b")
    return s


@pytest.mark.parametrize("nbytes", [1e5, 1e6, 3e6, 1e8, 1e9])
def test_an_exchange_takes_the_bandwidth_measured_at_its_size(nbytes):
    """Both ranks send n bytes at once: the aggregate binds, at the curve's bandwidth for n (1.5 GB/s at 1 MB,
    2.4 GB/s from 100 MB, a power law between, flat beyond): 100 us + 2 n / B(n)."""
    curve = {"bytes": [1e6, 1e8], "bandwidth": ["1.5 GB/s", "2.4 GB/s"]}
    cluster = build_cluster(_loopback(curve), "t.yaml")
    expected = 100e-6 + 2 * nbytes / SizeCurve((1e6, 1e8), (1.5e9, 2.4e9)).at(nbytes)
    assert math.isclose(simulate(_exchange(nbytes), cluster).makespan, expected, rel_tol=1e-12)
    plain = build_cluster(_loopback(None), "t.yaml")  # the nominal 3 GB/s without the curve
    assert math.isclose(simulate(_exchange(nbytes), plain).makespan, 100e-6 + 2 * nbytes / 3e9, rel_tol=1e-12)


def test_a_lone_message_is_held_by_its_own_link_not_the_curve():
    """A curve above the per-flow links' 2 GB/s leaves a lone message at 2 GB/s."""
    curve = {"bytes": [1e6], "bandwidth": ["2.5 GB/s"]}
    s = Schedule(2)
    s.add_transfer(0, 1, 1e8, "a")
    assert math.isclose(simulate(s, build_cluster(_loopback(curve), "t.yaml")).makespan, 100e-6 + 1e8 / 2e9,
                        rel_tol=1e-12)


def test_host_copies_cost_what_their_size_costs():
    """With the host's copies measured over sizes (1 GB/s per core at any size below 4 GB/s nominal), an exchange
    on 2 cores copies 4 n bytes at 2 GB/s (the cores bind, not the 3 GB/s aggregate): 100 us + 4 n / 2 GB/s."""
    cluster = build_cluster(_loopback(None, {"bytes": [1e6], "bandwidth": ["1 GB/s"]}), "t.yaml")
    assert math.isclose(simulate(_exchange(1e8), cluster).makespan, 100e-6 + 4e8 / 2e9, rel_tol=1e-12)


@pytest.mark.parametrize(("curve", "field", "says"), [
    ({"bytes": [1e6, 1e5], "bandwidth": ["1 GB/s", "2 GB/s"]}, "links.2.bandwidth_by_size.bytes.1", "increase"),
    ({"bytes": [1e6], "bandwidth": ["1 GB/s", "2 GB/s"]}, "links.2.bandwidth_by_size.bandwidth", "one bandwidth"),
    ({"bytes": [1e6], "bandwidth": ["fast"]}, "links.2.bandwidth_by_size.bandwidth.0", "fast"),
    ([1, 2], "links.2.bandwidth_by_size", "{bytes"),
])
def test_a_bad_curve_names_its_field(curve, field, says):
    with pytest.raises(InputError) as err:
        build_cluster(_loopback(curve), "t.yaml")
    assert err.value.field == field and says in str(err.value)


def test_host_copy_curve_needs_the_nominal_figure():
    raw = _loopback(None, {"bytes": [1e6], "bandwidth": ["1 GB/s"]})
    del raw["host_copy_bw"]
    with pytest.raises(InputError) as err:
        build_cluster(raw, "t.yaml")
    assert err.value.field == "host_copy_bw_by_size.h" and "host_copy_bw" in str(err.value)


def test_the_engine_predicts_calibrates_own_exchanges_at_every_size(tmp_path):
    """A calibration's exchanges, whatever their bandwidth at each size (here not monotone in the size, as
    measured on loopback), come back from the topology it writes: the engine's exchange at each size takes the
    measured time, the cores never binding it (the processes used less CPU than the host has)."""
    import argparse

    from simulator.cluster.topology import load_topology
    from simulator.distributed.calibrate import EXCHANGE_SIZES, _topology

    args = argparse.Namespace(min_r2=0.9, backend="gloo", heads=16, head_dim=128, kernels_from=None)
    pp = [(8 * 4**k, 50e-6 + 8 * 4**k / 1e9) for k in range(12)]  # 1 GB/s per flow
    p2p = 300e-6  # a small exchange after a kernel: the fixed cost of a standalone transfer
    aggregate = [1.2e9, 1.9e9, 1.6e9, 1.3e9, 1.4e9, 1.8e9]
    exchanges = [(n, p2p + 2 * n / b, 0.9 * (p2p + 2 * n / b)) for n, b in zip(EXCHANGE_SIZES, aggregate, strict=True)]
    attend = [(float(b), 100e-6 + b / 9e9) for b in (4e6, 16e6, 64e6, 256e6, 1e9)]
    text = _topology(args, 2, pp, exchanges, (1e-3, 0.0, p2p), 100e-6, attend, attend, [1e11, 5e10],
                     (2, 1.8e10, 5e9), [])
    path = tmp_path / "t.yaml"
    path.write_text(text)
    cluster = load_topology(str(path))
    for n, wall, _ in exchanges:
        assert math.isclose(simulate(_exchange(n), cluster).makespan, wall, rel_tol=1e-5), n
    assert "Ring exchanges" in text and "bandwidth_by_size" in text and "host_copy_bw_by_size" in text


def test_a_weighted_flow_leaves_the_other_components_bit_identical():
    """Flows that share no link with a weighted one get exactly the rates they get without it, and a link's load
    counts a weighted flow at its rate times its weights there."""
    routes = {0: (0, 1), 1: (1, 2), 2: (1,)}
    plain, mixed = FlowNetwork(CAPACITY), FlowNetwork(CAPACITY)
    for net in (plain, mixed):
        for f, r in routes.items():
            net.add(f, r, 100.0, now=0.0)
    mixed.add(9, (3, 4, 3), 100.0, now=0.0, weights=(2.0, 0.5, 1.0))  # crosses link 3 twice
    plain.allocate(0.0)
    mixed.allocate(0.0)
    assert {f: mixed.rate(f) for f in routes} == {f: plain.rate(f) for f in routes}
    assert mixed.rate(9) == 15.0 / 3.0  # link 3: 15 B/s over weights 2 + 1
    assert mixed.load(3) == 15.0 and mixed.load(4) == 2.5


@pytest.mark.parametrize("weights", [(1.0,), (1.0, 0.0), (1.0, float("inf"))])
def test_bad_weights_are_refused_where_they_are_given(weights):
    with pytest.raises(ValueError, match="finite weight > 0 per link"):
        FlowNetwork(CAPACITY).add(0, (0, 1), 1.0, now=0.0, weights=weights)


def test_a_curve_key_misspelt_is_named():
    with pytest.raises(InputError) as err:
        build_cluster(_loopback({"bytes": [1e6], "bandwidths": ["1 GB/s"]}), "t.yaml")
    assert err.value.field == "links.2.bandwidth_by_size.bandwidths" and "unknown key" in str(err.value)


def test_curves_survive_a_rendered_topology_and_show_in_its_summary(tmp_path):
    """A topology written back (the fitted-topology writer) keeps its curves; `topo show` lists them."""
    from simulator.cluster.summary import summarize
    from simulator.nccl.render import render_fitted

    cluster = build_cluster(_loopback({"bytes": [1e6, 1e8], "bandwidth": ["1.5 GB/s", "2.4 GB/s"]},
                                      {"bytes": [1e6], "bandwidth": ["1 GB/s"]}), "t.yaml")
    path = tmp_path / "back.yaml"
    path.write_text(render_fitted(cluster, ["written back"]))
    from simulator.cluster.topology import load_topology

    again = load_topology(str(path))
    assert again.graph.edges["h.tx", "h.rx"]["by_size"] == cluster.graph.edges["h.tx", "h.rx"]["by_size"]
    assert again.host_copy_bw_by_size == cluster.host_copy_bw_by_size
    assert simulate(_exchange(3e6), again).makespan == simulate(_exchange(3e6), cluster).makespan
    assert "1 x by message size: 1 MB 1.5 GB/s, 100 MB 2.4 GB/s" in summarize(cluster)
