"""Softmax backward over the last dimension: dx of y = softmax(x, -1) for an upstream gradient dy, bf16.

The reference runs `torch.softmax` and autograd's backward. A candidate gets (x, dy) and may recompute y in
registers: the minimum traffic is read x, dy and write dx, the same bytes as a backward that reads the saved y.
"""
import torch
import torch.nn as nn

M = 16384   # rows
N = 8192    # softmax width

CRUCIBLE_BYTES = "lambda c: 2 * (3 * c['M'] * c['N'])"  # bf16: read x (or y), dy; write dx


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            y = torch.softmax(x, dim=-1)
            return torch.autograd.grad(y, x, dy)[0]


def get_inputs():
    return [torch.randn(M, N, dtype=torch.bfloat16), torch.randn(M, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []


def crucible_liger(model):
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    def run(x, dy):
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            return torch.autograd.grad(LigerSoftmaxFunction.apply(x), x, dy)[0]
    return run
