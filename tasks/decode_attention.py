"""Decode attention: one new query token per sequence against a long contiguous KV cache, GQA, bf16.

q [B, HKV*GROUP, 1, D]; k, v [B, HKV, S, D]; o = SDPA(q, k, v, enable_gqa=True). The ANCHORS row: batch 64, 8k-token
cache, 32 query / 8 kv heads, D128: SDPA enable_gqa 0.49 ms = 4,353 GB/s on the KV bytes (H200). Memory-bound: the
bytes are the cache read once (2 B HKV S D) plus q and o. GROUP is a constant (never rescaled, < 16) so that the
query heads stay a multiple of the kv heads at every CPU shape; D is fixed (a power of two).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

B = 64
HKV = 8
GROUP = 4
S = 8192
D = 128

CRUCIBLE_FIXED = ["D"]
CRUCIBLE_BYTES = "lambda c: 2 * (2 * c['B'] * c['HKV'] * c['S'] * c['D'] + 2 * c['B'] * c['HKV'] * c['GROUP'] * c['D'])"
CRUCIBLE_FLOPS = "lambda c: 4 * c['B'] * c['HKV'] * c['GROUP'] * c['S'] * c['D']"


class Model(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def get_inputs():
    return [torch.randn(B, HKV * GROUP, 1, D, dtype=torch.bfloat16),
            torch.randn(B, HKV, S, D, dtype=torch.bfloat16),
            torch.randn(B, HKV, S, D, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
