"""SwiGLU backward: the gradients (da, db) of y = silu(a) * b for an upstream gradient dy."""
import torch
import torch.nn as nn
import torch.nn.functional as F

M = 16384   # tokens (batch x sequence)
N = 14336   # FFN width (Llama-3 8B)

CRUCIBLE_BYTES = "lambda c: 2 * 5 * c['M'] * c['N']"  # bf16: read a, b, dy; write da, db


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor, dy: torch.Tensor):
        a = a.detach().requires_grad_()
        b = b.detach().requires_grad_()
        y = F.silu(a) * b
        return torch.autograd.grad(y, (a, b), dy)


def get_inputs():
    return [torch.randn(M, N, dtype=torch.bfloat16) for _ in range(3)]


def get_init_inputs():
    return []


def crucible_liger(model):
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    # Liger's backward writes da, db over its saved a and b (what it does in training too).
    def run(a, b, dy):
        a = a.detach().requires_grad_()
        b = b.detach().requires_grad_()
        return torch.autograd.grad(LigerSiLUMulFunction.apply(a, b), (a, b), dy)

    return run
