"""Whole-model decode steps (scope: model, tensor parallelism): model presets and user-defined models, separate
weight and KV dtypes; treering plan is in test_plan.py."""

from __future__ import annotations

import math
import textwrap

import pandas as pd
import pytest

from simulator.cli import main
from simulator.cluster.topology import load_topology, override_devices
from simulator.engine.core import simulate
from simulator.models.presets import PRESETS, custom_model
from simulator.models.step import attention_layer, dense_layer, model_step
from simulator.workloads.shape import DecodeShape


def test_model_step_composes_layers_and_holds_weights_and_every_layer_kv():
    model = PRESETS["llama-3.1-8b"]
    # the closed form below is the roofline at datasheet rates: efficiencies 1
    cluster = override_devices(load_topology("dgx-h100", {"nodes": 2}),
                               {"h100-sxm": {"eff_mem": 1.0, "eff_flops": 1.0}})
    shape = DecodeShape(1, model.heads, model.head_dim, model.kv_heads, 1 << 20, "bf16")
    step = model_step(model, "tree", {"allreduce": "auto"}, shape, 8, cluster)
    dense = simulate(dense_layer(model, shape, 8, cluster), cluster).makespan
    attn = simulate(attention_layer("tree", {"allreduce": "auto"}, shape, 8, cluster), cluster).makespan
    head = cluster.specs["n0.gpu0"].launch_s + model.head_weights / 8 * 2 / 3.35e12
    assert math.isclose(step.latency_s, model.layers * (dense + attn) + head, rel_tol=1e-9)
    # per GPU: 1/8 of the weights, and of each layer's KV its 1 KV head for half the context
    kv_per_layer = 2 * (1 << 19) * 1 * model.head_dim * 2
    expected = model.params / 8 * 2 + model.layers * kv_per_layer
    assert max(step.peaks) == pytest.approx(expected, rel=1e-3)


def test_tp_groups_run_attention_side_by_side_on_rails():
    cluster = load_topology("dgx-h100", {"nodes": 2})
    shape = DecodeShape(1, 32, 128, 8, 10000, "bf16")
    sched = attention_layer("ring", {"overlap": True}, shape, 8, cluster)
    assert sched.ranks == 16
    sends = [op for op in sched.ops if op.kind == "send"]
    place = sched.placement_on(cluster.ranks)
    # head group j runs on GPU j of both nodes: every transfer crosses nodes on one rail
    assert all(place[op.rank].split(".")[1] == place[op.peer].split(".")[1] for op in sends)


SCENARIO = """
name: m
topology: dgx-h100
workload: {{kind: decode, model: {model}, scope: {scope}, tp: {tp}, context: 65536}}
algorithms: [ring, tree]
"""


@pytest.mark.parametrize(("model", "scope", "tp", "message"), [
    ("llama-9", "model", 8, "workload.model: unknown model preset 'llama-9'"),
    ("{heads: 8, head_dim: 64}", "model", 1, "scope: model needs a model preset"),
    ("llama-3.1-8b", "model", 3, "tp (3) must divide the 32 attention heads"),
    ("llama-3.1-8b", "attention", 16, "tp (16) must divide the 8 GPUs"),
])
def test_model_scope_errors(model, scope, tp, message, tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(SCENARIO.format(model=model, scope=scope, tp=tp)).lstrip())
    assert main(["run", str(path), "-o", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err


def test_model_scope_rows(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(SCENARIO.format(model="llama-3.2-1b", scope="model", tp=8)).lstrip())
    assert main(["run", str(path), "-o", str(tmp_path / "o")]) == 0
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert list(df["model"]) == ["llama-3.2-1b"] * 2 and (df["tp"] == 8).all()
    assert (df["latency_s"] > 0).all() and not df["oom"].any()


def test_llama_405b_preset_matches_its_shapes():
    m = PRESETS["llama-3.1-405b"]
    again = custom_model(m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.intermediate, m.vocab)
    assert again.params == pytest.approx(m.params, rel=1e-4)
    # the published 70B count agrees with the same formula to within the norms
    m70 = PRESETS["llama-3.1-70b"]
    assert custom_model(m70.layers, m70.hidden, m70.heads, m70.kv_heads, m70.head_dim, m70.intermediate,
                        m70.vocab).params == pytest.approx(m70.params, rel=2e-3)


MODEL = """
name: m
topology: dgx-h100
workload:
  kind: decode
  model: {model}
  scope: model
  tp: 8
  context: 64K
  {extra}
algorithms: [tree]
"""
SHAPES_8B = "{layers: 32, hidden: 4096, heads: 32, kv_heads: 8, head_dim: 128, intermediate: 14336, vocab: 128256}"


def _run(tmp_path, model: str, extra: str = "") -> pd.Series:
    path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(textwrap.dedent(MODEL.format(model=model, extra=extra)).lstrip())
    out = path.with_suffix("")
    assert main(["run", str(path), "-o", str(out), "--no-report", "--jobs", "1"]) == 0
    return pd.read_csv(out / "results.csv").iloc[0]


def test_user_defined_model_runs_like_the_preset_of_its_shapes(tmp_path):
    custom = _run(tmp_path, SHAPES_8B)
    preset = _run(tmp_path, "llama-3.1-8b")
    assert custom["model"] == "custom" and custom["context"] == 65536
    assert custom["latency_s"] == pytest.approx(preset["latency_s"], rel=1e-12)  # same kernels
    # memory differs only by the parameter count: 8.03e9 published vs the shapes' count
    weights = custom_model(32, 4096, 32, 8, 128, 14336, 128256).params
    assert custom["peak_mem_bytes"] - preset["peak_mem_bytes"] == pytest.approx((weights - 8.03e9) / 8 * 2, rel=1e-6)


def test_a_model_block_without_its_whole_shape_is_refused_for_scope_model(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(MODEL.format(model="{heads: 32, head_dim: 128, layers: 2}", extra="")).lstrip())
    assert main(["run", str(path), "-o", str(tmp_path / "o")]) == 2
    assert "lacks hidden, intermediate, vocab" in capsys.readouterr().err


def test_weight_and_kv_dtypes(tmp_path):
    base = _run(tmp_path, "llama-3.1-8b")
    fp8_weights = _run(tmp_path, "llama-3.1-8b", "weight_dtype: fp8")
    fp8_kv = _run(tmp_path, "llama-3.1-8b", "kv_dtype: fp8")
    # one byte saved per weight, less the FP8 row-wise scales (one FP32 per output row of every matrix): Q, K, V
    # (32 + 2 x 8) x 128 rows and O 4096 per layer, gate and up 14336 each and down 4096, embedding and LM head
    scales = 32 * ((32 + 2 * 8) * 128 + 4096) + 32 * (2 * 14336 + 4096) + 2 * 128256
    weights = 8.03e9 / 8 - scales * 4 / 8
    assert base["peak_mem_bytes"] - fp8_weights["peak_mem_bytes"] == pytest.approx(weights, rel=1e-9)
    kv = 32 * 2 * 65536 * 1 * 128  # layers x (K, V) x tokens x 1 KV head per GPU x head_dim, 1 byte saved each
    assert base["peak_mem_bytes"] - fp8_kv["peak_mem_bytes"] == pytest.approx(kv, rel=0.01)
    assert fp8_weights["latency_s"] < base["latency_s"] and fp8_kv["latency_s"] < base["latency_s"]
