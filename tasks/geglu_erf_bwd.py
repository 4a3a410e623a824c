"""GeGLU (exact erf GELU) backward: the gradients (da, db) of y = gelu(a) * b for an upstream gradient dy."""
import torch
import torch.nn as nn
import torch.nn.functional as F

M = 16384   # tokens (batch x sequence)
N = 14336   # FFN width (Llama-3 8B)

CRUCIBLE_BYTES = "lambda c: 2 * 5 * c['M'] * c['N']"  # bf16: read a, b, dy; write da, db


class Model(nn.Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, a: torch.Tensor, b: torch.Tensor, dy: torch.Tensor):
        a = a.detach().requires_grad_()
        b = b.detach().requires_grad_()
        y = F.gelu(a, approximate=self.approximate) * b
        return torch.autograd.grad(y, (a, b), dy)


def get_inputs():
    return [torch.randn(M, N, dtype=torch.bfloat16) for _ in range(3)]


def get_init_inputs():
    return ["none"]

