"""generate ``turns:`` (issue 42): each turn's prompt prefilled on the KV cache of the earlier turns, then its decode
steps; the row is the sum of the prefills on a cached prefix and the decode steps at their contexts."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main


def _run(tmp_path: Path, text: str) -> pd.DataFrame:
    path = tmp_path / f"s{len(list(tmp_path.glob('s*.yaml')))}.yaml"
    path.write_text(textwrap.dedent(text).lstrip())
    out = path.with_suffix("")
    assert main(["run", str(path), "-o", str(out), "--no-report", "--jobs", "1"]) == 0
    return pd.read_csv(out / "results.csv")


def test_a_conversation_is_its_prefills_on_the_cache_and_its_steps(tmp_path):
    chat = _run(tmp_path, """
        name: chat
        topology: dgx-h100
        workload: {kind: generate, model: llama-3.1-8b, prefill: ring-q,
                   turns: [{prompt: 8K, new_tokens: 3}, {prompt: 1K, new_tokens: 2}]}
        algorithms: [tree]
        """).iloc[0]
    assert (chat["turns"], chat["new_tokens"], chat["context"]) == (2, 5, 8192)
    second = _run(tmp_path, """
        name: p
        topology: dgx-h100
        workload: {kind: prefill, model: llama-3.1-8b, sequence: 1K, cached: 8195}
        algorithms: [ring-q]
        """).iloc[0]
    assert chat["last_ttft_s"] == second["latency_s"]  # 8,192 + 3 tokens cached before the second prompt
    first = _run(tmp_path, """
        name: g
        topology: dgx-h100
        workload: {kind: generate, model: llama-3.1-8b, prompt: 8K, new_tokens: 1, prefill: ring-q}
        algorithms: [tree]
        """).iloc[0]
    assert chat["ttft_s"] == first["ttft_s"]
    steps = _run(tmp_path, """
        name: d
        topology: dgx-h100
        workload: {kind: decode, model: llama-3.1-8b, context: 8192}
        algorithms: [tree]
        sweep:
          workload.context: [8192, 8193, 8194, 9219, 9220]
        """)
    assert chat["latency_s"] == pytest.approx(chat["ttft_s"] + chat["last_ttft_s"] + steps["latency_s"].sum(),
                                              rel=1e-12)
    assert chat["tpot_s"] == pytest.approx(steps["latency_s"].mean(), rel=1e-12)


@pytest.mark.parametrize(("workload", "message"), [
    ("{kind: generate, model: llama-3.1-8b, prompt: 4K, turns: [{prompt: 1K}]}",
     "give turns, or prompt and new_tokens, not both (prompt given)"),
    ("{kind: generate, model: llama-3.1-8b, prefill: ulysses, turns: [{prompt: 4K}, {prompt: 1K}]}",
     "workload.prefill: ulysses does not prefill on a cached prefix"),
    ("{kind: generate, model: llama-3.1-8b, turns: [{prompt: 4K}, {prompt: 4}]}",
     "workload.turns.1.prompt: the prompt (4 tokens) must have at least one token per rank (8 ranks)"),
])
def test_refusals_are_one_located_line(tmp_path, capsys, workload, message):
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\ntopology: dgx-h100\nworkload: {workload}\nalgorithms: [tree]\n")
    assert main(["run", str(path), "-o", str(tmp_path / "o"), "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
