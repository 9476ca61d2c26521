"""Prefill scenarios end to end: rows and columns, numeric mode, located errors, the schema."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main
from simulator.run.kinds.prefill import PHASE_COLUMNS
from simulator.run.rows import STABLE as DECODE_COLUMNS
from simulator.run.rows import names

PREFILL_COLUMNS = names(PHASE_COLUMNS)

PREFILL = """
name: p
topology: dgx-h100
topology_params: {nodes: 1}
workload:
  kind: prefill
  model: {heads: 8, head_dim: 64, kv_heads: 2}
  sequence: 64K
  layout: zigzag
  backward: true
algorithms: [ring, {name: ring, overlap: false}, allgather, ulysses, single]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_prefill_rows(tmp_path):
    assert main(["run", str(write(tmp_path, PREFILL)), "-o", str(tmp_path / "o"), "--no-report", "--jobs", "1"]) == 0
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert list(df.columns[: len(DECODE_COLUMNS)]) == list(DECODE_COLUMNS)
    df = df.set_index("algorithm")
    assert set(PREFILL_COLUMNS) <= set(df.columns)
    assert (df["phase"] == "train").all() and (df["sequence"] == 65536).all() and (df["layout"] == "zigzag").all()
    assert ((df["compute_s"] + df["comm_s"] - df["latency_s"]).abs() < 1e-12).all()
    flops = 4 * 8 * 64 * (65536 * 65537 // 2) * 3.5
    assert df.loc["ring", "tflops_per_gpu"] == pytest.approx(flops / df.loc["ring", "latency_s"] / 8 / 1e12)
    assert math.isnan(df.loc["single", "comm_hidden_frac"]) and df.loc["single", "ranks"] == 1
    assert 0 <= df.loc["ring", "comm_hidden_frac"] <= 1
    assert df.loc["ring", "imbalance"] < 1.02
    assert df.loc["single", "latency_s"] > df.loc["ring", "latency_s"]
    assert df.loc["ring[overlap=False]", "latency_s"] > df.loc["ring", "latency_s"]


def test_prefill_numeric(tmp_path):
    text = PREFILL.replace("sequence: 64K", "sequence: 203").replace("layout: zigzag", "layout: striped")
    assert main(["run", str(write(tmp_path, text)), "-o", str(tmp_path / "o"), "--numeric", "--no-report",
                 "--jobs", "1"]) == 0
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert (df["max_abs_err"] < 1e-5).all() and (df["max_grad_err"] < 1e-5).all()  # bf16 replayed in fp32


@pytest.mark.parametrize(("change", "expected"), [
    (("layout: zigzag", "layout: zagzig"), "p.yaml:9: workload.layout: must be one of 'contiguous', 'zigzag' or "
                                           "'striped', got 'zagzig'"),
    (("sequence: 64K", "sequence: 5"), "p.yaml:8: workload.sequence: the sequence (5 tokens) must have at least one "
                                       "token per rank (8 ranks)"),
    (("sequence: 64K", "sequence: 4Kx"),
     "p.yaml:8: workload.sequence: expected a token count such as 1048576, 128K or 1M, got '4Kx'"),
    (("heads: 8, head_dim: 64, kv_heads: 2", "heads: 12, head_dim: 64, kv_heads: 2"),
     "p.yaml:7: workload.model.heads: ulysses splits the 12 heads over the 8 ranks"),
    (("heads: 8, head_dim: 64, kv_heads: 2", "heads: 24, head_dim: 64, kv_heads: 3"),
     "p.yaml:7: workload.model.kv_heads: ulysses with 3 KV heads on 8 ranks"),
    (("single]", "tree]"), "p.yaml:11: algorithms.4: unknown algorithm 'tree'; valid: ring, ring-q, allgather, "
                           "ulysses, usp, single, auto"),
    (("overlap: false", "overlap: 2"), "p.yaml:11: algorithms.1.overlap: must be true or false"),
    (("overlap: false", "p2p: lazy"), "p.yaml:11: algorithms.1.p2p: must be one of batched, per-peer, got 'lazy'"),
])
def test_prefill_errors_are_located(change, expected, tmp_path, capsys):
    path = write(tmp_path, PREFILL.replace(*change))
    assert main(["run", str(path), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"treering: error: {tmp_path}/{expected}"), err
    assert not (tmp_path / "o").exists()


def test_numeric_refuses_long_sequences(tmp_path, capsys):
    assert main(["run", str(write(tmp_path, PREFILL)), "-o", str(tmp_path / "o"), "--numeric",
                 "--set", "workload.sequence=1M"]) == 2
    assert "--numeric checks against dense attention" in capsys.readouterr().err


def test_schema_has_the_prefill_keys(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    prefill = schema["$defs"]["PrefillWorkload"]["properties"]
    assert {"kind", "model", "batch", "sequence", "dtype", "causal", "layout", "backward"} <= set(prefill)
