"""The dense decode seed with the balanced schedule at two programs per SM (seeds/decode.py, balanced=2, 64-token
K/V tiles through TMA, 4 warps, 4 stages) as a candidate file for `crucible bench`."""
import torch
import torch.nn as nn

from seeds.decode import decode_attention


class ModelNew(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return decode_attention(q, k, v, config=(64, 4, 4), balanced=2)
