"""Generate workloads: prefill then decode; rows add ttft_s and tpot_s, consistent with prefill and decode alone."""

from __future__ import annotations

import textwrap

import pandas as pd
import pytest

from simulator.algorithms import build_schedule
from simulator.cli import main
from simulator.cluster.topology import load_topology
from simulator.engine.core import simulate
from simulator.run.prepared import layout_of
from simulator.run.rows import STABLE as DECODE_COLUMNS
from simulator.workloads.shape import DecodeShape

GEN = """
name: g
topology: dgx-h100
workload:
  kind: generate
  model: {heads: 16, head_dim: 64, kv_heads: 4}
  prompt: 8K
  new_tokens: 3
  prefill: {name: ring, overlap: true}
  layout: striped
algorithms: [ring, tree]
"""


def write(tmp_path, text):
    path = tmp_path / "g.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_generate_rows_add_up(tmp_path):
    assert main(["run", str(write(tmp_path, GEN)), "-o", str(tmp_path / "o"), "--no-report", "--jobs", "1"]) == 0
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert list(df.columns[: len(DECODE_COLUMNS)]) == list(DECODE_COLUMNS)
    assert (df["phase"] == "generate").all() and (df["prefill"] == "ring").all()
    assert ((df["ttft_s"] + 3 * df["tpot_s"] - df["latency_s"]).abs() < 1e-12).all()
    assert df["ttft_s"].nunique() == 1  # one prefill, whatever decodes after it
    # the prefill is the prefill workload's ring; each step the decode workload's at that context
    prefill = GEN.replace("kind: generate", "kind: prefill").replace("prompt: 8K", "sequence: 8K") \
        .replace("  new_tokens: 3\n", "").replace("  prefill: {name: ring, overlap: true}\n", "") \
        .replace("algorithms: [ring, tree]", "algorithms: [ring]")
    (tmp_path / "p").mkdir()
    assert main(["run", str(write(tmp_path / "p", prefill)), "-o", str(tmp_path / "po"), "--no-report",
                 "--jobs", "1"]) == 0
    assert df["ttft_s"][0] == pd.read_csv(tmp_path / "po" / "results.csv")["latency_s"][0]
    cluster = load_topology("dgx-h100")
    steps = [simulate(build_schedule("tree", {"allreduce": "auto"}, DecodeShape(1, 16, 64, 4, 8192 + i, "bf16"),
                                     layout_of(cluster)), cluster).makespan for i in range(3)]
    assert df.set_index("algorithm").loc["tree", "tpot_s"] == pytest.approx(sum(steps) / 3, rel=1e-12)


@pytest.mark.parametrize(("change", "expected"), [
    (("prefill: {name: ring, overlap: true}", "prefill: tree"),
     "g.yaml:9: workload.prefill: unknown algorithm 'tree'; valid: ring, ring-q, allgather, ulysses, usp, single, "
     "auto"),
    (("algorithms: [ring, tree]", "algorithms: [ring, ulysses]"),
     "g.yaml:11: algorithms.1: unknown algorithm 'ulysses'; valid: ring, ring-q, tree"),
    (("prompt: 8K", "prompt: 4"), "g.yaml:7: workload.prompt: the prompt (4 tokens) must have at least one token"),
])
def test_generate_errors_are_located(change, expected, tmp_path, capsys):
    assert main(["run", str(write(tmp_path, GEN.replace(*change))), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"treering: error: {tmp_path}/{expected}"), err
    assert not (tmp_path / "o").exists()
