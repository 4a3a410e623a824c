"""RMSNorm forward, Llama-style: y = x / sqrt(mean(x^2) + eps) * w, computed in float32, returned in x's dtype.

The reference is PyTorch's own fused `F.rms_norm` on the bf16 tensors (fp32 arithmetic inside): the fastest eager
form a user has, so the eager baseline is an honest one.
"""
import torch
import torch.nn as nn

M = 16384   # tokens (batch x sequence)
N = 4096    # hidden size
EPS = 1e-6

CRUCIBLE_BYTES = "lambda c: 2 * (2 * c['M'] * c['N'] + c['N'])"  # bf16: read x, w; write y


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def get_inputs():
    return [torch.randn(M, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return [N, EPS]


def crucible_liger(model):
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    def run(x):
        return LigerRMSNormFunction.apply(x, model.weight, model.eps)
    return run
