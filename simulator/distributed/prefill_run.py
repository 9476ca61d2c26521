"""Real runs of prefill and training schedules: one rank's run, and the check of every rank's outputs and
gradients (dQ, dK, dV) against single-device torch autograd of dense attention on the same inputs.

Used by ``treering validate`` (:mod:`.prefill_validate`) and by the tests, which run many cases per process group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from simulator.distributed.runner import PrefillRankRunner
from simulator.kernels.payload import transfer_layouts
from simulator.kernels.prefill import Rows
from simulator.numeric.prefill import PrefillInputs, block_error, check_cover
from simulator.schedule.core import Schedule

__all__ = ["PrefillCheck", "check_outputs", "gather_results", "run_prefill_rank", "to_torch", "torch_reference"]


def to_torch(inp: PrefillInputs, device: torch.device) -> PrefillInputs:
    """The same inputs as torch tensors on ``device``."""
    def conv(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)
    return PrefillInputs(conv(inp.q), conv(inp.k), conv(inp.v), conv(inp.dout), inp.scale, inp.causal)


def run_prefill_rank(sched: Schedule, inp: PrefillInputs, device: torch.device,
                     layouts: dict[int, list[Any]] | None = None, pool: dict[Any, torch.Tensor] | None = None
                     ) -> dict[str, Any]:
    """Run this rank's ops of ``sched`` (``inp``: torch tensors of the whole sequence); returns its buffers."""
    if layouts is None:
        layouts = transfer_layouts(sched, sched.meta["shape"])
    return PrefillRankRunner(sched, inp, dist.get_rank(), layouts, device, pool).run_rank()


def gather_results(sched: Schedule, bufs: Mapping[str, Any]) -> dict[int, dict[str, Rows]] | None:
    """Every rank's output and gradient blocks (on the CPU), on rank 0 (None elsewhere)."""
    rank = dist.get_rank()
    names = {n for r, n in sched.meta["outputs"] if r == rank}
    names |= {n for r, dq, dkv in sched.meta.get("grads", []) if r == rank for n in (dq, dkv)}
    mine = {n: Rows(tuple(a.cpu() for a in bufs[n].arrays), bufs[n].pos, bufs[n].h0) for n in names}
    gathered: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    return None if gathered is None else dict(enumerate(gathered))


def torch_reference(inp: PrefillInputs) -> tuple[np.ndarray, ...]:
    """(out, dq, dk, dv) of dense attention by torch autograd, in float64 on the CPU: softmax(scale q k^T, masked
    by global position when causal) v, differentiated against ``inp.dout``; GQA by repeating the KV heads."""
    q, k, v = (torch.tensor(np.asarray(x), dtype=torch.float64, requires_grad=True) for x in (inp.q, inp.k, inp.v))
    group = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(group, dim=1).transpose(-1, -2) * inp.scale
    if inp.causal:
        n = q.shape[2]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -float("inf"))
    out = torch.softmax(s, dim=-1) @ v.repeat_interleave(group, dim=1)
    out.backward(torch.tensor(np.asarray(inp.dout), dtype=torch.float64))
    assert q.grad is not None and k.grad is not None and v.grad is not None
    return tuple(t.detach().numpy() for t in (out, q.grad, k.grad, v.grad))


@dataclass(frozen=True)
class PrefillCheck:
    max_abs_err: float  # output
    grad_max_abs_err: float  # dQ, dK, dV; NaN without a backward


def check_outputs(sched: Schedule, results: Mapping[int, Mapping[str, Rows]], ref: tuple[np.ndarray, ...]
                  ) -> PrefillCheck:
    """Largest errors of the gathered blocks against the reference; every position and head must be covered."""
    out_ref, dq_ref, dk_ref, dv_ref = ref
    _, heads, n, _ = out_ref.shape
    outs = [results[r][name] for r, name in sched.meta["outputs"]]
    check_cover(outs, n, heads, start=int(getattr(sched.meta.get("shape"), "cached", 0) or 0))  # new rows only
    err = max(block_error(b, out_ref) for b in outs)
    grads = sched.meta.get("grads", [])
    if not grads:
        return PrefillCheck(err, float("nan"))
    dqs = [results[r][dq] for r, dq, _ in grads]
    dkvs = [results[r][dkv] for r, _, dkv in grads]
    check_cover(dqs, n, heads)
    check_cover(dkvs, n, dk_ref.shape[1])
    grad = max([block_error(b, dq_ref) for b in dqs] + [block_error(b, dk_ref, 0) for b in dkvs]
               + [block_error(b, dv_ref, 1) for b in dkvs])
    return PrefillCheck(err, grad)
