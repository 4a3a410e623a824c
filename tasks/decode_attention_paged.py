"""Paged decode attention: one query token per sequence against a paged KV cache (vLLM / FlashAttention layout), GQA,
bf16.

q [B, HKV*GROUP, 1, D]; k_cache, v_cache [B * pages, PAGE, HKV, D] with pages = ceil(S / PAGE); block_table
[B, pages] int32 (a random permutation of the pages: sequences' pages are scattered through the cache);
seq_lens [B] int32, between 3/4 S and S (varied, deterministic). The reference gathers each sequence's pages and
runs SDPA with a key mask. The ANCHORS decode shape: batch 64, up to 8k tokens, 32/8 heads, D128, 16-token pages.
PAGE and D are fixed (powers of two); the integer inputs are never redrawn (only drawn under each check's seed).
Bytes: the keys and values each sequence holds (sum of seq_lens x HKV x D, twice), q, o and the block table.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

B = 64
HKV = 8
GROUP = 4
S = 8192
D = 128
PAGE = 16

CRUCIBLE_FIXED = ["D", "PAGE"]
CRUCIBLE_BYTES = ("lambda c: 2 * 2 * c['HKV'] * c['D'] * sum(c['S'] - (b * 37) % (c['S'] // 4 + 1) for b in "
                  "range(c['B'])) + 2 * 2 * c['B'] * c['HKV'] * c['GROUP'] * c['D'] "
                  "+ 4 * c['B'] * (-(-c['S'] // c['PAGE']) + 1)")
CRUCIBLE_FLOPS = ("lambda c: 4 * c['HKV'] * c['GROUP'] * c['D'] * sum(c['S'] - (b * 37) % (c['S'] // 4 + 1) for b "
                  "in range(c['B']))")


class Model(nn.Module):
    def forward(self, q, k_cache, v_cache, block_table, seq_lens):
        b, _, _, d = q.shape
        page, hkv = k_cache.shape[1], k_cache.shape[2]
        pages = block_table.shape[1]
        k = k_cache[block_table.long()].reshape(b, pages * page, hkv, d).transpose(1, 2)
        v = v_cache[block_table.long()].reshape(b, pages * page, hkv, d).transpose(1, 2)
        pos = torch.arange(pages * page, device=q.device)
        mask = (pos[None, :] < seq_lens[:, None].long())[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def get_inputs():
    pages = -(-S // PAGE)
    seq_lens = torch.tensor([S - (b * 37) % (S // 4 + 1) for b in range(B)], dtype=torch.int32)
    block_table = torch.randperm(B * pages).view(B, pages).to(torch.int32)
    return [torch.randn(B, HKV * GROUP, 1, D, dtype=torch.bfloat16),
            torch.randn(B * pages, PAGE, HKV, D, dtype=torch.bfloat16),
            torch.randn(B * pages, PAGE, HKV, D, dtype=torch.bfloat16),
            block_table, seq_lens]


def get_init_inputs():
    return []
