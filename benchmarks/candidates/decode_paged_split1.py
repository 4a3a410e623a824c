"""The paged decode seed with one split per (sequence, kv head) (seeds/decode.py, num_splits=1: the measured best at
batch 64) as a candidate file for `crucible bench`."""
import torch
import torch.nn as nn

from seeds.decode import paged_decode_attention


class ModelNew(nn.Module):
    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                seq_lens: torch.Tensor) -> torch.Tensor:
        return paged_decode_attention(q, k_cache, v_cache, block_table.to(torch.int32), seq_lens.to(torch.int32),
                                      num_splits=1)
