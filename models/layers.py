"""The building blocks of the shipped decoders, in plain PyTorch.

Each op crucible has a kernel for is its own leaf module (RMSNorm, SiluMul, Rotary, CausalAttention, LMLoss), so a
region is one module call that `patching.find` can name, hook for its shapes and replace. Everything else (the
projections, the residual adds, the embedding) stays PyTorch's.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * w, in fp32 inside, returned in x's dtype (PyTorch's fused rms_norm)."""

    def __init__(self, hidden: int, eps: float, dtype: torch.dtype, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class SiluMul(nn.Module):
    """The gate of a SwiGLU MLP: silu(a) * b."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.silu(a) * b


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """Rotary embedding of q [B, T, Hq, D] and k [B, T, Hk, D] by tables cos, sin [T, D] (Llama's half rotation)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin [T, D] for integer positions, computed in fp32 and rounded once to the model's dtype."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = torch.outer(positions.float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class CausalAttention(nn.Module):
    """softmax(q k^T / sqrt(D), causal) v over q, k, v [B, H, S, D] of one head count (GQA is repeated before)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class KVCache:
    """Preallocated keys and values per layer, [B, Hk, max_len, D], for prefill and decode."""

    def __init__(self, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype, device):
        shape = (batch, kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.length = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + k.shape[2]
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


class Attention(nn.Module):
    """Grouped-query self-attention with rotary positions; a cache turns it into prefill or decode."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, dtype, device=None):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        kw = dict(bias=False, dtype=dtype, device=device)
        self.q_proj = nn.Linear(hidden, heads * head_dim, **kw)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, **kw)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, **kw)
        self.o_proj = nn.Linear(heads * head_dim, hidden, **kw)
        self.rotary = Rotary()
        self.core = CausalAttention()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None = None,
                layer: int = 0) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim)
        q, k = self.rotary(q, k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        past = cache.length if cache is not None else 0
        if cache is not None:
            k, v = cache.update(layer, k, v)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if past == 0:
            o = self.core(q, k, v)
        else:  # decode over the cache: every cached key is visible to the new tokens' queries
            o = F.scaled_dot_product_attention(q, k, v, is_causal=False) if t == 1 else F.scaled_dot_product_attention(
                q, k, v, attn_mask=_suffix_mask(t, k.shape[2], q.device))
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


def _suffix_mask(t: int, total: int, device) -> torch.Tensor:
    rows = torch.arange(total - t, total, device=device)[:, None]
    return torch.arange(total, device=device)[None, :] <= rows


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), Llama's MLP and Mixtral's expert."""

    def __init__(self, hidden: int, ffn: int, dtype, device=None):
        super().__init__()
        kw = dict(bias=False, dtype=dtype, device=device)
        self.gate_proj = nn.Linear(hidden, ffn, **kw)
        self.up_proj = nn.Linear(hidden, ffn, **kw)
        self.down_proj = nn.Linear(ffn, hidden, **kw)
        self.act = SiluMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x), self.up_proj(x)))


class LMLoss(nn.Module):
    """The LM head and its loss: mean cross-entropy of (x @ weight^T) in fp32 against the targets; ignore_index -100."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, weight)
        return F.cross_entropy(logits.float(), target, ignore_index=-100)


def init_weights(model: nn.Module, std: float, seed: int) -> None:
    """Random normal weights (std) for every matrix, ones for the norms, from one seed: the same model each time."""
    gens: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for p in model.parameters():
            if p.is_meta:  # a model built only to count its parameters
                continue
            if p.dim() == 1:
                p.fill_(1.0)
                continue
            gen = gens.setdefault(p.device, torch.Generator(device=p.device).manual_seed(seed))
            p.copy_(torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32).mul_(std))
