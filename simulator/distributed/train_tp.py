"""Megatron-LM's tensor-parallel regions as autograd functions on a TP process group (Shoeybi et al.,
arXiv:1909.08053, section 3): ``copy_in`` (f: identity forward, allreduce of the gradient backward) before a
column-parallel matmul, ``reduce_out`` (g: allreduce forward, identity backward) after a row-parallel one, and
``gather_out`` (all-gather of the last dimension forward, this rank's slice of the gradient backward) of the LM
head's vocabulary-parallel logits, whose loss every TP rank then computes whole. On a group of one they are the
identity."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from simulator.distributed.train_model import Ops

__all__ = ["tp_ops"]


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.rank, ctx.width = rank, x.shape[-1]
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad[..., ctx.rank * ctx.width:(ctx.rank + 1) * ctx.width].contiguous(), None


def tp_ops(group: Any, size: int, base: Ops) -> Ops:
    """``base`` with the TP regions on ``group`` (of ``size`` ranks; the identity when it is 1)."""
    if size == 1:
        return base
    return Ops(copy_in=lambda x: _Copy.apply(x, group), reduce_out=lambda x: _Reduce.apply(x, group),
               gather_out=lambda x: _Gather.apply(x, group), attention=base.attention)
