"""One rank's pipeline stage run in 1F1B order over the micro-batches, activations and gradients sent point to
point between stages.

The order is the simulator's own (:func:`simulator.training.pipeline.stage_order`: ``min(pp - s - 1, m)`` forwards,
then one forward and one backward alternately, then the remaining backwards). A forward receives its input from the
previous stage (the first stage embeds its tokens), runs the stage and sends the output to the same (TP, CP) rank of
the next stage; the last stage's output is its loss. A backward receives the output's gradient from the next stage
(the last stage starts from its loss), runs autograd back through the stage and sends the input's gradient to the
previous stage. Sends are posted without blocking and waited for at the end; a receive blocks. Tags are the
micro-batch's, in their own range, per direction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from simulator.training.pipeline import stage_order

__all__ = ["P2P_TAG", "StagePeers", "run_1f1b"]

P2P_TAG = 1 << 24  # above any schedule op id (the attention's tags)


@dataclass(frozen=True)
class StagePeers:
    """This rank's stage, the stages, and its peers' process ranks on the stages before and after (None at the
    ends)."""

    stage: int
    stages: int
    prev: int | None
    next: int | None


def run_1f1b(peers: StagePeers, micro_batches: int, forward: Callable[[int, torch.Tensor | None], torch.Tensor],
             activation: Callable[[], torch.Tensor]) -> list[float]:
    """Run every micro-batch's forward and backward through the stage. ``forward(i, x)``: the stage's output for
    micro-batch ``i`` from its input ``x`` (None on the first stage); ``activation()``: an empty tensor of the
    shape and dtype passed between stages. Returns the losses of the micro-batches (on the last stage; else [])."""
    saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
    sends: list[tuple[dist.Work, torch.Tensor]] = []
    losses: list[float] = []
    for kind, i in stage_order(peers.stage, peers.stages, micro_batches):
        if kind == "F":
            x = None
            if peers.prev is not None:
                x = activation()
                dist.recv(x, src=peers.prev, tag=P2P_TAG + 2 * i)
                x.requires_grad_(True)
            out = forward(i, x)
            if peers.next is not None:
                sent = out.detach().contiguous()
                work = dist.isend(sent, dst=peers.next, tag=P2P_TAG + 2 * i)
                assert work is not None
                sends.append((work, sent))
            else:
                losses.append(float(out.detach().item()))
            saved[i] = (x, out)
        else:
            x, out = saved.pop(i)
            if peers.next is None:
                out.backward()
            else:
                grad = activation()
                dist.recv(grad, src=peers.next, tag=P2P_TAG + 2 * i + 1)
                out.backward(grad)
            if peers.prev is not None:
                assert x is not None and x.grad is not None
                sent = x.grad.contiguous()
                work = dist.isend(sent, dst=peers.prev, tag=P2P_TAG + 2 * i + 1)
                assert work is not None
                sends.append((work, sent))
    for work, _ in sends:
        work.wait()
    return losses
