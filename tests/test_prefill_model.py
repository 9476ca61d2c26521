"""scope: model for prefill and generate: the schedules' FLOPs and the rows' model FLOPs against closed forms for
Llama-3.1-8B, with and without tensor parallelism; the scope in the rows; what scope: model refuses."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from simulator.algorithms.prefill import build_prefill
from simulator.errors import InputError
from simulator.models.presets import PRESETS
from simulator.models.step import attention_layer, dense_layer, group_tokens, prefill_model_flops
from simulator.run.prepare import run_point
from simulator.run.prepared import cluster_for
from simulator.run.scenario import load_scenario
from simulator.workloads.prefill_shape import PrefillShape

N = 4099  # uneven over 8 and 16 ranks
LAYERS, HIDDEN, HEADS, KV, HEAD_DIM, INTER, VOCAB = 32, 4096, 32, 8, 128, 14336, 128256  # Llama-3.1-8B
LAYER_WEIGHTS = HIDDEN * (HEADS + 2 * KV) * HEAD_DIM + HEADS * HEAD_DIM * HIDDEN + 3 * HIDDEN * INTER
ATTENTION = 4 * HEADS * HEAD_DIM * N * (N + 1) // 2  # causal: n(n+1)/2 pairs per head, 4 FLOPs per pair and dim
PREFILL_FLOPS = LAYERS * (2 * N * LAYER_WEIGHTS + ATTENTION) + 2 * VOCAB * HIDDEN  # LM head: the last token


def _scenario(tmp_path: Path, workload: dict, algorithms: list[str]) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "m", "topology": "dgx-h100", "topology_params": {"nodes": 1},
                                    "workload": workload, "algorithms": algorithms}))
    return str(path)


def test_layer_weights_are_the_published_shapes():
    assert PRESETS["llama-3.1-8b"].layer_weights == LAYER_WEIGHTS == 218_103_808


@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
def test_one_layer_schedules_hold_the_closed_form_flops(tmp_path, tp, layout):
    point = load_scenario(_scenario(tmp_path, {"kind": "prefill", "model": "llama-3.1-8b", "sequence": N}, ["ring"]))[0]
    cluster = cluster_for(point)
    shape = PrefillShape(batch=1, heads=HEADS, head_dim=HEAD_DIM, kv_heads=KV, sequence=N, dtype="bf16",
                         layout=layout)
    tokens = group_tokens(shape, 8 // tp)
    assert sum(tokens) == N
    rows = [tokens[r // tp] for r in range(8)]
    dense = dense_layer(PRESETS["llama-3.1-8b"], shape, tp, cluster, rows=rows, elementwise=True)
    matmuls = sum(op.flops for op in dense.ops if op.name in ("qkv", "o-proj", "mlp"))
    assert matmuls == 2 * N * LAYER_WEIGHTS  # every token through every weight once, over the tp group
    norms = sum(op.flops for op in dense.ops if op.name.endswith(".norm"))
    assert norms == 2 * 5 * N * HIDDEN * tp  # two RMSNorms per layer, on every rank of a group
    attn = attention_layer("ring", {"overlap": True}, shape, tp, cluster, build=build_prefill)
    assert sum(op.flops for op in attn.ops if op.fn == "attn-fwd") == ATTENTION


def test_prefill_model_flops_closed_form():
    shape = PrefillShape(batch=1, heads=HEADS, head_dim=HEAD_DIM, kv_heads=KV, sequence=N, dtype="bf16")
    assert prefill_model_flops(PRESETS["llama-3.1-8b"], shape) == PREFILL_FLOPS


@pytest.mark.parametrize("tp", [1, 2])
def test_prefill_rows_count_model_flops_and_say_the_scope(tmp_path, tp):
    wl = {"kind": "prefill", "model": "llama-3.1-8b", "scope": "model", "tp": tp, "sequence": N}
    rows = run_point(load_scenario(_scenario(tmp_path, wl, ["ring", "allgather", "ulysses"]))[0])
    for row in rows:
        assert (row["scope"], row["model"], row["tp"], row["phase"]) == ("model", "llama-3.1-8b", tp, "prefill")
        flops = row["tflops_per_gpu"] * 1e12 * row["latency_s"] * 8
        assert math.isclose(flops, PREFILL_FLOPS, rel_tol=1e-12)
        assert row["latency_s"] > PREFILL_FLOPS / 8 / 989e12  # above the H100s' peak bf16 rate
        assert not row["oom"] and row["peak_mem_bytes"] > 8.03e9 * 2 / tp  # bf16 weights


def test_generate_rows_count_prefill_and_decode_model_flops(tmp_path):
    wl = {"kind": "generate", "model": "llama-3.1-8b", "scope": "model", "prompt": N, "new_tokens": 3,
          "prefill": "ring"}
    rows = run_point(load_scenario(_scenario(tmp_path, wl, ["ring", "tree"]))[0])
    decode = sum(LAYERS * (4 * HEADS * HEAD_DIM * (N + i) + 2 * LAYER_WEIGHTS) + 2 * VOCAB * HIDDEN
                 for i in range(3))
    for row in rows:
        assert row["scope"] == "model" and row["tp"] == 1
        assert math.isclose(row["tflops_per_gpu"] * 1e12 * row["latency_s"] * 8, PREFILL_FLOPS + decode,
                            rel_tol=1e-12)
        assert math.isclose(row["latency_s"], row["ttft_s"] + 3 * row["tpot_s"], rel_tol=1e-12)
    prefill = run_point(load_scenario(_scenario(tmp_path, {"kind": "prefill", "model": "llama-3.1-8b",
                                                           "scope": "model", "sequence": N}, ["ring"]))[0])[0]
    assert rows[0]["ttft_s"] == rows[1]["ttft_s"] == prefill["latency_s"]  # the same prefill as the prefill kind


@pytest.mark.parametrize(("workload", "field", "message"), [
    ({"kind": "prefill", "model": "llama-3.1-8b", "scope": "model", "sequence": 4096, "backward": True},
     "workload", "scope: model is forward only"),
    ({"kind": "prefill", "model": "llama-3.1-8b", "tp": 2, "sequence": 4096}, "workload", "tp (2) needs scope: model"),
    ({"kind": "generate", "model": {"heads": 32, "head_dim": 128}, "scope": "model", "prompt": 4096},
     "workload", "scope: model needs a model preset"),
    ({"kind": "generate", "model": "llama-3.1-8b", "scope": "model", "tp": 3, "prompt": 4096},
     "workload", "tp (3) must divide the 32 attention heads"),
])
def test_scope_model_refusals_are_located(tmp_path, workload, field, message):
    with pytest.raises(InputError) as exc:
        load_scenario(_scenario(tmp_path, workload, ["ring"]))
    assert exc.value.field == field and exc.value.message.startswith(message) and exc.value.line is not None
