"""Training steps for comparing a patched model's loss with the eager model's: the same batches, the same
optimizer update (AdamW: torch's, or crucible's for the patched model), from the same weights."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn


def train_losses(model: nn.Module, batch: Callable[[int], list], steps: int, lr: float = 1e-3,
                 optimizer: Callable[..., torch.optim.Optimizer] | None = None) -> list[float]:
    """The loss of each of `steps` steps (forward, backward, AdamW step) on batch(step). `optimizer(params, lr=...,
    weight_decay=0.0)` builds the optimizer (default torch.optim.AdamW; patching.optimizer.AdamW for crucible's)."""
    opt = (optimizer or torch.optim.AdamW)(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for step in range(steps):
        loss = model(*batch(step))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def loss_gap(a: list[float], b: list[float]) -> float:
    """The largest relative difference between two loss curves, step by step."""
    return max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b, strict=True))
