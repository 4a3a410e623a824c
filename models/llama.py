"""A Llama-style decoder (Llama 3's layout: RMSNorm, GQA attention with rotary positions, SwiGLU MLP, an untied LM
head) with random weights: a model file for `crucible model` (docs/model.md).

Presets: "tiny" (hidden 64, 2 layers: the CPU test through Triton's interpreter) and "1b" (Llama 3.2 1B's sizes:
hidden 2048, 16 layers, 32 query and 8 key/value heads of 64, FFN 8192, vocabulary 128256, the head
untied: 1.50B parameters).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from models.layers import Attention, GatedMLP, KVCache, LMLoss, RMSNorm, init_weights, rope_tables


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float = 500000.0
    eps: float = 1e-6
    batch: int = 2       # the training batch get_inputs draws
    seq: int = 16        # and its sequence length


PRESETS = {
    "tiny": LlamaConfig(vocab=256, hidden=64, ffn=128, layers=2, heads=4, kv_heads=2, head_dim=16, batch=2, seq=16),
    "1b": LlamaConfig(vocab=128256, hidden=2048, ffn=8192, layers=16, heads=32, kv_heads=8, head_dim=64,
                      batch=4, seq=2048),
}


class DecoderLayer(nn.Module):
    def __init__(self, cfg, mlp: nn.Module, dtype, device=None):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden, cfg.eps, dtype, device)
        self.attn = Attention(cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, dtype, device)
        self.post_norm = RMSNorm(cfg.hidden, cfg.eps, dtype, device)
        self.mlp = mlp

    def forward(self, x, cos, sin, cache=None, layer=0):
        x = x + self.attn(self.input_norm(x), cos, sin, cache, layer)
        return x + self.mlp(self.post_norm(x))


class CausalLM(nn.Module):
    """Embedding, decoder layers, final norm, LM head. forward(ids, labels) is the training loss (labels are the
    ids shifted by one, -100 where none); forward(ids, cache=...) the logits of the last position (prefill, decode)."""

    def __init__(self, cfg, layers: list[nn.Module], dtype, device=None):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden, dtype=dtype, device=device)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden, cfg.eps, dtype, device)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False, dtype=dtype, device=device)
        self.loss = LMLoss()

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None, cache: KVCache | None = None):
        past = cache.length if cache is not None else 0
        positions = torch.arange(past, past + ids.shape[1], device=ids.device)
        cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta, self.embed.weight.dtype)
        x = self.embed(ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i)
        x = self.norm(x)
        if cache is not None:
            cache.length += ids.shape[1]
        if labels is None:
            return self.lm_head(x[:, -1])
        return self.loss(x.reshape(-1, x.shape[-1]), self.lm_head.weight, labels.reshape(-1))

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        c, w = self.config, self.embed.weight
        return KVCache(c.layers, batch, c.kv_heads, max_len, c.head_dim, w.dtype, w.device)


def build(cfg: LlamaConfig, device="cpu", dtype=torch.bfloat16, seed: int = 0) -> CausalLM:
    layers = [DecoderLayer(cfg, GatedMLP(cfg.hidden, cfg.ffn, dtype, device), dtype, device) for _ in range(cfg.layers)]
    model = CausalLM(cfg, layers, dtype, device)
    init_weights(model, 0.02, seed)
    return model


def training_inputs(cfg, device="cpu", seed: int = 0) -> list[torch.Tensor]:
    """Random token ids [batch, seq] and their next-token labels (the last position ignored)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=gen)
    labels = ids[:, 1:].clone()
    return [ids[:, :-1].contiguous().to(device), labels.to(device)]


def get_model(preset: str = "tiny", device="cpu", dtype=torch.bfloat16) -> CausalLM:
    return build(PRESETS[preset], device, dtype)


def get_inputs(preset: str = "tiny", device="cpu", seed: int = 0) -> list[torch.Tensor]:
    return training_inputs(PRESETS[preset], device, seed)
