"""treering calibrate --from-nccl-tests: fit bandwidths and protocol latencies to nccl-tests logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.cluster.topology import Cluster, load_topology
from simulator.collective_rows import bus_factor
from simulator.nccl_fit import Sample, apply, fit_logs, parameters, read_samples, simulated

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


def test_the_fit_recovers_the_parameters_that_made_a_log(tmp_path):
    base = load_topology("dgx-h100", {"nodes": 2, "gpus_per_node": 2})
    params = parameters(base, multi_node=True)
    values = {p.name: TRUTH.get(p.name, p.start) for p in params}
    log = tmp_path / "synthetic.log"
    synthetic_log(apply(base, params, values), SIZES, log, hosts=2)
    samples, _ = read_samples([str(log)])
    fit = fit_logs(base, samples)
    for name, true in TRUTH.items():
        assert name not in fit.held
        assert fit.values[name] == pytest.approx(true, rel=0.01), name
    fitted, _ = simulated(fit.cluster, samples)
    assert [t / s.time_s for t, s in zip(fitted, samples, strict=True)] == pytest.approx([1.0] * len(samples), rel=5e-3)
