"""Faults (simulator.cluster.faults): closed forms on hand-built schedules, the scenario key end to end, refusals."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main
from simulator.cluster.devices import compute_time
from simulator.cluster.faults import Fault, apply_faults, link_matches
from simulator.cluster.topology import Cluster, load_topology
from simulator.engine import simulate
from simulator.errors import InputError
from simulator.run.prepare import run_point
from simulator.run.scenario import load_scenario
from simulator.schedule.core import Schedule
from tests.conftest import star

FLOPS = 4e12  # a kernel of some milliseconds on an H100


def ring_step(p: int, nbytes: float) -> Schedule:
    """One lockstep ring step: every rank runs a kernel, then sends its result to the next rank."""
    s = Schedule(p)
    kernels = [s.add_compute(r, "k", flops=FLOPS, dtype="bf16") for r in range(p)]
    for r in range(p):
        s.add_transfer(r, (r + 1) % p, nbytes, "pass", send_deps=(kernels[r],))
    return s


@pytest.mark.usefixtures("no_contention")  # (the closed form with contention: tests/test_contention.py)
def test_a_straggler_delays_the_ring_step_by_its_extra_kernel_time() -> None:
    """Closed form: the step is kernel + transfer; one rank s times slower is on the critical path (every rank
    waits on its neighbour), so the step grows by exactly (s - 1) x the kernel, and its kernels last s x as long."""
    p, nbytes, s = 4, 1e8, 1.25
    healthy = star(p, bw="50 GB/s", lat="1 us")
    t = compute_time(healthy.specs["h0"], FLOPS, 0.0, "bf16")
    x = 2e-6 + nbytes / 50e9  # two hops of 1 us, then the bytes at the link's rate
    base = simulate(ring_step(p, nbytes), healthy)
    assert base.makespan == pytest.approx(t + x, rel=1e-12)
    slow, said = apply_faults(healthy, [Fault("device", "h2", slowdown=s)])
    assert said == "h2 slowdown 1.25 (1 device)"
    result = simulate(ring_step(p, nbytes), slow)
    assert result.makespan == pytest.approx(s * t + x, rel=1e-12)
    assert result.makespan == pytest.approx(base.makespan + (s - 1) * t, rel=1e-12)
    assert result.end[2] - result.start[2] == pytest.approx(s * t, rel=1e-12)  # the straggler's kernel
    assert result.end[0] - result.start[0] == base.end[0] - base.start[0]  # the others' untouched
    assert slow.specs["h2"].slowdown == s and healthy.specs["h2"].slowdown == 1.0  # the input cluster unchanged


def test_a_degraded_link_carries_that_fraction_of_its_bandwidth_under_max_min() -> None:
    """Max-min with a link at factor f: two flows into h1 share its degraded link (f x bw / 2 each), a flow out of
    h1 has f x bw (both directions are degraded), and a flow elsewhere keeps the whole bandwidth."""
    f, nbytes, bw = 0.4, 1e9, 10e9
    cluster, said = apply_faults(star(5, bw="10 GB/s"), [Fault("link", "h1-s", bandwidth_factor=f)])
    assert said == "h1-s bandwidth x0.4 (1 link)"
    assert cluster.graph.edges["h1", "s"]["bandwidth"] == cluster.graph.edges["s", "h1"]["bandwidth"] == f * bw
    s = Schedule(5)
    into = [s.add_transfer(src, 1, nbytes, "into h1")[0] for src in (0, 2)]
    out, _ = s.add_transfer(1, 4, nbytes, "out of h1")
    other, _ = s.add_transfer(3, 0, nbytes, "elsewhere")
    result = simulate(s, cluster)
    for send in into:
        assert result.end[send] == pytest.approx(nbytes / (f * bw / 2), rel=1e-12)
    assert result.end[out] == pytest.approx(nbytes / (f * bw), rel=1e-12)
    assert result.end[other] == pytest.approx(nbytes / bw, rel=1e-12)


def _point_rows(tmp_path: Path, faults: str, nodes: int = 2) -> list[dict[str, object]]:
    path = tmp_path / "f.yaml"
    path.write_text(textwrap.dedent(f"""
        name: f
        topology: dgx-h100
        topology_params: {{nodes: {nodes}}}
        workload: {{kind: decode, model: {{heads: 16, head_dim: 128}}, context: 64000, dtype: bf16}}
        algorithms: [ring, tree]
        {faults}
        """))
    (point,) = load_scenario(path)
    return run_point(point)


def test_faults_of_factor_one_give_the_same_floats(tmp_path: Path) -> None:
    healthy = _point_rows(tmp_path, "")
    same = _point_rows(tmp_path, "faults: [{device: n1.gpu3, slowdown: 1}, {link: n0.nic0-*, bandwidth_factor: 1}]")
    for a, b in zip(healthy, same, strict=True):
        assert "faults_applied" not in a
        assert b.pop("faults_applied") == "n1.gpu3 slowdown 1 (1 device); n0.nic0-* bandwidth x1 (2 links)"
        a.pop("sim_wall_s"), b.pop("sim_wall_s")
        assert a == b


def test_a_straggler_never_speeds_a_point_up_nor_changes_its_bytes(tmp_path: Path) -> None:
    healthy = {r["algorithm"]: r for r in _point_rows(tmp_path, "faults: []")}
    slow = {r["algorithm"]: r for r in _point_rows(tmp_path, "faults: [{device: n1.gpu3, slowdown: 1.2}]")}
    assert healthy["ring"]["faults_applied"] == "none"
    for algo in ("ring", "tree"):
        assert slow[algo]["latency_s"] >= healthy[algo]["latency_s"]  # type: ignore[operator]
        assert slow[algo]["bytes_moved"] == healthy[algo]["bytes_moved"]


def test_failed_links_are_routed_around_and_a_failed_server_re_places_the_workload() -> None:
    """Healthy, routes between rails spread over both spines (ECMP); with spine0's links down every such route
    takes spine1. A server down: the ranks are the GPUs left."""
    cluster = load_topology("dgx-h100", {"nodes": 2})
    pairs = [(f"n0.gpu{a}", f"n1.gpu{b}") for a in range(8) for b in range(8) if a != b]
    used = {v for pair in pairs for _, v in cluster.route(*pair) if v.startswith("spine")}
    assert used == {"spine0", "spine1"}
    assert len(link_matches(cluster.graph, "spine0-*")) == 16  # its 8 links, both directions
    faulted, said = apply_faults(cluster, [Fault("link", "spine0-*", down=True)])
    assert said == "link spine0-* down (8 links)"
    assert "spine0" not in faulted.graph  # a switch left without links goes
    for pair in pairs:
        route = faulted.route(*pair)
        assert [v for _, v in route if v.startswith("spine")] == ["spine1"]
    placed, said = apply_faults(cluster, [Fault("node", "n1", down=True)])
    assert placed.ranks == tuple(f"n0.gpu{i}" for i in range(8))
    assert said == "node n1 down (workload re-placed on the 8 GPUs left of 16)"
    assert not any(n.startswith("n1.") for n in placed.graph)


@pytest.mark.parametrize(("fault", "message"), [
    (Fault("device", "n9.*", slowdown=2), "faults.0.device: no device matches 'n9.*'"),
    (Fault("link", "n0.gpu0-n1.gpu0", down=True), "faults.0.link: no link matches 'n0.gpu0-n1.gpu0'"),
    (Fault("link", "rail3-*", down=True), "faults.0.link: the faults disconnect the ranks"),
    (Fault("node", "n*", down=True), "faults.0.node: no GPU would remain"),
])
def test_faults_that_match_nothing_or_disconnect_are_refused(fault: Fault, message: str) -> None:
    cluster: Cluster = load_topology("dgx-h100", {"nodes": 2})
    with pytest.raises(InputError) as err:
        apply_faults(cluster, [fault])
    assert str(err.value).startswith(message)


BAD = """\
name: bad
topology: dgx-h100
topology_params: {nodes: 2}
workload: {kind: decode, model: {heads: 16, head_dim: 128}, context: 64000, dtype: bf16}
faults:
  - {device: n1.gpu3, slowdown: 1.1}
  - %s
"""


@pytest.mark.parametrize(("entry", "message"), [
    ("{link: n1.nic*-*, down: true}", "faults.1.link: the faults disconnect the ranks: n0.gpu0 can no longer reach"),
    ("{link: n1.nic0-*, bandwidth_factor: 0}", "faults.1.bandwidth_factor: a bandwidth factor must be a number in "
                                               "[0.001, 1], got 0"),
    ("{device: n1.gpu2, slowdown: 1000}", "faults.1.slowdown: a slowdown must be a number in [1, 100], got 1000"),
    ("{device: n1.gpu9, slowdown: 2}", "faults.1.device: no device matches 'n1.gpu9'"),
    ("{node: n1}", "faults.1: a node fault is {node: NAME, down: true}"),
    ("{device: n1.gpu2, link: n1.nic0-*, slowdown: 2}", "faults.1: a fault names exactly one of device, link, node"),
    ("{device: n1.gpu2, slowdwn: 2}", "faults.1.slowdwn: unknown key; did you mean slowdown?"),
])
def test_bad_faults_are_one_located_line_and_nothing_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         entry: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD % entry)
    out = tmp_path / "o"
    assert main(["run", str(path), "-o", str(out), "--jobs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0] == f"treering: error: {path}:7: {message}" or err[0].startswith(f"treering: error: {path}:7: "
                                                                                  f"{message}")
    assert not (out / "results.csv").exists()


def test_faults_by_set_and_swept(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""
        name: s
        topology: dgx-h100
        topology_params: {nodes: 2}
        workload: {kind: decode, model: {heads: 16, head_dim: 128}, context: 64000, dtype: bf16}
        algorithms: [tree]
        sweep:
          faults: [[], [{device: n0.gpu1, slowdown: 1.5}]]
        """))
    out = tmp_path / "o"
    assert main(["run", str(path), "-o", str(out), "--jobs", "1"]) == 0
    df = pd.read_csv(out / "results.csv")
    assert list(df["faults_applied"]) == ["none", "n0.gpu1 slowdown 1.5 (1 device)"]
    assert df["latency_s"][1] > df["latency_s"][0]
    assert main(["run", str(path), "-o", str(tmp_path / "p"), "--jobs", "1", "--set", "sweep={}",
                 "--set", "faults=[{node: n1, down: true}]"]) == 0
    df = pd.read_csv(tmp_path / "p" / "results.csv")
    assert list(df["ranks"]) == [8]


@pytest.mark.parametrize("workload", [
    "{kind: collective, collective: allreduce, bytes: 64 MiB, dtype: bf16}",
    "{kind: decode, model: {heads: 16, head_dim: 128}, context: 64000, dtype: bf16}",
])
def test_a_server_down_re_places_the_workload_as_on_the_servers_left(tmp_path: Path, workload: str) -> None:
    """Three servers with the last one down run as two servers do, to the last float: NCCL's rings and trees and the
    decode schedules are built over the GPUs that remain."""
    path = tmp_path / "n.yaml"
    path.write_text(textwrap.dedent(f"""
        name: n
        topology: dgx-h100
        topology_params: {{nodes: 3}}
        workload: {workload}
        algorithms: {"[ring, tree]"}
        """))
    (down,) = load_scenario(path, ["faults=[{node: n2, down: true}]"])
    (two,) = load_scenario(path, ["topology_params.nodes=2"])
    for a, b in zip(run_point(down), run_point(two), strict=True):
        assert a.pop("faults_applied") == "node n2 down (workload re-placed on the 16 GPUs left of 24)"
        a.pop("sim_wall_s"), b.pop("sim_wall_s")
        assert a == b
