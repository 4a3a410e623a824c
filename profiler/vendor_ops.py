"""Vendor-library kernels for the ops crucible's tasks define, as a user would call them without crucible: the
`vendor` baseline (profiler/baselines.py) of a task whose `crucible_vendor(model)` returns one of these bound to
the task's model. Each raises (and the baseline is then reported unavailable, with the reason) where this torch
lacks the op.

- MoE grouped GEMM: torch._grouped_mm (cuBLAS's grouped GEMM on sm_90), forward and backward (dX, dW).
- MoE layer forward: torch._grouped_mm for both projections, with routing, sort, SwiGLU and the weighted combine
  as separate PyTorch ops (what a MoE layer built on the grouped GEMM runs).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def _grouped_mm() -> Callable[..., torch.Tensor]:
    op = getattr(torch, "_grouped_mm", None)
    if op is None:
        raise RuntimeError(f"torch {torch.__version__} has no torch._grouped_mm")
    return op


def expert_offsets(counts: torch.Tensor) -> torch.Tensor:
    """Each expert's end row (int32 cumulative counts), the `offs` torch._grouped_mm takes."""
    return torch.cumsum(counts, 0).to(torch.int32)


def grouped_linear(weight: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """(x, counts) -> y, y rows of expert e = x_e @ weight[e]^T (weight [E, F, H])."""
    mm = _grouped_mm()
    wt = weight.detach().transpose(1, 2)
    return lambda x, counts: mm(x, wt, offs=expert_offsets(counts))


def grouped_linear_backward(weight: torch.Tensor) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """(x, counts, dy) -> (dx, dweight): dx_e = dy_e @ W_e, dW_e = dy_e^T @ x_e (zero for an expert without rows)."""
    mm = _grouped_mm()
    w = weight.detach()

    def backward(x: torch.Tensor, counts: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        offs = expert_offsets(counts)
        return mm(dy, w, offs=offs), mm(dy.t(), x, offs=offs)
    return backward


def moe_layer(model: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """(x, router_logits) -> out for the MoE layer tasks' Model: its route(), w_gate_up [E, 2F, H] and
    w_down [E, H, F]."""
    mm = _grouped_mm()
    w_gate_up, w_down = model.w_gate_up.detach().transpose(1, 2), model.w_down.detach().transpose(1, 2)
    k, experts = model.top_k, model.experts

    def layer(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        weights, ids = model.route(logits)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        offs = expert_offsets(torch.bincount(flat, minlength=experts))
        gate, up = mm(x.index_select(0, order // k), w_gate_up, offs=offs).chunk(2, dim=-1)
        y = mm(F.silu(gate) * up, w_down, offs=offs)
        out = torch.empty_like(y)
        out[order] = y
        return (out.view(-1, k, x.shape[1]).float() * weights[..., None]).sum(1).to(x.dtype)
    return layer
