"""The tile model of the attention kernels against the published FlashAttention-2 and -3 benchmark tables.

    python benchmarks/kernel_tables.py [--points]

Every published point is a batch of sequences totalling 16k tokens at hidden size 2048 (heads = 2048 / head dim),
bf16/fp16, timed as TFLOP/s with the forward counted as 4 b h n^2 d FLOPs (half of it causal) and the backward as
2.5 times that (FlashAttention-2, arXiv:2307.08691, Sec. 4.1; FlashAttention-3, arXiv:2407.08608, Sec. 4.1). The
model is :mod:`simulator.kernels.tiles` on the ``a100-sxm`` and ``h100-sxm`` specs of ``topologies/devices.yaml``,
nothing set from these tables. Prints each point (``--points``), then the median and 90th percentile of
|model / published - 1| per table and over all of them.

The values, as labelled on the bars (TFLOP/s):

* FlashAttention-2 paper, Fig. 4, "Attention forward + backward speed (A100 80GB SXM4)" (the same figure is
  ``assets/flash2_a100_fwd_bwd_benchmark.png`` in github.com/Dao-AILab/flash-attention); three labels hidden by the
  legend (no mask, head dim 64 at 1k; head dim 128 at 512 and 1k) are read off the bars' heights against the
  labelled ones (within about 1 TFLOP/s);
* FlashAttention-3 paper, Fig. 5 (a)-(f), "Attention forward speed (H100 80GB SXM5)", FlashAttention-3 bars (the
  same figure is ``assets/flash3_fp16_fwd.png``); the label of head dim 256 without mask at 1k is hidden by the
  legend and read off the bar (626);
* FlashAttention-3 paper, Fig. 6, "Attention backward speed (H100 80GB SXM5)", FlashAttention-3 bars, head dims 64
  and 128 without mask (the paper's only backward panels), as transcribed from the figure (not in the repository's
  assets).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator

from simulator.cluster.devices import DeviceSpec
from simulator.cluster.topology import device_library
from simulator.kernels.tiles import (
    AttentionCall,
    attention_time,
    call_dims,
    causal_launch,
    full_launch,
)

SEQ = (512, 1024, 2048, 4096, 8192, 16384)
TOKENS, HIDDEN = 16384, 2048

# (device, pass, head dim, causal) -> TFLOP/s at SEQ; pass "fwd+bwd" is one forward and one backward
TABLES: dict[tuple[str, str, int, bool], tuple[int, ...]] = {
    # FlashAttention-2 paper, Fig. 4 (a)-(d): FlashAttention-2 on A100 80GB SXM4, forward + backward
    ("a100-sxm", "fwd+bwd", 64, False): (132, 153, 162, 171, 175, 176),
    ("a100-sxm", "fwd+bwd", 128, False): (151, 173, 187, 196, 201, 203),
    ("a100-sxm", "fwd+bwd", 64, True): (88, 119, 140, 156, 165, 171),
    ("a100-sxm", "fwd+bwd", 128, True): (99, 133, 155, 173, 182, 189),
    # FlashAttention-3 paper, Fig. 5 (a)-(f): FlashAttention-3 on H100 80GB SXM5, forward
    ("h100-sxm", "fwd", 64, False): (333, 392, 460, 476, 496, 497),
    ("h100-sxm", "fwd", 64, True): (197, 265, 371, 420, 460, 473),
    ("h100-sxm", "fwd", 128, False): (467, 565, 625, 638, 646, 648),
    ("h100-sxm", "fwd", 128, True): (292, 423, 521, 579, 602, 616),
    ("h100-sxm", "fwd", 256, False): (482, 626, 707, 736, 746, 756),
    ("h100-sxm", "fwd", 256, True): (286, 427, 537, 612, 628, 642),
    # FlashAttention-3 paper, Fig. 6: FlashAttention-3 on H100 80GB SXM5, backward, no mask
    ("h100-sxm", "bwd", 64, False): (272, 363, 422, 453, 472, 474),
    ("h100-sxm", "bwd", 128, False): (316, 424, 501, 542, 559, 561),
}


def model_tflops(spec: DeviceSpec, which: str, head_dim: int, causal: bool, n: int) -> float:
    """The tile model's TFLOP/s at one published point (the papers' FLOP count over the modelled time)."""
    batch, heads = TOKENS // n, HIDDEN // head_dim
    launch = causal_launch(n, n) if causal else full_launch(n, n)
    call = AttentionCall(head_dim, batch * heads, 1, (launch,))
    dims = call_dims((batch * heads * n, n, head_dim, 0.5 if causal else 1.0), call)
    passes = {"fwd": (False,), "bwd": (True,), "fwd+bwd": (False, True)}[which]
    seconds = 0.0
    for backward in passes:
        t = attention_time(spec, backward, "bf16", dims)
        if t is None:
            raise SystemExit(f"{spec.name} has no tile model for head dim {head_dim}")
        seconds += t
    fwd_flops = 4.0 * batch * heads * n * n * head_dim / (2 if causal else 1)
    flops = fwd_flops * sum(2.5 if b else 1.0 for b in passes)
    return flops / seconds / 1e12


Point = tuple[tuple[str, str, int, bool], int, int, float]


def errors(specs: dict[str, DeviceSpec] | None = None) -> Iterator[Point]:
    """(table, sequence, published, model) for every published point."""
    specs = device_library() if specs is None else specs
    for key, values in TABLES.items():
        device, which, head_dim, causal = key
        for n, published in zip(SEQ, values, strict=True):
            yield key, n, published, model_tflops(specs[device], which, head_dim, causal, n)


def _summary(rel: list[float]) -> str:
    ordered = sorted(abs(x) for x in rel)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"median |error| {100 * statistics.median(ordered):5.1f} %, p90 {100 * p90:5.1f} %, n = {len(ordered)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", action="store_true", help="print every point")
    args = parser.parse_args(argv)
    by_table: dict[tuple[str, str, int, bool], list[float]] = {}
    for key, n, published, model in errors():
        rel = model / published - 1
        by_table.setdefault(key, []).append(rel)
        if args.points:
            device, which, head_dim, causal = key
            print(f"{device:9s} {which:8s} d={head_dim:<3d} {'causal' if causal else 'full  '} n={n:>5d}  "
                  f"published {published:4d}  model {model:6.1f}  {100 * rel:+6.1f} %")
    for (device, which, head_dim, causal), rel in by_table.items():
        print(f"{device:9s} {which:8s} d={head_dim:<3d} {'causal' if causal else 'full  '}  {_summary(rel)}")
    for label, keys in (("FlashAttention-2, A100", [k for k in by_table if k[0] == "a100-sxm"]),
                        ("FlashAttention-3, H100", [k for k in by_table if k[0] == "h100-sxm"])):
        print(f"{label:24s} {_summary([x for k in keys for x in by_table[k]])}")
    print(f"{'all':24s} {_summary([x for rel in by_table.values() for x in rel])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
