"""A float32 matmul: computing it at lower precision (bf16/tf32 operands) must fail."""
import torch
import torch.nn as nn

M = 64
N = 64
K = 512


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
