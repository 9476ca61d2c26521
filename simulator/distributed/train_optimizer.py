"""The optimizer step of a real training step, on this rank's weight shards: Adam (Kingma and Ba, with bias
correction) or SGD with momentum, as the simulator's ``optimizer: adam | sgd`` counts them. Written out rather than
``torch.optim``, whose first use imports torch's compiler stack (seconds per process on a small CPU)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["Optimizer"]


class Optimizer:
    """``adam`` (betas 0.9, 0.999, eps 1e-8) or ``sgd`` (momentum 0.9) at learning rate ``lr``."""

    def __init__(self, name: str, params: Sequence[torch.Tensor], lr: float) -> None:
        if name not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be adam or sgd, got {name!r}")
        self.name, self.params, self.lr, self.steps = name, list(params), lr, 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params] if name == "adam" else []

    @torch.no_grad()
    def step(self) -> None:
        """Update every weight from its ``.grad``."""
        self.steps += 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        for i, p in enumerate(self.params):
            g = p.grad
            assert g is not None
            if self.name == "sgd":
                self.m[i].mul_(0.9).add_(g)
                p.sub_(self.lr * self.m[i])
                continue
            self.m[i].mul_(b1).add_(g, alpha=1 - b1)
            self.v[i].mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (self.v[i] / (1 - b2 ** self.steps)).sqrt_().add_(eps)
            p.addcdiv_(self.m[i], denom, value=-self.lr / (1 - b1 ** self.steps))
