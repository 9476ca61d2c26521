"""``treering validate --random N --seed S``: decode workloads drawn at random, off the calibration grid.

A model that is right only on the workload it was developed against is not validated. These draws span what a
planner asks about (the issue's ranges): batch 1-8, heads 1-32, kv_heads a divisor of heads, head_dim 32-256,
contexts 1k-200k tokens (log-uniform), dtype fp32 / fp64 / bf16. A prefill base scenario gets prefill draws instead:
batch 1-2, heads 2-16 with kv_heads a divisor (heads a multiple of P, kv_heads a multiple or a divisor of P, as
Ulysses needs), sequences 1k-8k, fp32 or
fp64, causal or not, any layout, forward or forward + backward. Two rules keep them honest and runnable:

* **off the grid**: head dimensions are drawn from values that ``treering calibrate`` does not profile (it
  profiles 32, 64, 128, 256 for decode, 32 and 128 for prefill blocks), so every prediction interpolates between
  profiled shapes;
* **in memory**: the P ranks of one machine hold the whole KV cache and real runs repeat each schedule many times;
  a draw whose KV cache exceeds ``max_kv_bytes`` gets its context scaled down to fit (said in ``kv_capped``), so
  that the draw's shape, not the machine's memory, is what is validated; a prefill draw's sequence is shortened
  likewise until a rank's largest score block (batch x heads x n x n / P elements) fits in ``max_kv_bytes``.

The draws depend only on the seed (and N, and the limit): the same command validates the same shapes.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from simulator.run.scenario import DecodeWorkload, Point
from simulator.units import DTYPE_BYTES
from simulator.workloads.prefill import PrefillWorkload

__all__ = ["HEAD_DIMS", "PREFILL_HEAD_DIMS", "RandomPrefill", "RandomShape", "draw_prefill_shapes", "draw_shapes",
           "random_points"]

HEAD_DIMS = (40, 48, 80, 96, 112, 160, 192, 224)  # 32..256, none of them a profiled head_dim
DTYPES = ("fp32", "fp64", "bf16")
MAX_KV_BYTES = 512 * 2**20  # the whole KV cache of one draw, all ranks together


@dataclass(frozen=True)
class RandomShape:
    """One drawn decode workload."""

    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int
    dtype: str
    kv_capped: bool  # the drawn context was scaled down to fit the memory limit

    def kv_bytes(self) -> int:
        elem = DTYPE_BYTES[self.dtype]
        return 2 * self.batch * self.kv_heads * self.context * self.head_dim * elem

    def columns(self) -> dict[str, Any]:
        return {"batch": self.batch, "heads": self.heads, "kv_heads": self.kv_heads, "head_dim": self.head_dim,
                "dtype": self.dtype, "kv_capped": self.kv_capped}


def draw_shapes(n: int, seed: int, ranks: int, max_kv_bytes: int = MAX_KV_BYTES) -> list[RandomShape]:
    """``n`` random decode shapes (see the module docstring); contexts are at least 64 tokens per rank."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        heads = rng.randint(1, 32)
        kv_heads = rng.choice([d for d in range(1, heads + 1) if heads % d == 0])
        batch = rng.randint(1, 8)
        head_dim = rng.choice(HEAD_DIMS)
        dtype = rng.choice(DTYPES)
        context = round(math.exp(rng.uniform(math.log(1024), math.log(200_000))))
        shape = RandomShape(batch, heads, kv_heads, head_dim, context, dtype, False)
        if shape.kv_bytes() > max_kv_bytes:
            context = max(64 * ranks, int(context * max_kv_bytes / shape.kv_bytes()))
            shape = RandomShape(batch, heads, kv_heads, head_dim, context, dtype, True)
        out.append(shape)
    return out


def random_points(base: Point, n: int, seed: int, ranks: int, max_kv_bytes: int = MAX_KV_BYTES) -> list[Point]:
    """The base scenario's point with its workload replaced by each of ``n`` random shapes (decode or prefill, as
    the base's workload)."""
    workload = base.scenario.workload
    if isinstance(workload, PrefillWorkload):
        return _prefill_points(base, workload, n, seed, ranks, max_kv_bytes)
    if not isinstance(workload, DecodeWorkload):
        raise TypeError("random shapes replace a decode or prefill workload")
    points = []
    for s in draw_shapes(n, seed, ranks, max_kv_bytes):
        new = DecodeWorkload.model_validate({
            **workload.model_dump(exclude={"model", "scope", "weight_dtype", "kv_dtype"}),
            "model": {"heads": s.heads, "kv_heads": s.kv_heads, "head_dim": s.head_dim}, "batch": s.batch,
            "context": s.context, "dtype": s.dtype})
        scenario = base.scenario.model_copy(update={"workload": new})
        swept = tuple((f"random.{k}", v) for k, v in s.columns().items())
        points.append(Point(scenario, swept, base.source, base.base_dir))
    return points


PREFILL_HEAD_DIMS = (40, 48, 64, 80, 96, 112)  # between the prefill profile's 32 and 128, none of them on it


@dataclass(frozen=True)
class RandomPrefill:
    """One drawn prefill (or training) workload."""

    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    sequence: int
    dtype: str
    causal: bool
    layout: str
    backward: bool
    capped: bool

    def columns(self) -> dict[str, Any]:
        return {"batch": self.batch, "heads": self.heads, "kv_heads": self.kv_heads, "head_dim": self.head_dim,
                "dtype": self.dtype, "causal": self.causal, "layout": self.layout, "backward": self.backward,
                "capped": self.capped}


def draw_prefill_shapes(n: int, seed: int, ranks: int, max_bytes: int = MAX_KV_BYTES) -> list[RandomPrefill]:
    """``n`` random prefill shapes (see the module docstring)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        heads = ranks * rng.randint(1, max(1, 16 // ranks))
        # Ulysses splits KV heads over the ranks (a multiple of P) or replicates them (a divisor of P)
        kv_heads = rng.choice([d for d in range(1, heads + 1) if heads % d == 0 and (d % ranks == 0 or ranks % d == 0)])
        batch, head_dim, dtype = rng.randint(1, 2), rng.choice(PREFILL_HEAD_DIMS), rng.choice(["fp32", "fp64"])
        sequence = round(math.exp(rng.uniform(math.log(1024), math.log(8192))))
        elem = DTYPE_BYTES[dtype]
        limit = math.isqrt(max(1, max_bytes * ranks // (batch * heads * elem)))
        capped = sequence > limit
        sequence = max(2 * ranks, min(sequence, limit))
        out.append(RandomPrefill(batch, heads, kv_heads, head_dim, sequence, dtype, rng.random() < 0.75,
                                 rng.choice(["contiguous", "zigzag", "striped"]), rng.random() < 0.5, capped))
    return out


def _prefill_points(base: Point, workload: PrefillWorkload, n: int, seed: int, ranks: int,
                    max_bytes: int) -> list[Point]:
    points = []
    for s in draw_prefill_shapes(n, seed, ranks, max_bytes):
        new = PrefillWorkload.model_validate({
            **workload.model_dump(exclude={"model", "scope", "tp"}),
            "model": {"heads": s.heads, "kv_heads": s.kv_heads, "head_dim": s.head_dim}, "batch": s.batch,
            "sequence": s.sequence, "dtype": s.dtype, "causal": s.causal, "layout": s.layout,
            "backward": s.backward})
        scenario = base.scenario.model_copy(update={"workload": new})
        points.append(Point(scenario, tuple((f"random.{k}", v) for k, v in s.columns().items()), base.source,
                            base.base_dir))
    return points
