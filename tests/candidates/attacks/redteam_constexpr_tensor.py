"""Attack: a torch tensor passed for a tl.constexpr parameter stays a torch tensor in the interpreter's kernel body;
operators and torch methods named like Triton's (sum, rsqrt, to) compute the whole RMSNorm in torch while the
trace stands aside for the launch."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(X: tl.constexpr, W: tl.constexpr, Y: tl.constexpr, N: tl.constexpr, EPS: tl.constexpr):
    r = ((X * X).sum(1, keepdim=True) / N + EPS).rsqrt()
    Y += X * r * W


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        wf = self.weight.float()
        yf = torch.zeros_like(xf)
        _rmsnorm_kernel[(1,)](xf, wf, yf, x.shape[1], self.eps)
        return yf.to(x.dtype)
