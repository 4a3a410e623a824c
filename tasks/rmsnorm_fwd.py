"""RMSNorm forward, Llama-style: y = x / sqrt(mean(x^2) + eps) * w, computed in float32, returned in x's dtype."""
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
        return torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


def get_inputs():
    return [torch.randn(M, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return [N, EPS]
