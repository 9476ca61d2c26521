"""Process-group set-up shared by the real runs: backend, device, timeout, the layout of ranks on hosts."""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from simulator.algorithms import Layout

__all__ = ["device_for", "init_group", "rank_layout", "timed_iterations"]


def init_group(backend: str, timeout_s: float) -> None:
    """Join the process group described by the torchrun-style environment (RANK, WORLD_SIZE, MASTER_*)."""
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("backend nccl needs CUDA devices; use --backend gloo on CPU")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))


def device_for(backend: str) -> torch.device:
    """The torch device of this rank: its CUDA device with NCCL, the CPU with gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def rank_layout() -> Layout:
    """Ranks grouped on hosts as torchrun places them: LOCAL_WORLD_SIZE consecutive ranks per host."""
    world = dist.get_world_size()
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return Layout(tuple(r // per_host for r in range(world)))


def timed_iterations(args: Any, make_runner: Callable[[dict[Any, torch.Tensor]], Any], device: torch.device
                     ) -> tuple[list[float], dict[str, Any]]:
    """``--warmup`` untimed then ``--iters`` timed runs of a fresh runner (``make_runner(pool)``; the pool keeps
    allocations across iterations): an iteration's time is the slowest rank's, from a barrier. Returns the times and
    the last iteration's buffers."""
    rank = dist.get_rank()
    times: list[float] = []
    bufs: dict[str, Any] = {}
    pool: dict[Any, torch.Tensor] = {}
    for it in range(args.warmup + args.iters):
        bufs = {}  # free the previous iteration's buffers before the clock starts
        if args.inject_fault == rank:
            raise RuntimeError(f"injected fault on rank {rank} (--inject-fault)")
        runner = make_runner(pool)
        dist.barrier()
        t0 = time.perf_counter()
        bufs = runner.run_rank()
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if it >= args.warmup:
            times.append(float(elapsed.item()))
    return times, bufs
