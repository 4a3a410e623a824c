"""SwiGLU: y = silu(a) * b, the gated FFN activation of Llama/Mistral (a = gate projection, b = up projection)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

M = 16384   # tokens (batch x sequence)
N = 14336   # FFN width (Llama-3 8B)

CRUCIBLE_BYTES = "lambda c: 2 * 3 * c['M'] * c['N']"  # bf16: read a, b; write y


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.silu(a) * b


def get_inputs():
    return [torch.randn(M, N, dtype=torch.bfloat16), torch.randn(M, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []


def crucible_liger(model):
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return lambda a, b: LigerSiLUMulFunction.apply(a, b)
