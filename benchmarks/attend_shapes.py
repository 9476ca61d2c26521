"""Time the decode ``attend`` kernel (the merge core's partial attention merged into a running state, as the real runs
call it) on CPU shapes given on the command line: what the kernel profile's axes leave out or interpolate over.

    python benchmarks/attend_shapes.py --dtype fp64 --kv-mib 64 --head-dim 96 --groups 1-8,16,32
    python benchmarks/attend_shapes.py --dtype bf16 --kv-mib 256 --head-dim 128,160 --rows 4,112

Each shape: ``rows`` (batch x KV heads, as batch 1 x rows KV heads) independent problems of ``group`` query heads
against ``tokens`` keys, the tokens following from the KV bytes; one thread; the median of ``--reps`` calls timed by
the thread's CPU time after one warm-up call.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from simulator.merge import merge, partial_attention

DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16}


def counts(text: str) -> list[int]:
    """``1-8,16,32`` -> [1, ..., 8, 16, 32]."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    if not out or min(out) < 1:
        raise ValueError(text)
    return out


def positive(text: str) -> float:
    """A positive finite number (KV MiB)."""
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError(text)
    return value


def count(text: str) -> int:
    """A positive whole number (repetitions)."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def time_attend(rows: int, group: int, head_dim: int, kv_bytes: float, dtype: str, reps: int) -> tuple[int, float]:
    """(tokens, median seconds) of one attend call."""
    tdt = DTYPES[dtype]
    tokens = max(1, round(kv_bytes / (2 * rows * head_dim * torch.tensor([], dtype=tdt).element_size())))
    q = torch.randn(1, rows * group, 1, head_dim).to(tdt)
    kv = torch.randn(2, 1, rows, tokens, head_dim).to(tdt)  # one packed block, as the real runs' KV cache
    scale = 1 / math.sqrt(head_dim)
    acc = partial_attention(q, kv[0][:, :, :1], kv[1][:, :, :1], scale)
    call = lambda: merge(acc, partial_attention(q, kv[0], kv[1], scale))  # noqa: E731
    call()
    times = []
    for _ in range(reps):
        t0 = time.thread_time()
        call()
        times.append(time.thread_time() - t0)
    return tokens, statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp64")
    ap.add_argument("--kv-mib", type=positive, default=64.0, help="K and V bytes of one call, MiB")
    ap.add_argument("--head-dim", type=counts, default="96", help="comma-separated, ranges allowed (e.g. 96,128)")
    ap.add_argument("--groups", type=counts, default="1-8,16,32", help="query heads per KV head (e.g. 1-8,16,32)")
    ap.add_argument("--rows", type=counts, default="4", help="(batch x KV head) problems (the profile's: 4)")
    ap.add_argument("--reps", type=count, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"attend {args.dtype}, {args.kv_mib:g} MiB of KV, one thread, median of {args.reps} (ms)")
    print(f"{'rows':>5} {'head_dim':>8} {'tokens':>8} {'group':>5} {'ms':>9}")
    for rows in args.rows:
        for head_dim in args.head_dim:
            for group in args.groups:
                tokens, sec = time_attend(rows, group, head_dim, args.kv_mib * 2**20, args.dtype, args.reps)
                print(f"{rows:5d} {head_dim:8d} {tokens:8d} {group:5d} {sec * 1e3:9.2f}", flush=True)


if __name__ == "__main__":
    main()
