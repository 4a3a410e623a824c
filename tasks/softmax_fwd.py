"""Softmax over the last dimension (attention scores, router logits), bf16 in and out, fp32 inside."""
import torch
import torch.nn as nn

M = 16384   # rows
N = 8192    # softmax width

CRUCIBLE_BYTES = "lambda c: 2 * (2 * c['M'] * c['N'])"  # bf16: read x; write y


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(M, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []


def crucible_liger(model):
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    def run(x):
        return LigerSoftmaxFunction.apply(x)
    return run
