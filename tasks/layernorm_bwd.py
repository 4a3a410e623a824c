"""LayerNorm backward: the gradients (dx, dw, db) of y = layer_norm(x) * w + b for an upstream gradient dy, bf16.

The reference runs PyTorch's `F.layer_norm` forward and autograd's backward. A candidate gets (x, dy) and may
recompute the row statistics (x is read anyway). The minimum traffic is read x, dy, w and write dx, dw, db.
"""
import torch
import torch.nn as nn

M = 16384   # tokens (batch x sequence)
N = 4096    # hidden size
EPS = 1e-5

CRUCIBLE_BYTES = "lambda c: 2 * (3 * c['M'] * c['N'] + 3 * c['N'])"  # bf16: read x, dy, w; write dx, dw, db


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden, dtype=torch.bfloat16))
        self.bias = nn.Parameter(0.1 * torch.randn(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor, dy: torch.Tensor):
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            w = self.weight.detach().requires_grad_()
            b = self.bias.detach().requires_grad_()
            y = torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, self.eps)
            return torch.autograd.grad(y, (x, w, b), dy)


def get_inputs():
    return [torch.randn(M, N, dtype=torch.bfloat16), torch.randn(M, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return [N, EPS]


def crucible_liger(model):
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    def run(x, dy):
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            w = model.weight.detach().requires_grad_()
            b = model.bias.detach().requires_grad_()
            y = LigerLayerNormFunction.apply(x, w, b, model.eps)
            return torch.autograd.grad(y, (x, w, b), dy)
    return run
