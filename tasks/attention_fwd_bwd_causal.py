"""Attention forward + backward, causal: (o, dq, dk, dv) of scaled_dot_product_attention(q, k, v, is_causal=True)
for an upstream gradient do, bf16 [B, H, S, D]; the reference runs SDPA and autograd.

FLOPs: 3.5x the forward's (forward 2 matmuls, backward 5 with the recomputation of P), the convention of ANCHORS.md:
7 * B * H * S^2 * D. The ANCHORS row: B4 H32 S4096 D128 (SDPA flash backend 269 / cuDNN 449 TFLOP/s on the H200).
Bytes: read q, k, v, do; write o, dq, dk, dv.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

B = 4
H = 32
S = 4096
D = 128

CRUCIBLE_FIXED = ["D"]
CRUCIBLE_FLOPS = "lambda c: 7 * c['B'] * c['H'] * c['S'] ** 2 * c['D']"
CRUCIBLE_BYTES = "lambda c: 2 * 8 * c['B'] * c['H'] * c['S'] * c['D']"
# Not "large" (inputs x100): scores of order 1e4 make every softmax row one-hot, where the true dq and dk are exactly
# 0 and SDPA's CPU backward (dS from the row's own P and dP) returns exact zeros, so the elementwise bound there is
# 0. FlashAttention's backward takes delta = rowsum(dO o O) apart from dP and recomputes P from the saved
# log-sum-exp, which leaves fp32 residue of order 1e-2 in dS: every FA-style kernel fails that draw, the
# seed included (measured on the CPU harness), though no training run sees such scores.
# Not "outliers" either (0.1% of the elements at +-50): a query and keys sharing an outlier dimension score ~220, so
# a few keys take the row, and the true dq is ~0 in that dimension only because their dS sum to zero. An FA-style
# kernel rounds dS to bf16 for its dQ product and takes delta from O, and those roundings, times the outlier 50,
# leave errors of a few units there. On the H200 (benchmarks/diag_attention_outliers.py, run P, two draws) the
# harness's bound, set by the reference SDPA picks there (cuDNN), rejected PyTorch's own FlashAttention-2
# backend (2203 and 2233 dq elements outside) and memory-efficient backend (2084, 2121) as well as the seed (865,
# 852); only cuDNN passed.
CRUCIBLE_DISTRIBUTIONS = ["normal", "uniform", "constant_rows"]


class Model(nn.Module):
    def __init__(self, causal: bool = True):
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor):
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        return o.detach(), dq, dk, dv


def get_inputs():
    return [torch.randn(B, H, S, D, dtype=torch.bfloat16) for _ in range(4)]


def get_init_inputs():
    return [True]
