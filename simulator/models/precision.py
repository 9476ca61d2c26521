"""Weights in their own precision: the element type of each part of a model's weights, the rate its matmuls run
at, and the bytes it holds (pure functions, SI units).

A model's weights are three parts (docs/serving.md): ``attention`` (the Q, K, V and O projections of every layer),
``mlp`` (every layer's gated MLP) and ``head`` (the embedding, the LM head and the norms: the published parameter
count less the layers' matmul weights). Each part has its element type (default: the activations' ``dtype``).

* **Rate.** A matmul whose weights are FP8 runs as an FP8 GEMM (W8A8): its input activations are quantized to FP8
  row by row on the fly, one FP32 scale per row, as FBGEMM's row-wise FP8 GEMMs do (``f8f8bf16_rowwise``, used for
  Llama 3 405B's FP8 inference, arXiv:2407.21783 Sec. 6.2), and it runs at the device's FP8 rate
  (``peak_flops.fp8``: NVIDIA H100 datasheet, 1,979 TFLOP/s dense, topologies/devices.yaml); a device without one
  is refused. Weights of any other type are read at their size and multiplied at the activations' rate (a weight
  only conversion in the GEMM's prologue).
* **Memory.** Each part counts its weights at its element type; an FP8 part adds its row-wise scaling factors, one
  FP32 per output row of each matrix (Q, K, V: ``(heads + 2 kv_heads) head_dim`` rows; O: ``hidden``; gate and
  up: ``intermediate`` each; down: ``hidden``; embedding and LM head: ``vocab`` each), split over ``tp`` as the
  weights are. One element type for every part gives the published count times its size, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.models.presets import ModelPreset
from simulator.units import DTYPE_BYTES

__all__ = ["PARTS", "SCALE_BYTES", "WeightPrecision", "gemm_dtype", "part_weights", "scale_rows", "weight_bytes",
           "weight_precision"]

PARTS = ("attention", "mlp", "head")
SCALE_BYTES = 4  # one FP32 scaling factor per row of an FP8 matrix


@dataclass(frozen=True)
class WeightPrecision:
    """The element type of each part of the weights."""

    attention: str
    mlp: str
    head: str

    @property
    def uniform(self) -> str | None:
        """The one element type of every part, or None when they differ."""
        return self.attention if self.attention == self.mlp == self.head else None

    def of(self, part: str) -> str:
        return str(getattr(self, part))


def weight_precision(weight_dtype: str | WeightPrecision | dict[str, str | None] | None, dtype: str
                     ) -> WeightPrecision:
    """A workload's ``weight_dtype`` (None, one element type, or one per part, each part's default ``dtype``)."""
    if isinstance(weight_dtype, WeightPrecision):
        return weight_dtype
    if weight_dtype is None or isinstance(weight_dtype, str):
        one = weight_dtype or dtype
        return WeightPrecision(one, one, one)
    unknown = set(weight_dtype) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown weight parts {sorted(unknown)}; parts: {', '.join(PARTS)}")
    return WeightPrecision(*(weight_dtype.get(p) or dtype for p in PARTS))


def gemm_dtype(weight: str, activations: str) -> str:
    """The element type a matmul runs at: FP8 for FP8 weights (row-wise W8A8), else the activations'."""
    return "fp8" if weight == "fp8" else activations


def scale_rows(model: ModelPreset, part: str) -> int:
    """Output rows of a part's matrices (every layer's, or the embedding's and the LM head's): one row-wise scale
    each when the part is FP8."""
    if part == "attention":
        return model.layers * ((model.heads + 2 * model.kv_heads) * model.head_dim + model.hidden)
    if part == "mlp":
        return model.layers * (2 * model.intermediate + model.hidden)
    if part == "head":
        return 2 * model.vocab
    raise ValueError(f"unknown weight part {part!r}; parts: {', '.join(PARTS)}")


def part_weights(model: ModelPreset, part: str) -> float:
    """Weights of a part: every layer's projections or MLP, or the rest of the published count (``head``)."""
    attn = model.layer_weights - 3 * model.hidden * model.intermediate
    if part == "attention":
        return float(model.layers * attn)
    if part == "mlp":
        return float(model.layers * 3 * model.hidden * model.intermediate)
    return model.params - model.layers * model.layer_weights


def weight_bytes(model: ModelPreset, precision: WeightPrecision, tp: int) -> float:
    """Bytes of weights one GPU holds (1/tp of each part at its element type, and an FP8 part's scales)."""
    one = precision.uniform
    held = model.params / tp * DTYPE_BYTES[one] if one is not None else \
        sum(part_weights(model, p) * DTYPE_BYTES[precision.of(p)] for p in PARTS) / tp
    scales = sum(scale_rows(model, p) for p in PARTS if precision.of(p) == "fp8")
    return held + scales * SCALE_BYTES / tp if scales else held
