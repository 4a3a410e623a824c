"""Grouped GEMM over experts, backward: for y_e = x_e @ W_e^T (rows of x grouped by expert, W [E, F, H]),
    dx_e = dy_e @ W_e         the forward kernel of seeds/moe.py with W's strides swapped (K = F, N = H); the TMA
                              variant reads W viewed [E*F, H] in [BK, BN] boxes (F a multiple of BK)
    dW_e = dy_e^T @ x_e       `_grouped_dw_kernel`: one program per (expert, F-block, H-block) tile, reducing over
                              the expert's rows in a fixed order (deterministic); an expert without rows gets 0.
                              The TMA variant (`_grouped_dw_tma_kernel`) reads each expert's full row steps of dy
                              and x by TMA (the rows are one run), its last partial step by masked pointer loads
(dW_e = X_e^T dY_e for the transposed [E, H, F] layout.) FLOPs 4 R H F for R rows: 3.0 TFLOP at 64 experts x 2048
rows, H 4096, F 1408.

Measured on the H200 (benchmarks/bench_moe.py, do_bench), 64 experts x 2048 rows:
dX 2.521 ms = 600 TFLOP/s through TMA at 128x256x64 (0.97x torch._grouped_mm's 620; warp-specialised 605, the
pointer kernel 482); dW 2.488 ms = 608 TFLOP/s through TMA at 128 x 256 columns (1.01x grouped_mm's 603; the
pointer kernel 283). Not faster than torch._grouped_mm: ties at best, short of the 1.3x a backward seed aims at.
"""
from __future__ import annotations

import torch

from seeds.moe import _check_grouped, align_counts, default_config, grouped_dw, grouped_gemm

CRUCIBLE_SEED = {
    "name": "moe_grouped_gemm_bwd",
    "tasks": ["moe_grouped_gemm_bwd.py"],
    "ops": ["grouped GEMM over experts bwd: dX (grouped GEMM), dW per expert"],
}


def grouped_linear_bwd(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor, dy: torch.Tensor,
                       dx_config=None, dw_config=None, dw_impl: str = "auto",
                       **dx_variant) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dW) of y = x_e @ weight[e]^T per expert for the upstream gradient dy [rows, F]; dx_variant: the dx
    grouped GEMM's impl / warp_specialize / flatten (seeds.moe.grouped_gemm), dw_impl: grouped_dw's impl."""
    _check_grouped(x, weight, counts)
    if dy.shape != (x.shape[0], weight.shape[1]) or dy.dtype != x.dtype:
        raise ValueError(f"grouped linear bwd: expected dy [{x.shape[0]}, {weight.shape[1]}] {x.dtype}, got "
                         f"{tuple(dy.shape)} {dy.dtype}")
    dx_config = dx_config or default_config(x.device)
    layout = align_counts(counts, x.shape[0], dx_config[0])
    x, dy = x.contiguous(), dy.contiguous()
    dx = grouped_gemm(dy, weight, layout, torch.empty_like(x), transpose_b=True, config=dx_config, **dx_variant)
    dw = grouped_dw(dy, x, layout, torch.empty_like(weight), config=dw_config, impl=dw_impl)
    return dx, dw


class ModelNew(torch.nn.Module):
    """tasks/moe_grouped_gemm_bwd.py: (dx, dW) of the grouped expert projection."""

    def __init__(self, experts: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(experts, out_features, in_features, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor, counts: torch.Tensor, dy: torch.Tensor):
        return grouped_linear_bwd(x, self.weight.detach(), counts, dy)
