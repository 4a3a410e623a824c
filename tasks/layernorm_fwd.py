"""LayerNorm forward over the hidden dimension, bf16 in and out, fp32 statistics (PyTorch's `F.layer_norm`).

Weight and bias start away from 1 and 0 so that a kernel that drops either one fails the check.
"""
import torch
import torch.nn as nn

M = 16384   # tokens (batch x sequence)
N = 4096    # hidden size
EPS = 1e-5

CRUCIBLE_BYTES = "lambda c: 2 * (2 * c['M'] * c['N'] + 2 * c['N'])"  # bf16: read x, w, b; write y


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden, dtype=torch.bfloat16))
        self.bias = nn.Parameter(0.1 * torch.randn(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def get_inputs():
    return [torch.randn(M, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return [N, EPS]


def crucible_liger(model):
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    def run(x):
        return LigerLayerNormFunction.apply(x, model.weight, model.bias, model.eps)
    return run
