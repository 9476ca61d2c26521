"""Decode scenarios end to end: every scenario file runs, results are consistent, errors are located."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main
from simulator.run.kinds import KINDS
from simulator.run.rows import names
from simulator.support.paths import SCENARIO_DIR

DECODE_COLUMNS = names(KINDS["decode"].columns)

SHRINK = {  # keep every scenario small in the test suite
    "paper-scaling": ["--set", "sweep={topology_params.nodes: [1, 2], workload.context: [80000, 640000]}"],
    "collectives": ["--set", "sweep={topology_params.nodes: [1, 2], workload.bytes: [1 MiB, 64 MiB]}"],
    "prefill-layouts": ["--set", "sweep={topology_params.nodes: [1, 2], workload.layout: [contiguous, zigzag]}"],
    "generate": ["--set", "sweep={topology_params.nodes: [1, 2]}", "--set", "workload.new_tokens=2"],
    "cp-strategies": ["--set", "sweep={workload.backward: [false, true], zip: [{topology_params.nodes: [1, 2], "
                      "workload.model: [llama-3.1-8b, llama-3.1-70b]}]}", "--set", "workload.sequence=64K"],
    "straggler": ["--set", "sweep={topology_params.nodes: [2], faults.0.slowdown: [1.0, 1.2]}"],
    "cost": ["--set", "sweep={workload.context: [128K]}"],
    "prefix-cache": ["--set", "sweep={zip: [{workload.scope: [model, attention], workload.tp: [8, 1]}, "
                     "{workload.sequence: [1311, 131072], workload.cached: [129761, 0]}]}"],
}


@pytest.mark.parametrize("path", sorted(SCENARIO_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_scenario_file_runs(path, tmp_path, capsys):
    assert main(["run", str(path), "-o", str(tmp_path), *SHRINK.get(path.stem, [])]) == 0
    df = pd.read_csv(tmp_path / "results.csv")
    assert len(df) > 0
    if "latency_s" in df:
        assert list(df.columns[: len(DECODE_COLUMNS)]) == list(DECODE_COLUMNS)
        assert (df["latency_s"] > 0).all()
        assert ((df["compute_s"] + df["comm_s"] - df["latency_s"]).abs() < 1e-12).all()


DECODE = """
name: d
topology: dgx-h100
topology_params: {nodes: 2}
workload:
  kind: decode
  model: {heads: 8, head_dim: 64, kv_heads: 2}
  context: 4096
algorithms: [ring, {name: tree, allreduce: recursive-doubling}, single]
"""


def write(tmp: Path, text: str) -> Path:
    path = tmp / "d.yaml"
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def test_decode_numeric_rows(tmp_path):
    assert main(["run", str(write(tmp_path, DECODE)), "-o", str(tmp_path / "o"), "--numeric"]) == 0
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert list(df["algorithm"]) == ["ring", "tree[allreduce=recursive-doubling]", "single"]
    assert (df["max_abs_err"] < 1e-5).all()
    assert list(df["ranks"]) == [16, 16, 1] and list(df["nodes"]) == [2, 2, 1]
    assert df.loc[2, "bytes_moved"] == 0


def test_single_runs_out_of_memory_first(tmp_path):
    path = write(tmp_path, DECODE.replace("context: 4096", "context: 100000000").replace("kv_heads: 2", "kv_heads: 8"))
    assert main(["run", str(path), "-o", str(tmp_path / "o")]) == 0
    df = pd.read_csv(tmp_path / "o" / "results.csv").set_index("algorithm")
    assert bool(df.loc["single", "oom"]) and not bool(df.loc["ring", "oom"])


@pytest.mark.parametrize(("change", "expected"), [
    (("single]", "singel]"), "d.yaml:8: algorithms.2: unknown algorithm 'singel'; valid: ring, ring-q, tree"),
    (("allreduce: recursive-doubling", "allreduce: butterfly"), "d.yaml:8: algorithms.1.allreduce: must be one of"),
    (("allreduce: recursive-doubling", "fanout: 3"), "d.yaml:8: algorithms.1.fanout: algorithm 'tree' has no"),
    (("kv_heads: 2", "kv_heads: 3"), "d.yaml:6: workload.model: heads (8) must be a multiple of kv_heads (3)"),
    (("context: 4096", "context: -5"), "d.yaml:7: workload.context: must be a positive integer, got -5"),
    (("kind: decode", "kind: prefil"),
     "d.yaml:5: workload.kind: must be one of 'decode', 'flows', 'collective', 'prefill', 'generate', 'train', "
     "got 'prefil'"),
])
def test_decode_errors_are_located(change, expected, tmp_path, capsys):
    path = write(tmp_path, DECODE.replace(*change))
    assert main(["run", str(path), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"treering: error: {tmp_path}/{expected}"), err
    assert not (tmp_path / "o").exists()


def test_numeric_refuses_huge_contexts(tmp_path, capsys):
    path = write(tmp_path, DECODE.replace("context: 4096", "context: 500000000"))
    assert main(["run", str(path), "-o", str(tmp_path / "o"), "--numeric"]) == 2
    assert "--numeric holds K and V in memory" in capsys.readouterr().err
