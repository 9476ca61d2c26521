"""Weights and caches in their own precision (issue 42): ``weight_dtype`` per part, FP8 matmuls at the device's FP8
rate with their row-wise scales, memory per part, ``kv_dtype`` in prefill and generate, defaults unchanged, and the
refusal of FP8 weights on a device without FP8."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest

from simulator.algorithms import Layout
from simulator.algorithms.prefill import build_prefill
from simulator.cli import main
from simulator.models.precision import (
    SCALE_BYTES,
    WeightPrecision,
    part_weights,
    scale_rows,
    weight_bytes,
    weight_precision,
)
from simulator.models.presets import PRESETS
from simulator.models.step import dense_layer
from simulator.run.prepared import cluster_for
from simulator.run.scenario import load_scenario
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.shape import DecodeShape

M405 = PRESETS["llama-3.1-405b"]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / f"s{len(list(tmp_path.glob('s*.yaml')))}.yaml"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def _run(tmp_path: Path, text: str) -> pd.DataFrame:
    path = _write(tmp_path, text)
    out = path.with_suffix("")
    assert main(["run", str(path), "-o", str(out), "--no-report", "--jobs", "1"]) == 0
    return pd.read_csv(out / "results.csv")


def test_parts_and_defaults():
    assert weight_precision(None, "bf16") == WeightPrecision("bf16", "bf16", "bf16")
    assert weight_precision({"mlp": "fp8"}, "bf16") == WeightPrecision("bf16", "fp8", "bf16")
    assert weight_precision({"mlp": "fp8"}, "bf16").uniform is None
    with pytest.raises(ValueError, match="unknown weight parts"):
        weight_precision({"ffn": "fp8"}, "bf16")


def test_memory_counts_each_part_in_its_dtype_and_the_scales():
    tp = 8
    assert weight_bytes(M405, weight_precision(None, "bf16"), tp) == M405.params / tp * 2  # as before, exactly
    attn = 126 * (16384 * (128 + 2 * 8) * 128 + 128 * 128 * 16384)
    mlp = 126 * 3 * 16384 * 53248
    assert part_weights(M405, "attention") + part_weights(M405, "mlp") == 126 * M405.layer_weights
    assert (part_weights(M405, "attention"), part_weights(M405, "mlp")) == (attn, mlp)
    rows = 126 * (2 * 53248 + 16384)  # gate, up and down: one FP32 scale per output row
    assert scale_rows(M405, "mlp") == rows
    rest = M405.params - attn - mlp
    want = (attn * 2 + mlp * 1 + rest * 2) / tp + rows * SCALE_BYTES / tp
    assert weight_bytes(M405, weight_precision({"mlp": "fp8"}, "bf16"), tp) == pytest.approx(want, rel=1e-15)


def test_fp8_matmuls_run_at_the_fp8_rate_with_their_scales(tmp_path):
    path = _write(tmp_path, "name: s\ntopology: dgx-h100\nworkload: {kind: decode, model: llama-3.1-8b, "
                            "context: 1024}\nalgorithms: [ring]\n")
    cluster = cluster_for(load_scenario(str(path))[0])
    model, tp, rows = PRESETS["llama-3.1-8b"], 8, 512
    shape = PrefillShape(1, 32, 128, 8, 4096, "bf16")
    mixed = dense_layer(model, shape, tp, cluster, weight_precision({"mlp": "fp8"}, "bf16"), rows=[rows] * 8,
                        elementwise=True)
    plain = dense_layer(model, shape, tp, cluster, rows=[rows] * 8, elementwise=True)
    op = {(o.rank, o.name): o for o in mixed.ops}
    base = {(o.rank, o.name): o for o in plain.ops}
    mlp_w = 3 * 4096 * 14336 // tp
    assert op[0, "mlp"].dtype == "fp8" and op[0, "qkv"].dtype == op[0, "o-proj"].dtype == "bf16"
    assert op[0, "mlp"].flops == base[0, "mlp"].flops  # the same matmul, at another rate
    assert op[0, "mlp"].nbytes == base[0, "mlp"].nbytes - mlp_w + (2 * 14336 + 4096) * SCALE_BYTES / tp
    assert op[0, "qkv"] == base[0, "qkv"]._replace(id=op[0, "qkv"].id, deps=op[0, "qkv"].deps)
    # the MLP's inputs quantized row by row (hidden, then intermediate / tp): read bf16, write fp8, a scale a row
    assert op[0, "mlp.quantize"].nbytes == rows * ((4096 + 14336 // tp) * 3 + 2 * SCALE_BYTES)
    assert (0, "qkv.quantize") not in op
    assert cluster.specs[cluster.ranks[0]].flops_for("fp8") == 1979e12  # H100 SXM datasheet, FP8 dense


def test_fp8_mlp_weights_let_405b_fit_one_server_and_run_faster(tmp_path):
    rows = _run(tmp_path, """
        name: s
        topology: dgx-h100
        workload: {kind: prefill, model: llama-3.1-405b, scope: model, tp: 8, sequence: 8K}
        algorithms: [ring]
        sweep:
          workload.weight_dtype: [bf16, fp8]
        """)
    bf16, fp8 = rows.iloc[0], rows.iloc[1]
    assert bool(bf16["oom"]) and not bool(fp8["oom"])  # 101 GB of BF16 weights per GPU on an 80 GB H100
    assert fp8["latency_s"] < bf16["latency_s"]
    mixed = _run(tmp_path, """
        name: s
        topology: dgx-h100
        workload: {kind: prefill, model: llama-3.1-405b, scope: model, tp: 8, sequence: 8K,
                   weight_dtype: {mlp: fp8}}
        algorithms: [ring]
        """).iloc[0]
    assert fp8["peak_mem_bytes"] < mixed["peak_mem_bytes"] < bf16["peak_mem_bytes"]
    assert fp8["latency_s"] < mixed["latency_s"] < bf16["latency_s"]


def test_kv_dtype_sets_the_bytes_ring_passes_and_holds():
    bf16 = PrefillShape(1, 32, 128, 8, 4000, "bf16")
    fp8 = PrefillShape(1, 32, 128, 8, 4000, "bf16", kv_dtype="fp8")
    a, b = (build_prefill("ring", {}, s, Layout((0, 0, 1, 1))) for s in (bf16, fp8))
    sends = [sum(op.nbytes for op in s.ops if op.kind == "send") for s in (a, b)]
    assert sends[0] == 2 * sends[1] == 3 * 2 * 4000 * 8 * 128 * 2
    assert b.initial[0]["kv"] * 2 == a.initial[0]["kv"] and b.initial[0]["q"] == a.initial[0]["q"]
    assert DecodeShape(1, 32, 128, 8, 100, "bf16", kv_dtype="fp8").kv_bytes(100) == 2 * 100 * 8 * 128


def test_generate_takes_weight_and_kv_dtypes(tmp_path):
    rows = _run(tmp_path, """
        name: g
        topology: dgx-h100
        workload: {kind: generate, model: llama-3.1-8b, scope: model, tp: 8, prompt: 8K, new_tokens: 2}
        algorithms: [ring]
        sweep:
          workload.kv_dtype: [bf16, fp8]
          workload.weight_dtype: [bf16, fp8]
        """)
    lat = {(r["workload.kv_dtype"], r["workload.weight_dtype"]): r for _, r in rows.iterrows()}
    assert lat["fp8", "fp8"]["peak_mem_bytes"] < lat["bf16", "fp8"]["peak_mem_bytes"] < lat["bf16", "bf16"][
        "peak_mem_bytes"]
    assert lat["bf16", "fp8"]["ttft_s"] < lat["bf16", "bf16"]["ttft_s"]
    assert lat["bf16", "fp8"]["tpot_s"] < lat["bf16", "bf16"]["tpot_s"]


def test_explicit_defaults_are_the_defaults_to_the_last_float(tmp_path):
    base = _run(tmp_path, """
        name: s
        topology: dgx-h100
        workload: {kind: prefill, model: llama-3.1-8b, scope: model, tp: 2, sequence: 8K}
        algorithms: [ring, ring-q]
        """)
    explicit = _run(tmp_path, """
        name: s
        topology: dgx-h100
        workload: {kind: prefill, model: llama-3.1-8b, scope: model, tp: 2, sequence: 8K, cached: 0,
                   weight_dtype: {attention: bf16, mlp: bf16, head: bf16}, kv_dtype: bf16}
        algorithms: [ring, ring-q]
        """)
    for col in ("latency_s", "compute_s", "bytes_moved", "peak_mem_bytes", "tflops_per_gpu"):
        assert base[col].tolist() == explicit[col].tolist(), col


@pytest.mark.parametrize(("workload", "where"), [
    ("{kind: prefill, model: llama-3.1-8b, scope: model, sequence: 4096, weight_dtype: {mlp: fp8}}",
     "s.yaml:3: workload.weight_dtype.mlp: FP8 weights run FP8 matmuls, and device 'a100-sxm' has no FP8 rate"),
    ("{kind: decode, model: llama-3.1-8b, scope: model, context: 4096, weight_dtype: fp8}",
     "s.yaml:3: workload.weight_dtype: FP8 weights run FP8 matmuls, and device 'a100-sxm' has no FP8 rate"),
    ("{kind: generate, model: llama-3.1-8b, scope: model, prompt: 4096, weight_dtype: {attention: fp8}}",
     "s.yaml:3: workload.weight_dtype.attention: FP8 weights run FP8 matmuls"),
    ("{kind: prefill, model: llama-3.1-8b, sequence: 4096, kv_dtype: fp8, backward: true}",
     "s.yaml:3: workload: kv_dtype is the KV cache's element type, forward only"),
])
def test_refusals_are_one_located_line(tmp_path, capsys, workload, where):
    path = tmp_path / "s.yaml"
    algo = "tree" if "decode" in workload or "generate" in workload else "ring"
    path.write_text(f"name: s\ntopology: dgx-a100\nworkload: {workload}\nalgorithms: [{algo}]\n")
    assert main(["run", str(path), "-o", str(tmp_path / "o"), "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and where in err[0], err
