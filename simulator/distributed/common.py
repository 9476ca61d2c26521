"""Process-group set-up shared by the real runs: backend, device, timeout, the layout of ranks on hosts."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from simulator.algorithms import Layout

__all__ = ["device_for", "init_group", "rank_layout"]


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
