"""How much faster a kernel runs alone than with the other ranks running theirs: two gloo ranks on this host.

    python benchmarks/kernel_alone.py BATCH,HEADS,KV_HEADS,HEAD_DIM,TOKENS,DTYPE [...] [--iters 23]

Per shape, two processes (one thread each, a gloo process group, as ``treering validate`` runs them) each build the
decode ``attend`` call of the merge core (one query against their KV shard of TOKENS tokens, merged into a running
state) and time it, ``--iters`` times (the first 3 dropped): both ranks at once (after a barrier: a lockstep
schedule, what ``calibrate``'s profiles time with ``loaded: 2``), then one at a time, the other blocked in a receive
(ring-q's hops). Prints each rank's medians, wall and thread CPU time, and the ratio alone / at once: what
``calibrate``'s ``alone`` ratios stand for (:mod:`simulator.kernels.profiles`).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from simulator.distributed.profile_kernels import TORCH_DTYPES
from simulator.merge import merge, partial_attention


def _rank(rank: int, port: int, shapes: list[tuple[int, int, int, int, int, str]], iters: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for shape in shapes:
        ms = _measure(rank, shape, iters)
        print(f"{','.join(map(str, shape))} rank {rank}: at once {ms['at once']:.2f} ms ({ms['at once cpu']:.2f} "
              f"CPU), alone {ms['alone']:.2f} ms ({ms['alone cpu']:.2f} CPU): alone / at once "
              f"{ms['alone'] / ms['at once']:.2f}", flush=True)
        dist.barrier()
    dist.destroy_process_group()


def _measure(rank: int, shape: tuple[int, int, int, int, int, str], iters: int) -> dict[str, float]:
    """Median milliseconds of one shape's attend call: at once, alone; wall and thread CPU time."""
    b, h, kvh, d, t, dtype = shape
    tdt = TORCH_DTYPES[dtype]
    q = torch.randn(b, h, 1, d).to(tdt)
    k, v = torch.randn(b, kvh, t, d).to(tdt), torch.randn(b, kvh, t, d).to(tdt)
    acc = partial_attention(q, k[:, :, :1], v[:, :, :1], d ** -0.5)
    runs: dict[str, list[float]] = {"at once": [], "at once cpu": [], "alone": [], "alone cpu": []}
    token = torch.zeros(16)

    def timed(kind: str) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        merge(acc, partial_attention(q, k, v, d ** -0.5))
        runs[kind].append(time.perf_counter() - t0)
        runs[kind + " cpu"].append(time.thread_time() - c0)

    for _ in range(iters):
        dist.barrier()
        timed("at once")
        dist.barrier()
        for turn in (0, 1):
            if rank == turn:
                timed("alone")
                dist.send(token, 1 - rank)
            else:
                dist.recv(token, 1 - rank)
        dist.barrier()
    return {kind: statistics.median(xs[3:]) * 1e3 for kind, xs in runs.items()}


def _shape(text: str) -> tuple[int, int, int, int, int, str]:
    parts = text.split(",")
    if len(parts) != 6 or parts[5] not in TORCH_DTYPES or not all(p.isdigit() and int(p) > 0 for p in parts[:5]):
        raise argparse.ArgumentTypeError(f"expected BATCH,HEADS,KV_HEADS,HEAD_DIM,TOKENS,DTYPE (positive integers, "
                                         f"a dtype of {', '.join(TORCH_DTYPES)}), got {text!r}")
    b, h, kvh, d, t = map(int, parts[:5])
    if h % kvh:
        raise argparse.ArgumentTypeError(f"{text!r}: KV_HEADS must divide HEADS")
    return b, h, kvh, d, t, parts[5]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", type=_shape, nargs="+")
    ap.add_argument("--iters", type=int, default=23)
    args = ap.parse_args()
    if args.iters < 4:
        ap.error(f"argument --iters: at least 4 (the first 3 are dropped), got {args.iters}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, args.shapes, args.iters), nprocs=2)


if __name__ == "__main__":
    main()
