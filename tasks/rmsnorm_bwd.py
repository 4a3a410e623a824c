"""RMSNorm backward: the gradients (dx, dw) of y = rms_norm(x) * w for an upstream gradient dy, bf16.

The reference runs PyTorch's fused `F.rms_norm` forward and autograd's backward. A candidate gets (x, dy) and may
recompute the row statistics (x is read anyway). The minimum traffic is read x, dy, w and write dx, dw.
"""
import torch
import torch.nn as nn

M = 16384   # tokens (batch x sequence)
N = 4096    # hidden size
EPS = 1e-6

CRUCIBLE_BYTES = "lambda c: 2 * (3 * c['M'] * c['N'] + 2 * c['N'])"  # bf16: read x, dy, w; write dx, dw


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor, dy: torch.Tensor):
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            w = self.weight.detach().requires_grad_()
            y = torch.nn.functional.rms_norm(x, (x.shape[-1],), w, self.eps)
            return torch.autograd.grad(y, (x, w), dy)


def get_inputs():
    return [torch.randn(M, N, dtype=torch.bfloat16), torch.randn(M, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return [N, EPS]


def crucible_liger(model):
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    def run(x, dy):
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            w = model.weight.detach().requires_grad_()
            # in_place=False: Liger's default writes dx over dy, which would change the caller's input.
            y = LigerRMSNormFunction.apply(x, w, model.eps, 0.0, "llama", False)
            return torch.autograd.grad(y, (x, w), dy)
    return run
