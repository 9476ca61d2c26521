"""Pass-Q ring prefill (``ring-q``, issue 42) beyond the registry-wide numeric and real-run tests: without overlap,
its transfer volumes, its memory (partials released once sent), the pass-KV / pass-Q rule, and ``auto``'s choice
by simulation in the rows."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator.algorithms import Layout
from simulator.algorithms.prefill import build_prefill
from simulator.algorithms.prefill.rule import miss_rate_threshold, pass_rule, pass_volumes
from simulator.cli import main
from simulator.engine.core import simulate
from simulator.numeric.prefill import make_prefill_inputs, run_prefill_numeric
from simulator.run.prepared import cluster_for
from simulator.run.scenario import load_scenario
from simulator.schedule.memory import timeline_peaks
from simulator.workloads.layouts import LAYOUTS, layout_runs, pair_matrix, run_tokens
from simulator.workloads.prefill_shape import PrefillShape


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backward", [False, True])
def test_ring_q_without_overlap_is_exact(layout, backward):
    shape = PrefillShape(2, 4, 8, 2, 23, "fp64", True, layout, backward)
    sched = build_prefill("ring-q", {"overlap": False}, shape, Layout((0, 0, 1, 1, 1)))
    res = run_prefill_numeric(sched, make_prefill_inputs(np.random.default_rng(1), 2, 4, 2, 8, 23, True))
    assert res.max_abs_err < 1e-12 and res.max_grad_err < 1e-12


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ring_q_volumes_without_a_prefix(layout):
    """Queries to the P - 1 others; a partial back from every block the causal mask leaves unmasked off the
    diagonal (contiguous: the earlier shards only)."""
    p, n = 4, 41
    shape = PrefillShape(1, 8, 16, 2, n, "bf16", True, layout)
    sched = build_prefill("ring-q", {}, shape, Layout((0, 0, 1, 1)))
    runs = layout_runs(layout, n, p)
    live = pair_matrix(runs, True) > 0
    np.fill_diagonal(live, False)
    tok = [run_tokens(r) for r in runs]
    partials = sum(shape.state_bytes(tok[o]) for o in range(p) for j in range(p) if live[o, j])
    got = {k: sum(op.nbytes for op in sched.ops if op.kind == "send" and op.name.startswith(k))
           for k in ("q[", "partial[")}
    assert got == {"q[": (p - 1) * shape.q_bytes(n), "partial[": partials}
    if layout == "contiguous":
        assert live.sum() == p * (p - 1) // 2
    v = pass_volumes(shape, p)
    assert (v.queries, v.partials) == (got["q["], got["partial["])


def test_partials_are_released_once_sent(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\ntopology: dgx-h100\nworkload: {kind: prefill, model: llama-3.1-8b, sequence: 64K}\n"
                    "algorithms: [ring-q]\n")
    cluster = cluster_for(load_scenario(str(path))[0])
    shape = PrefillShape(1, 32, 128, 8, 65536, "bf16", cached=4096)
    sched = build_prefill("ring-q", {}, shape, Layout(cluster.host_indices(cluster.ranks)))
    peaks = timeline_peaks(sched, simulate(sched, cluster))
    t = 65536 // 8
    kv, q, state = shape.kv_bytes(t + 4096 // 8), shape.q_bytes(t), shape.state_bytes(t)
    # its K/V, its queries, two query buffers, out and lse, its running state and a few partials in flight: never
    # the P - 1 partials it computes for the others all at once
    assert max(peaks) < kv + 3 * q + 2 * q + state * 5
    assert max(peaks) > kv + 3 * q


def test_the_rule_follows_the_cache_miss_rate():
    # Llama 3.1 405B: 128 heads over 8 KV heads; pass-Q pays off below a miss rate of about 1/16
    shape = PrefillShape(1, 128, 128, 8, 1280, "bf16", cached=126720)
    assert miss_rate_threshold(shape) == pytest.approx(2 * 8 * 128 / (2 * 128 * 128 + 2 * 128))
    assert pass_rule(shape, 16) == "ring-q"  # 1 % new tokens
    assert pass_rule(PrefillShape(1, 128, 128, 8, 128000, "bf16"), 16) == "ring"  # no cache: K, V are smaller
    miss = [m for m in (0.01, 0.02, 0.04, 0.08, 0.16) if pass_rule(PrefillShape(
        1, 128, 128, 8, int(128000 * m), "bf16", cached=128000 - int(128000 * m)), 16) == "ring-q"]
    assert miss == [0.01, 0.02, 0.04]  # the threshold is 6.2 %


def _run_70b_prefill(tmp_path, extra: str, rest: str) -> Path:
    """A 70B prefill of 4,096 tokens on two DGX H100 (``extra``: more workload keys; ``rest``: the algorithms and
    what follows), run; the results' folder."""
    path = tmp_path / "a.yaml"
    path.write_text("name: a\ntopology: dgx-h100\ntopology_params: {nodes: 2}\n"
                    f"workload: {{kind: prefill, model: llama-3.1-70b, sequence: 4096{extra}}}\n"
                    + textwrap.dedent(rest))
    out = tmp_path / "o"
    assert main(["run", str(path), "-o", str(out), "--no-report", "--jobs", "1"]) == 0
    return out


def test_auto_runs_the_faster_and_says_which(tmp_path):
    out = _run_70b_prefill(tmp_path, "", """
        algorithms: [ring, ring-q, auto]
        sweep:
          workload.cached: [0, 60K]
        """)
    rows = pd.read_csv(out / "results.csv")
    for _, group in rows.groupby("workload.cached"):
        by = group.set_index("algorithm")
        fastest = by.loc[["ring", "ring-q"], "latency_s"].idxmin()
        assert by.loc["auto", "chosen"] == fastest
        assert by.loc["auto", "latency_s"] == by.loc[fastest, "latency_s"]
        other = "ring-q" if fastest == "ring" else "ring"
        assert by.loc["auto", "other_latency_s"] == by.loc[other, "latency_s"]  # why it chose
    assert set(rows[rows["algorithm"] == "auto"]["chosen"]) == {"ring", "ring-q"}  # the choice turns on the cache
    assert main(["report", str(out)]) == 0  # the conclusions say which it ran where, and by how much
    text = (out / "report.md").read_text()
    assert "`auto` ran the faster by simulation of pass-KV (`ring`) and pass-Q (`ring-q`): `ring` at 1 row (`ring-q` " \
           "took " in text and "`ring-q` at 1 row (`ring` took " in text


def test_auto_runs_its_candidates_with_its_p2p(tmp_path):
    """``auto``'s ``p2p`` is its candidates': per peer, it takes the latency of the faster per-peer schedule."""
    out = _run_70b_prefill(tmp_path, ", cached: 60K", """
        algorithms:
          - {name: ring, p2p: per-peer}
          - {name: ring-q, p2p: per-peer}
          - {name: auto, p2p: per-peer}
          - ring-q
        """)
    by = pd.read_csv(out / "results.csv").set_index("algorithm")["latency_s"]
    assert by["auto[p2p=per-peer]"] == min(by["ring[p2p=per-peer]"], by["ring-q[p2p=per-peer]"])
    assert by["ring-q"] != by["ring-q[p2p=per-peer]"]  # (one stream per rank or per peer: not the same here)


def test_generate_prefills_with_the_faster_under_auto(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(textwrap.dedent("""
        name: g
        topology: dgx-h100
        topology_params: {nodes: 2}
        workload: {kind: generate, model: llama-3.1-8b, prompt: 8K, new_tokens: 1}
        algorithms: [ring]
        sweep:
          workload.prefill: [ring, ring-q, auto]
        """))
    out = tmp_path / "o"
    assert main(["run", str(path), "-o", str(out), "--no-report", "--jobs", "1"]) == 0
    rows = pd.read_csv(out / "results.csv").set_index("workload.prefill")
    fastest = rows.loc[["ring", "ring-q"], "ttft_s"].idxmin()
    assert rows.loc["auto", "prefill"] == f"auto:{fastest}"
    assert rows.loc["auto", "ttft_s"] == rows.loc[fastest, "ttft_s"]
