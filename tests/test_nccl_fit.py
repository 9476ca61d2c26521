"""treering calibrate --from-nccl-tests: fit bandwidths and protocol latencies to nccl-tests logs."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main
from simulator.cluster.topology import Cluster, load_topology
from simulator.collectives.protocols import base_latency, hop_latency
from simulator.collectives.standalone import bus_factor
from simulator.errors import InputError
from simulator.nccl.fit import Sample, apply, parameters, simulated
from simulator.run.prepare import run_point
from simulator.run.scenario import scenario_points

LOG = str(Path(__file__).parent / "fixtures" / "nccltests" / "all_reduce_h100_2x8_a3mega.log")
SIZES = [8 * 4**k for k in range(16)]  # 8 B to 8 GiB
TRUTH = {"inter_bandwidth": 40e9, "LL.net": 8e-6, "LL128.net": 20e-6, "Simple.net": 100e-6}


def synthetic_log(cluster: Cluster, sizes: list[int], path: Path, hosts: int) -> None:
    """An all_reduce_perf log (float sum) whose times are the engine's on ``cluster``, as nccl-tests prints it."""
    p = len(cluster.ranks)
    samples = [Sample("x", 0, "allreduce", p, n, "fp32", 1.0) for n in sizes]
    times, _ = simulated(cluster, samples)
    lines = ["# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 4(factor) warmup iters: 5 iters: 20",
             "/opt/nccl-tests/build/all_reduce_perf -b 8 -e 8G -f 4 -g 1", "#", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid {100 + r:6d} on host{r * hosts // p} device {r % (p // hosts)} "
              f"[0000:{r:02x}:00] NVIDIA H100 80GB HBM3" for r in range(p)]
    lines += ["#", "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
              "algbw   busbw #wrong", "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
              "            (us)  (GB/s)  (GB/s)"]
    for n, t in zip(sizes, times, strict=True):
        algbw = n / t / 1e9
        busbw = algbw * bus_factor("allreduce", p)
        cells = f"{t * 1e6:.3f} {algbw:.3f} {busbw:.3f} 0"
        lines.append(f"{n:12d} {n // 4:12d} float sum -1 {cells} {cells}")
    lines.append("# Avg bus bandwidth    : 1.0")
    path.write_text("\n".join(lines) + "\n")


def test_calibrate_recovers_the_parameters_that_made_a_log(tmp_path, capsys):
    """A log the engine generated with known bandwidths and latencies: the fit finds them within 1 %, the written
    topology loads, and validate --nccl-tests on it reproduces the log."""
    base = load_topology("dgx-h100", {"nodes": 2, "gpus_per_node": 2})
    params = parameters(base, multi_node=True)
    log = tmp_path / "synthetic.log"
    synthetic_log(apply(base, params, {p.name: TRUTH.get(p.name, p.start) for p in params}), SIZES, log, hosts=2)
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", "--from-nccl-tests", str(log), "-o", str(out), "--hold-out", "none"]) == 0
    said = capsys.readouterr().out
    assert "base topology: preset dgx-h100 with nodes: 2, gpus_per_node: 2 (inferred from the log" in said
    assert re.search(r"inter_bandwidth: 50 GB/s -> (39\.9\d|40|40\.0\d) GB/s \(x0\.8", said), said  # within 0.1 %
    assert f"wrote {out}" in said
    text = out.read_text()
    assert text.startswith("# Written by `treering calibrate --from-nccl-tests") and "nccl_latency:" in text
    assert "R^2 of log time" in text and f"{log}:" in text
    fitted = load_topology(str(out))
    nic = [bw for u, v, bw in fitted.graph.edges(data="bandwidth") if u == "n0.nic0" and v == "rail0"]
    assert nic == [pytest.approx(TRUTH["inter_bandwidth"], rel=0.01)]
    for proto in ("LL", "LL128", "Simple"):
        assert fitted.nccl_latency[f"ring.{proto}.net"] == pytest.approx(TRUTH[f"{proto}.net"], rel=0.01)
        tree_over_ring = hop_latency("tree", proto, "net") / hop_latency("ring", proto, "net")  # NCCL's ratio kept
        assert fitted.nccl_latency[f"tree.{proto}.net"] == pytest.approx(TRUTH[f"{proto}.net"] * tree_over_ring,
                                                                         rel=0.01)
    assert main(["validate", "--nccl-tests", str(log), "--topology", str(out), "-o", str(tmp_path / "v")]) == 0
    frame = pd.read_csv(tmp_path / "v" / "nccl_validation.csv")
    assert len(frame) == len(SIZES)  # (validate reads the busbw column, printed to 0.001 GB/s: large sizes only)
    assert frame[frame["measured_busbw_GBps"] >= 1]["error_pct"].abs().max() < 1.0


TWO_GPUS = ("name: t\nnodes:\n  - {name: a.gpu0, kind: gpu, device: h100-sxm}\n"
            "  - {name: a.gpu1, kind: gpu, device: h100-sxm}\n"
            "links:\n  - {a: a.gpu0, b: a.gpu1, bandwidth: 100 GB/s, latency: 1 us, class: nvlink}\n")


def test_nccl_latency_in_a_topology_replaces_nccl_constants(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(TWO_GPUS + "nccl_latency:\n  ring: {LL: {base: 20 us, nvlink: 3 us}}\n")
    cluster = load_topology(str(path))
    assert hop_latency("ring", "LL", "nvlink", cluster.nccl_latency) == pytest.approx(3e-6)
    assert base_latency("ring", "LL", cluster.nccl_latency) == pytest.approx(20e-6)
    assert hop_latency("ring", "Simple", "nvlink", cluster.nccl_latency) == pytest.approx(3.4e-6)  # NCCL's
    # a ring allreduce of 8 bytes on 2 GPUs: the base latency, then 2 (P - 1) = 2 hops of 3 us, 8 B at 100 GB/s
    tree = {"name": "x", "topology": str(path), "algorithms": [{"name": "ring", "protocol": "LL"}],
            "workload": {"kind": "collective", "collective": "allreduce", "bytes": 8, "dtype": "fp32"}}
    row = run_point(scenario_points(tree, "x", tmp_path, [])[0])[0]
    assert row["time_s"] == pytest.approx(20e-6 + 2 * 3e-6, rel=0.05)


@pytest.mark.parametrize(("table", "message"), [
    ("{ring: {LL2: {net: 1 us}}}", "t.yaml:7: nccl_latency.ring.LL2: unknown protocol 'LL2'; valid: LL, LL128, Simple"),
    ("{ring: {LL: {wan: 1 us}}}", "nccl_latency.ring.LL.wan: unknown latency 'wan'; valid: base, nvlink, pci, net"),
    ("{ring: {LL: {net: -1 us}}}", "nccl_latency.ring.LL.net: must not be negative"),
    ("[1]", "nccl_latency: must map algorithm names (ring, tree, nvls) to mappings"),
])
def test_bad_nccl_latency_tables_are_located(tmp_path, table, message):
    path = tmp_path / "t.yaml"
    path.write_text(TWO_GPUS + f"nccl_latency: {table}\n")
    with pytest.raises(InputError) as err:
        load_topology(str(path))
    assert message in str(err.value)


def small_log(tmp_path: Path, sizes: list[int], invert: bool = False) -> Path:
    """A synthetic 2 x 2 H100 log (engine times on the dgx-h100 preset); ``invert``: times reversed in size order."""
    base = load_topology("dgx-h100", {"nodes": 2, "gpus_per_node": 2})
    log = tmp_path / "small.log"
    synthetic_log(base, sizes, log, hosts=2)
    if invert:
        lines = log.read_text().splitlines()
        rows = [i for i, line in enumerate(lines) if line and not line.startswith(("#", "/"))]
        cells = [lines[i].split() for i in rows]
        for i, c in zip(rows, cells, strict=True):
            src = cells[len(cells) - 1 - rows.index(i)]
            lines[i] = " ".join(c[:5] + src[5:])
        log.write_text("\n".join(lines) + "\n")
    return log


GB10 = str(Path(__file__).parent / "fixtures" / "nccltests" / "all_gather_gb10_2x1.log")


@pytest.mark.parametrize(("argv", "message"), [
    (["--from-nccl-tests", "nope.log"], "nope.log: no such file"),
    (["--from-nccl-tests", "{empty}"], "empty.log:1: no nccl-tests result table"),
    (["--from-nccl-tests", "{small}", "--topology", "no-such-preset"],
     "topology: unknown topology preset 'no-such-preset'; presets:"),
    (["--from-nccl-tests", "{small}", "--topology", "{two}"],
     "small.log:10: --topology: the topology has 2 GPUs and cannot be sized to the run's 4 ranks"),
    (["--from-nccl-tests", GB10], "all_gather_gb10_2x1.log: --topology: cannot infer the cluster from the log (it "
                                  "names NVIDIA GB10); give --topology"),
    (["--from-nccl-tests", "{small}", "--hold-out", "none"],
     "small.log:12: --from-nccl-tests: too few sizes to fit: 4, the fit needs at least 6"),
    (["--from-nccl-tests", "{small}", "--hold-out", "odd"], "--hold-out: must be every-other, none or a collective"),
])
def test_bad_calibrations_exit_2_and_write_nothing(argv, message, tmp_path, capsys):
    (tmp_path / "empty.log").write_text("all_reduce_perf ran but printed nothing\n")
    (tmp_path / "two.yaml").write_text(TWO_GPUS)
    small = small_log(tmp_path, [8, 1024, 2**20, 2**30])
    names = {"empty": tmp_path / "empty.log", "small": small, "two": tmp_path / "two.yaml"}
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", *(a.format(**names) for a in argv), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_a_log_the_model_cannot_describe_is_refused(tmp_path, capsys):
    log = small_log(tmp_path, [8 * 16**k for k in range(8)], invert=True)  # larger messages, shorter times
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", "--from-nccl-tests", str(log), "-o", str(out), "--hold-out", "none"]) == 2
    err = capsys.readouterr().err
    assert "--from-nccl-tests: the fit leaves a large residual: median |error| of the bus bandwidth" in err
    assert "nothing written" in err and not out.exists()
