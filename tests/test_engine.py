"""The flow-level engine against closed forms, exactly (1e-9 relative)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from conftest import star

from simulator.cluster.topology import build_cluster, load_topology, override_devices
from simulator.engine.core import simulate
from simulator.engine.reference import simulate_reference
from simulator.schedule.core import Schedule

# the closed forms below are the roofline at datasheet rates (efficiencies 1)
DATASHEET_RATES = {"h100-sxm": {"eff_mem": 1.0, "eff_flops": 1.0}}

REL = 1e-9


def test_uncontended_transfer_is_overhead_plus_latency_plus_drain():
    raw = {
        "nodes": [{"name": "a", "kind": "gpu", "device": "h100-sxm"}, {"name": "s1", "kind": "switch"},
                  {"name": "s2", "kind": "switch"}, {"name": "b", "kind": "gpu", "device": "h100-sxm"}],
        "links": [{"a": "a", "b": "s1", "bandwidth": "100 GB/s", "latency": "1 us"},
                  {"a": "s1", "b": "s2", "bandwidth": "25 GB/s", "latency": "2.5 us"},
                  {"a": "s2", "b": "b", "bandwidth": "400 Gb/s", "latency": "0.7 us"}],
        "message_overhead": "3 us",
    }
    cluster = build_cluster(raw, "<t>")
    sched = Schedule(2, placement=("a", "b"))
    nbytes = 123_456_789
    sched.add_transfer(0, 1, nbytes, "x")
    res = simulate(sched, cluster)
    expected = 3e-6 + (1e-6 + 2.5e-6 + 0.7e-6) + nbytes / 25e9
    assert math.isclose(res.makespan, expected, rel_tol=REL)


@pytest.mark.parametrize("k", [1, 2, 3, 7, 16])
def test_k_equal_flows_into_one_bottleneck_finish_together(k):
    cluster = star(k + 1, bw="10 GB/s", lat="1 us", overhead="2 us")
    sched = Schedule(k + 1, placement=tuple(f"h{i}" for i in range(k + 1)))
    for i in range(1, k + 1):
        sched.add_transfer(i, 0, 1e9, f"f{i}")  # all into h0: the s->h0 link is the bottleneck
    res = simulate(sched, cluster)
    drain = 1e9 / 10e9
    ends = [r.end for r in res.timeline if r.kind == "recv"]
    for end in ends:
        assert math.isclose(end, 2e-6 + 2e-6 + k * drain, rel_tol=REL)


def _maxmin_cluster():
    nodes = [{"name": n, "kind": "gpu", "device": "h100-sxm"} for n in ("h0", "h1", "h2")]
    nodes.append({"name": "s", "kind": "switch"})
    links = [{"src": "h0", "dst": "s", "bandwidth": "10 GB/s"}, {"src": "s", "dst": "h1", "bandwidth": "10 GB/s"},
             {"src": "s", "dst": "h2", "bandwidth": "4 GB/s"}, {"src": "s", "dst": "h0", "bandwidth": "10 GB/s"},
             {"src": "h1", "dst": "s", "bandwidth": "10 GB/s"}, {"src": "h2", "dst": "s", "bandwidth": "4 GB/s"}]
    return build_cluster({"nodes": nodes, "links": links}, "<maxmin>")


def test_max_min_fairness_known_answer():
    sched = Schedule(3, placement=("h0", "h1", "h2"))
    x, _ = sched.add_transfer(0, 1, 3e9, "X")
    y, _ = sched.add_transfer(0, 2, 1e9, "Y")
    ends = simulate(sched, _maxmin_cluster()).op_ends()
    assert math.isclose(ends[y], 0.25, rel_tol=REL)  # Y: 4 GB/s (s->h2 bottleneck)
    assert math.isclose(ends[x], 0.40, rel_tol=REL)  # X: 6 GB/s until 0.25 s, then 10 GB/s


def test_staggered_start_slows_the_draining_flow_from_that_instant():
    cluster = star(3, bw="10 GB/s")
    sched = Schedule(3, placement=("h0", "h1", "h2"))
    a, _ = sched.add_transfer(1, 0, 2e9, "A")
    b, _ = sched.add_transfer(2, 0, 1e9, "B", not_before_s=0.1)
    ends = simulate(sched, cluster).op_ends()
    # A alone at 10 GB/s for 0.1 s (1 GB), then both at 5 GB/s: B's 1 GB and A's last 1 GB end at 0.3 s.
    assert math.isclose(ends[a], 0.3, rel_tol=REL)
    assert math.isclose(ends[b], 0.3, rel_tol=REL)
    sched2 = Schedule(3, placement=("h0", "h1", "h2"))
    a2, _ = sched2.add_transfer(1, 0, 3e9, "A")
    b2, _ = sched2.add_transfer(2, 0, 1e9, "B", not_before_s=0.1)
    ends2 = simulate(sched2, cluster).op_ends()
    # B: 1 GB at 5 GB/s from 0.1 -> 0.3; A: 1 GB + 1 GB shared + 1 GB alone -> 0.4 s.
    assert math.isclose(ends2[b2], 0.3, rel_tol=REL)
    assert math.isclose(ends2[a2], 0.4, rel_tol=REL)


def test_rates_recomputed_once_per_instant():
    k = 50
    cluster = star(k + 1)
    sched = Schedule(k + 1, placement=tuple(f"h{i}" for i in range(k + 1)))
    for i in range(1, k + 1):
        sched.add_transfer(i, 0, 1e6 * i, f"f{i}")
    res = simulate(sched, cluster)
    # one allocation when the k flows start together, one after each of the k distinct finish instants
    assert res.allocations == k + 1


def test_compute_roofline_and_exact_trace():
    """Exact (rank, op, start, end) trace of a small dependent schedule on a star with one compute stream."""
    cluster = override_devices(star(2, bw="10 GB/s", lat="1 us", overhead="1 us"), DATASHEET_RATES)
    spec = cluster.specs["h0"]
    sched = Schedule(2, placement=("h0", "h1"))
    flops = 989.4e12 * 1e-3  # 1 ms of bf16 at peak
    c0 = sched.add_compute(0, "partial", flops=flops, dtype="bf16")
    c1 = sched.add_compute(1, "partial", flops=flops, dtype="bf16")
    s, r = sched.add_transfer(0, 1, 1e7, "state", send_deps=[c0], recv_deps=[c1])
    m = sched.add_compute(1, "merge", nbytes=3.35e12 * 2e-6, deps=[r], kind="merge")
    res = simulate(sched, cluster)
    t_c = spec.launch_s + 1e-3
    t_x = t_c + 1e-6 + 2e-6 + 1e7 / 10e9
    t_m = t_x + spec.launch_s + 2e-6
    got = [(rec.rank, rec.op, rec.start, rec.end) for rec in res.timeline]
    want = [(0, c0, 0.0, t_c), (1, c1, 0.0, t_c), (0, s, t_c, t_x), (1, r, t_c, t_x), (1, m, t_x, t_m)]
    assert [g[:2] for g in got] == [w[:2] for w in want]
    for g, w in zip(got, want, strict=True):
        assert math.isclose(g[2], w[2], rel_tol=REL, abs_tol=1e-15)
        assert math.isclose(g[3], w[3], rel_tol=REL)


def test_compute_ops_of_one_rank_share_one_stream():
    cluster = override_devices(star(1), DATASHEET_RATES)
    sched = Schedule(1, placement=("h0",))
    a = sched.add_compute(0, "a", flops=989.4e12 * 1e-3, dtype="bf16")
    b = sched.add_compute(0, "b", flops=989.4e12 * 1e-3, dtype="bf16")
    ends = simulate(sched, cluster).op_ends()
    launch = cluster.specs["h0"].launch_s
    assert math.isclose(ends[a], launch + 1e-3, rel_tol=REL)
    assert math.isclose(ends[b], 2 * (launch + 1e-3), rel_tol=REL)


def test_rendezvous_transfer_waits_for_the_receiver():
    cluster = star(2, bw="10 GB/s")
    sched = Schedule(2, placement=("h0", "h1"))
    c = sched.add_compute(1, "busy", flops=989.4e12 * 1e-3, dtype="bf16")
    _, r = sched.add_transfer(0, 1, 1e9, "x", recv_deps=[c])
    ends = simulate(sched, cluster).op_ends()
    assert math.isclose(ends[r], ends[c] + 0.1, rel_tol=REL)


def test_ecmp_spreads_flows_over_equal_paths():
    cluster = load_topology("cluster", {"nodes": 8, "gpus_per_node": 1, "nodes_per_leaf": 1, "spines": 4})
    spines = {next(v for u, v in cluster.route(a, b) if v.startswith("spine"))
              for a in cluster.ranks for b in cluster.ranks if a != b}
    assert len(spines) == 4
    assert cluster.route("n0.gpu0", "n5.gpu0") == cluster.route("n0.gpu0", "n5.gpu0")


def _shared_cores_cluster(ranks: int, cores: int, mem_bw: str = "1 GB/s", launch: str | int = 0,
                          link_bw: str = "1 GB/s", **host: object):
    """``ranks`` CPU ranks on host ``box`` sharing ``cores`` cores (plus host_mem_bw / host_copy_bw in ``host``)."""
    from conftest import ZERO_COMPUTE

    cpu = {"peak_flops": {"fp32": "1e30 FLOP/s"}, "mem_bw": mem_bw, "mem": "8 GB", "launch_overhead": launch}
    raw = {
        "devices": {"cpu": cpu, "zero": ZERO_COMPUTE},
        "nodes": [{"name": f"box.r{i}", "kind": "gpu", "device": "cpu"} for i in range(ranks)]
        + [{"name": "box.sw", "kind": "switch"}],
        "links": [{"a": f"box.r{i}", "b": "box.sw", "bandwidth": link_bw} for i in range(ranks)],
        "host_cores": {"box": cores},
        **{key: {"box": value} for key, value in host.items()},
    }
    return build_cluster(raw, "<cores>")


@pytest.mark.parametrize(("ranks", "cores", "factor"), [(1, 2, 1.0), (2, 2, 1.0), (4, 2, 2.0), (3, 2, 1.5)])
def test_kernels_share_the_host_cores(ranks, cores, factor):
    cluster = _shared_cores_cluster(ranks, cores)
    sched = Schedule(ranks, placement=cluster.ranks)
    ops = [sched.add_compute(r, "k", nbytes=1e6) for r in range(ranks)]  # 1 ms each on one core
    ends = simulate(sched, cluster).op_ends()
    for op in ops:
        assert math.isclose(ends[op], factor * 1e-3, rel_tol=REL)


def test_a_lone_kernel_gets_a_whole_core_again_when_the_others_finish():
    cluster = _shared_cores_cluster(3, 2)
    sched = Schedule(3, placement=cluster.ranks)
    short = [sched.add_compute(r, "short", nbytes=1e6) for r in (0, 1)]
    long = sched.add_compute(2, "long", nbytes=3e6)
    ends = simulate(sched, cluster).op_ends()
    # three kernels on two cores: 2/3 core each until the short ones finish at 1.5 ms (1 ms of work each);
    # the long one has done 1 ms of its 3 by then and finishes the rest on a core of its own at 3.5 ms
    assert all(math.isclose(ends[s], 1.5e-3, rel_tol=REL) for s in short)
    assert math.isclose(ends[long], 3.5e-3, rel_tol=REL)


def test_kernels_of_one_rank_still_run_one_at_a_time_with_shared_cores():
    cluster = _shared_cores_cluster(1, 4)
    sched = Schedule(1, placement=cluster.ranks)
    a = sched.add_compute(0, "a", nbytes=1e6)
    b = sched.add_compute(0, "b", nbytes=1e6)
    ends = simulate(sched, cluster).op_ends()
    assert math.isclose(ends[a], 1e-3, rel_tol=REL) and math.isclose(ends[b], 2e-3, rel_tol=REL)


def test_memory_bound_kernels_share_the_host_memory_bandwidth():
    cluster = _shared_cores_cluster(2, 2, mem_bw="10 GB/s", launch="1 us", host_mem_bw="15 GB/s")
    sched = Schedule(2, placement=cluster.ranks)
    big = [sched.add_compute(r, "attend", nbytes=1e7) for r in range(2)]  # 1 ms + 1 us alone
    ends = simulate(sched, cluster).op_ends()
    # two cores, but 15 GB/s for two 10 GB/s kernels: each runs at 0.75 of its own speed
    for op in big:
        assert math.isclose(ends[op], (1e-3 + 1e-6) / 0.75, rel_tol=REL)
    small = Schedule(2, placement=cluster.ranks)
    tiny = [small.add_compute(r, "merge", nbytes=1e3) for r in range(2)]  # launch-bound: not memory-bound
    ends = simulate(small, cluster).op_ends()
    for op in tiny:
        assert math.isclose(ends[op], 1e-6 + 1e-7, rel_tol=REL)


@pytest.mark.parametrize(("loaded", "factor"), [(1, 1 / 0.75), (2, 1.0)])
def test_a_profile_timed_under_the_hosts_load_is_not_slowed_again(loaded, factor):
    """A kernel profiled while the host's other cores ran it too (``loaded: 2``) has the memory sharing in its
    measured time: two at once take the profile's time, where a profile timed alone shares host_mem_bw."""
    profile = {"axes": ["kv_bytes", "head_dim", "group"], "grid": [[1e6, 1e8], [64], [1]], "seconds": [2e-3, 2e-3],
               "loaded": loaded}
    cluster = _shared_cores_cluster(2, 2, mem_bw="10 GB/s", launch="1 us", host_mem_bw="15 GB/s")
    raw_cpu = {"peak_flops": {"fp32": "1e30 FLOP/s"}, "mem_bw": "10 GB/s", "mem": "8 GB", "launch_overhead": "1 us",
               "kernels": {"attend": {"fp32": profile}}}
    cluster = override_cpu(cluster, raw_cpu)
    sched = Schedule(2, placement=cluster.ranks)
    ops = [sched.add_compute(r, "attend", fn="attend", nbytes=1e7, dims=(1e7, 64.0, 1.0)) for r in range(2)]
    ends = simulate(sched, cluster).op_ends()
    for op in ops:
        assert math.isclose(ends[op], 2e-3 * factor, rel_tol=REL)


def _alone_cluster(ranks: int, ratio: list[float], at: list[float] | None = None, cores: int = 2):
    """``ranks`` CPU ranks on ``cores`` shared cores whose attend profile (2 ms at every shape, timed ``loaded: 2``)
    says the kernel runs ``ratio`` of that alone."""
    at = at if at is not None else [1e6, 1e8][:len(ratio)]
    profile = {"axes": ["kv_bytes", "head_dim", "group"], "grid": [[1e6, 1e8], [64], [1]], "seconds": [2e-3, 2e-3],
               "loaded": 2, "alone": {"kv_bytes": at, "ratio": ratio}}
    cluster = _shared_cores_cluster(ranks, cores, mem_bw="10 GB/s", launch="1 us", host_mem_bw="15 GB/s")
    raw_cpu = {"peak_flops": {"fp32": "1e30 FLOP/s"}, "mem_bw": "10 GB/s", "mem": "8 GB", "launch_overhead": "1 us",
               "kernels": {"attend": {"fp32": profile}}}
    return override_cpu(cluster, raw_cpu)


def _attends(cluster, ranks: int, starts: list[float] | None = None, kv: float | list[float] = 1e7):
    sched = Schedule(ranks, placement=cluster.ranks)
    kvs = kv if isinstance(kv, list) else [kv] * ranks
    ops = [sched.add_compute(r, "attend", fn="attend", nbytes=kvs[r], dims=(kvs[r], 64.0, 1.0),
                             not_before_s=starts[r] if starts else 0.0) for r in range(ranks)]
    return sched, ops


def test_ratios_alone_apply_only_where_the_profile_loaded_every_core():
    """Four kernels on four cores, the profile timed with two at once: how four at once go was not measured, so the
    ratio is not applied and each takes the profiled 2 ms on its core, as without ratios."""
    cluster = _alone_cluster(4, [0.8, 0.8], cores=4)
    sched, ops = _attends(cluster, 4)
    ends = simulate(sched, cluster).op_ends()
    for op in ops:
        assert math.isclose(ends[op], 2e-3, rel_tol=REL)


def test_a_kernel_with_ratio_one_does_not_contend():
    """Ratios 0.5 at 1e6 bytes and 1 at 1e8: the second kernel runs as profiled and crosses no contention link, so
    the first runs at its alone speed beside it (the model's limit: only kernels with a ratio below 1 contend)."""
    cluster = _alone_cluster(2, [0.5, 1.0])
    sched, ops = _attends(cluster, 2, kv=[1e6, 1e8])
    ends = simulate(sched, cluster).op_ends()
    assert math.isclose(ends[ops[0]], 1e-3, rel_tol=REL)
    assert math.isclose(ends[ops[1]], 2e-3, rel_tol=REL)


@pytest.mark.parametrize(("ranks", "factor"), [(1, 0.8), (2, 1.0), (4, 2.0)])
def test_a_kernel_alone_runs_its_ratio_faster_than_profiled_under_load(ranks, factor):
    """Profiled loaded at 2 ms with a ratio alone of 0.8: alone 1.6 ms; two at once (the load profiled) 2 ms each;
    four on two cores 4 ms (a core's half for the loaded time each)."""
    cluster = _alone_cluster(ranks, [0.8, 0.8])
    sched, ops = _attends(cluster, ranks)
    ends = simulate(sched, cluster).op_ends()
    for op in ops:
        assert math.isclose(ends[op], 2e-3 * factor, rel_tol=REL)


def test_kernels_overlapping_in_part_run_alone_while_alone():
    """Rank 1's kernel starts 0.5 ms after rank 0's (R = 0.8, 2 ms loaded: 1.6 ms of work at full speed). Rank 0 runs
    0.5 ms alone, then both at R: its 1.1 ms left take 1.375 ms (ends at 1.875 ms); rank 1 did 1.1 ms of its 1.6 by
    then and ends 0.5 ms later, alone."""
    cluster = _alone_cluster(2, [0.8, 0.8])
    sched, ops = _attends(cluster, 2, [0.0, 0.5e-3])
    ends = simulate(sched, cluster).op_ends()
    assert math.isclose(ends[ops[0]], 1.875e-3, rel_tol=REL)
    assert math.isclose(ends[ops[1]], 2.375e-3, rel_tol=REL)


@pytest.mark.parametrize(("ratio", "alone"), [([0.3], 1e-3), ([1.2], 2e-3),
                                              ([0.9, 0.6], 2e-3 * 0.9 ** 0.5 * 0.6 ** 0.5)])
def test_a_ratio_alone_is_interpolated_and_kept_between_one_over_loaded_and_one(ratio, alone):
    """Below 1 / loaded (0.3 < 0.5) a kernel would need more than its core alone: 0.5; above 1 it would run slower
    alone than loaded: 1; between two measured sizes (1e6: 0.9, 1e8: 0.6) the power law at 1e7: sqrt(0.9 x 0.6)."""
    cluster = _alone_cluster(1, ratio)
    sched, ops = _attends(cluster, 1)
    assert math.isclose(simulate(sched, cluster).op_ends()[ops[0]], alone, rel_tol=REL)


def override_cpu(cluster, raw_cpu):
    """The cluster with its ``cpu`` device spec parsed again from ``raw_cpu``."""
    import dataclasses

    from simulator.cluster.devices import parse_device_spec

    spec = parse_device_spec("cpu", raw_cpu, lambda sub, err: err)
    return dataclasses.replace(cluster, specs={n: spec if s.name == "cpu" else s for n, s in cluster.specs.items()})


def test_loopback_copies_share_the_host_cores_with_kernels():
    cluster = _shared_cores_cluster(3, 2, mem_bw="10 GB/s", link_bw="100 GB/s", host_copy_bw="5 GB/s")
    alone = Schedule(3, placement=cluster.ranks)
    _, r = alone.add_transfer(0, 1, 1e9, "x")
    # sender and receiver each copy at up to 5 GB/s a core: two cores for 5 GB/s
    assert math.isclose(simulate(alone, cluster).op_ends()[r], 0.2, rel_tol=REL)
    both = Schedule(3, placement=cluster.ranks)
    _, r = both.add_transfer(0, 1, 1e9, "x")
    k = both.add_compute(2, "k", nbytes=2e9)  # 0.2 s alone on one core
    ends = simulate(both, cluster).op_ends()
    # two cores shared max-min by the transfer's two copies and the kernel: a third each, all end at 0.3 s
    assert math.isclose(ends[r], 0.3, rel_tol=REL) and math.isclose(ends[k], 0.3, rel_tol=REL)


def test_a_cpu_rank_issues_its_ops_in_program_order():
    """A CPU rank is one thread: a send written after a kernel is posted when the kernel returns, even though it
    does not depend on it; a receive is only posted, so the kernel after it runs meanwhile."""
    cluster = _shared_cores_cluster(2, 2)
    sched = Schedule(2, placement=cluster.ranks)
    k = sched.add_compute(0, "k", nbytes=1e6)  # 1 ms on a core
    s, r = sched.add_transfer(0, 1, 1e6, "x")  # 1 ms at 1 GB/s; no dependency on k
    k1 = sched.add_compute(1, "k1", nbytes=1e6)  # after rank 1's receive in program order, independent of it
    ends = simulate(sched, cluster).op_ends()
    assert math.isclose(ends[k], 1e-3, rel_tol=REL)
    assert math.isclose(ends[s], 2e-3, rel_tol=REL) and math.isclose(ends[r], 2e-3, rel_tol=REL)
    assert math.isclose(ends[k1], 1e-3, rel_tol=REL)
    # on GPUs (no shared host cores) the send waits for the kernel too (stream order: below), but a kernel issued
    # after a transfer does not wait for it: the same schedule with the transfer first overlaps the two
    gpus = load_topology("cluster", {"nodes": 1, "gpus_per_node": 2})
    gsched = Schedule(2, placement=gpus.ranks)
    gs, _ = gsched.add_transfer(0, 1, 1e6, "x")
    gsched.add_compute(0, "k", nbytes=1e9)
    result = simulate(gsched, gpus)
    assert result.op_ends()[gs] < result.makespan


@pytest.mark.parametrize("engine", [simulate, simulate_reference])
def test_a_gpu_posts_its_point_to_point_ends_in_stream_order(engine):
    """On a GPU a send or receive outside a collective, or a collective's launch, starts only after the last kernel
    issued before it on its rank (PyTorch's ProcessGroupNCCL: NCCL's stream waits for the current one), though it does
    not depend on it; a kernel issued after it does not wait for it; a collective's ends and a schedule whose op order
    is not a program are not held back. Closed forms: the transfer starts when the kernel it follows ends."""
    gpus = load_topology("cluster", {"nodes": 1, "gpus_per_node": 2})
    for order in ("send", "recv"):
        sched = Schedule(2, placement=gpus.ranks)
        k = sched.add_compute(0 if order == "send" else 1, "k", nbytes=1e9)
        s, r = sched.add_transfer(0, 1, 1e6, "x")
        k2 = sched.add_compute(0, "k2", nbytes=1e9)  # issued after the send: runs beside it
        res = engine(sched, gpus)
        assert res.start[s] == res.start[r] == res.end[k]
        assert res.start[k2] == res.end[k] if order == "send" else res.start[k2] == 0.0
        free = Schedule(2, placement=gpus.ranks, program_order=False)
        k = free.add_compute(0 if order == "send" else 1, "k", nbytes=1e9)
        s, r = free.add_transfer(0, 1, 1e6, "x")
        assert engine(free, gpus).start[s] == 0.0
        coll = Schedule(2, placement=gpus.ranks)
        k = coll.add_compute(0 if order == "send" else 1, "k", nbytes=1e9)
        s, r = coll.add_transfer(0, 1, 1e6, "x", coll="allgather")
        assert engine(coll, gpus).start[s] == 0.0
    # a collective's launch too: it starts when the kernel before it ends (its ends then follow it)
    sched = Schedule(2, placement=gpus.ranks)
    k = sched.add_compute(0, "k", nbytes=1e9)
    launch = sched.add_launch(0, "c.launch", coll="c")
    res = engine(sched, gpus)
    assert res.start[launch] == res.end[k] > 0
    # the stream order is the dependency written out: the same floats
    ends = []
    for deps in ((), (0,)):
        sched = Schedule(2, placement=gpus.ranks)
        sched.add_compute(0, "k", nbytes=1e9)
        sched.add_transfer(0, 1, 1e6, "x", send_deps=deps)
        ends.append(engine(sched, gpus).end.tolist())
    assert ends[0] == ends[1]


@pytest.mark.parametrize("engine", [simulate, simulate_reference])
def test_a_gpus_point_to_point_kernels_run_one_after_another(engine):
    """A GPU's sends and receives issued back to back are one NCCL kernel (``p2p: batched``: one
    ``batch_isend_irecv``), and its kernels run one after another on one stream: a send issued after a group still
    waiting for its peer starts when that group has ended, even to another peer. ``per-peer`` (unbatched
    ``isend``/``irecv``): each end is a kernel on the stream of its pair of ranks, so only an end to the same peer
    waits. Closed forms: the later send starts at the earlier transfer's end, or at the kernel before it (or at 0)."""
    gpus = load_topology("cluster", {"nodes": 1, "gpus_per_node": 3})
    for p2p in ("batched", "per-peer"):
        for peer in (1, 2):
            sched = Schedule(3, placement=gpus.ranks, p2p=p2p)
            late = sched.add_compute(1, "late", nbytes=2e9)  # rank 1 receives only after it
            first, _ = sched.add_transfer(0, 1, 1e6, "x", recv_deps=[late])
            k = sched.add_compute(0, "k", nbytes=1e9)  # ends before rank 1's receive is posted
            second, _ = sched.add_transfer(0, peer, 1e6, "y")
            res = engine(sched, gpus)
            assert res.end[k] < res.start[first] == res.end[late]
            waits = p2p == "batched" or peer == 1
            assert res.start[second] == (res.end[first] if waits else res.end[k])
    # within a group, two sends to one peer run one after another (NCCL takes a peer's sends from its queue, head
    # first); to two peers at once; the same per peer (one stream per pair)
    for p2p in ("batched", "per-peer"):
        for peer in (1, 2):
            sched = Schedule(3, placement=gpus.ranks, p2p=p2p)
            a, _ = sched.add_transfer(0, 1, 1e6, "a")
            b, _ = sched.add_transfer(0, peer, 1e6, "b")
            res = engine(sched, gpus)
            assert res.start[a] == 0.0 and res.start[b] == (res.end[a] if peer == 1 else 0.0)
    with pytest.raises(ValueError, match="p2p"):
        engine(Schedule(2, placement=gpus.ranks[:2], p2p="lazy"), gpus)


def test_program_order_waits_for_a_collectives_launch():
    cluster = dataclasses.replace(_shared_cores_cluster(2, 2), collective_overhead_s=1e-3)
    sched = Schedule(2, placement=cluster.ranks)
    launches = [sched.add_launch(r, "c") for r in range(2)]
    after = [sched.add_compute(r, "k", nbytes=1e6) for r in range(2)]
    result = simulate(sched, cluster)
    starts = {rec.op: rec.start for rec in result.timeline}
    ends = result.op_ends()
    for launch, k in zip(launches, after, strict=True):  # the thread starts the collective, then the kernel
        assert math.isclose(ends[launch], 1e-3, rel_tol=REL) and math.isclose(starts[k], 1e-3, rel_tol=REL)
