"""A Mixtral-style decoder: the Llama layout with each MLP a sparse mixture of SwiGLU experts (a softmax router,
top-2 of 8, the chosen weights renormalised), with random weights: a model file for `crucible model` (docs/model.md).

Presets: "tiny" (hidden 64, 2 layers, 4 experts: the CPU test) and "small" (hidden 1024, 8 layers, 8 experts of FFN
3584, 16/8 heads of 64, vocabulary 32000: 0.80B parameters).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from models.layers import GatedMLP, init_weights
from models.llama import CausalLM, DecoderLayer, training_inputs


@dataclass(frozen=True)
class MixtralConfig:
    vocab: int
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    top_k: int = 2
    rope_theta: float = 1000000.0
    eps: float = 1e-6
    batch: int = 2
    seq: int = 16


PRESETS = {
    "tiny": MixtralConfig(vocab=256, hidden=64, ffn=96, layers=2, heads=4, kv_heads=2, head_dim=16, experts=4,
                          batch=2, seq=16),
    "small": MixtralConfig(vocab=32000, hidden=1024, ffn=3584, layers=8, heads=16, kv_heads=8, head_dim=64,
                           experts=8, batch=8, seq=1024),
}


class SparseMoE(nn.Module):
    """Mixtral's block: softmax over the router's logits, the top-k experts per token, their weights renormalised;
    each expert runs on the tokens routed to it and its output is added back, weighted."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int, dtype, device=None):
        super().__init__()
        self.gate = nn.Linear(hidden, experts, bias=False, dtype=dtype, device=device)
        self.experts = nn.ModuleList(GatedMLP(hidden, ffn, dtype, device) for _ in range(experts))
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            if tok.numel():
                out.index_add_(0, tok, expert(x[tok]) * weights[tok, slot, None])
        return out.view(shape)


def build(cfg: MixtralConfig, device="cpu", dtype=torch.bfloat16, seed: int = 0) -> CausalLM:
    layers = [DecoderLayer(cfg, SparseMoE(cfg.hidden, cfg.ffn, cfg.experts, cfg.top_k, dtype, device), dtype, device)
              for _ in range(cfg.layers)]
    model = CausalLM(cfg, layers, dtype, device)
    init_weights(model, 0.02, seed)
    return model


def get_model(preset: str = "tiny", device="cpu", dtype=torch.bfloat16) -> CausalLM:
    return build(PRESETS[preset], device, dtype)


def get_inputs(preset: str = "tiny", device="cpu", seed: int = 0) -> list[torch.Tensor]:
    return training_inputs(PRESETS[preset], device, seed)
