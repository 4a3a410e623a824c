"""RoPE forward, Llama layout (Hugging Face's apply_rotary_pos_emb): q [B, T, Hq, D] and k [B, T, Hk, D] with
grouped-query attention (Hk < Hq), cos/sin [T, D] built from Llama-3's frequencies (theta 500000)."""
import torch
import torch.nn as nn

B = 4
T = 4096
HQ = 32     # query heads
HK = 8      # key/value heads
D = 128     # head dimension
THETA = 500000

CRUCIBLE_FIXED = ["D", "THETA"]
CRUCIBLE_FIXED_INPUTS = [2, 3]  # cos and sin are tables, never redrawn
CRUCIBLE_BYTES = "lambda c: 2 * (2 * c['B'] * c['T'] * (c['HQ'] + c['HK']) * c['D'] + 2 * c['T'] * c['D'])"


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Model(nn.Module):
    def forward(self, q, k, cos, sin):
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rope_tables(t: int, d: int, dtype=torch.bfloat16):
    inv_freq = 1.0 / (THETA ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def get_inputs():
    cos, sin = rope_tables(T, D)
    return [torch.randn(B, T, HQ, D, dtype=torch.bfloat16), torch.randn(B, T, HK, D, dtype=torch.bfloat16), cos, sin]


def get_init_inputs():
    return []


def crucible_liger(model):
    from liger_kernel.ops.rope import LigerRopeFunction

    # Liger takes q, k as [B, H, T, D] views of the [B, T, H, D] storage and rotates them in place.
    def run(q, k, cos, sin):
        qo, ko = LigerRopeFunction.apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return qo.transpose(1, 2), ko.transpose(1, 2)

    return run
