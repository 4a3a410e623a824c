"""Paged decode attention task seed: one query token per sequence against a paged KV cache, through the split-K
kernels of seeds/decode.py (PAGED: each key row is found through the block table; keys past seq_lens[b] are never
read). Bytes: the keys each sequence holds, 2 x sum_b seq_lens[b] x Hkv x D elements, plus q and o.
Measured on the H200: not measured yet.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from seeds.decode import paged_decode_attention

CRUCIBLE_SEED = {
    "name": "decode_attention_paged",
    "tasks": ["decode_attention_paged.py"],
    "ops": ["paged decode attention (block table, split-K, GQA)"],
}


class ModelNew(nn.Module):
    """tasks/decode_attention_paged.py: (q, k_cache, v_cache, block_table, seq_lens) -> o [B, Hq, 1, D]."""

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                seq_lens: torch.Tensor) -> torch.Tensor:
        return paged_decode_attention(q, k_cache, v_cache, block_table.to(torch.int32), seq_lens.to(torch.int32))
