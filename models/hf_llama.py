"""Hugging Face's LlamaForCausalLM built from a config, with random weights (nothing downloaded): a model file for
`crucible model` (docs/model.md). Needs `transformers` (`pip install 'kernel-crucible[hf]'`).

The training loss is the one a user of transformers computes, `LlamaForCausalLM(input_ids=ids, labels=ids).loss`
(transformers shifts the labels itself: the last position of each row is ignored), wrapped so that
`model(ids, labels)` returns it. Attention runs through SDPA (attn_implementation="sdpa").

Presets: models/llama.py's, "tiny" (hidden 64, 2 layers, 4 query and 2 key/value heads: the CPU test through Triton's
interpreter) and "1b" (Llama 3.2 1B's sizes: hidden 2048, 16 layers, 32/8 heads of 64, FFN 8192, vocabulary 128256,
the head untied: 1.50B parameters, batch 4 x 2048).
"""
from __future__ import annotations

import importlib.util

import torch
import torch.nn as nn

from models.layers import init_weights
from models.llama import PRESETS as LLAMA_PRESETS
from models.llama import LlamaConfig
from patching.modelfile import ModelFileError


# Llama's sizes, as models/llama.py's presets, so that the two model files compare
PRESETS = {"tiny": LLAMA_PRESETS["tiny"], "1b": LLAMA_PRESETS["1b"]}


# no "[hf]" extra named here: the CLI prints through rich, which reads brackets as markup
NEEDS_TRANSFORMERS = "this model file needs Hugging Face's transformers: pip install transformers"
if importlib.util.find_spec("transformers") is None:  # checked without importing it (seconds): at load time
    raise ModelFileError(NEEDS_TRANSFORMERS)


def transformers_module():
    """transformers, imported on first use; ModelFileError (one sentence) where it is not installed."""
    try:
        import transformers
    except ImportError:
        raise ModelFileError(NEEDS_TRANSFORMERS) from None
    return transformers


class HFCausalLMLoss(nn.Module):
    """A transformers causal LM behind the model-file conventions: forward(ids, labels) is its training loss
    (`lm(input_ids=ids, labels=labels).loss`); forward(ids, cache=...) the last position's logits, the cache from
    new_cache (transformers' DynamicCache, which grows as it goes: max_len is not needed)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None, cache=None):
        if labels is not None:
            return self.lm(input_ids=ids, labels=labels).loss
        out = self.lm(input_ids=ids, use_cache=cache is not None, **({_cache_kwarg(): cache} if cache else {}))
        return out.logits[:, -1]

    def new_cache(self, batch: int, max_len: int):
        return transformers_module().DynamicCache(config=self.lm.config)


def _cache_kwarg() -> str:
    """transformers 5 renamed `past_key_values` to `cache`."""
    return "cache" if int(transformers_module().__version__.split(".")[0]) >= 5 else "past_key_values"


def build(cfg: LlamaConfig, device="cpu", dtype=torch.bfloat16, seed: int = 0) -> HFCausalLMLoss:
    return build_hf("LlamaConfig", cfg, device, dtype, seed)


def build_hf(config_class: str, cfg, device="cpu", dtype=torch.bfloat16, seed: int = 0, **extra) -> HFCausalLMLoss:
    """transformers' causal LM of `config_class` at cfg's Llama-layout sizes (plus `extra` config fields), with
    SDPA attention, an untied head and random weights from `seed`, in training mode."""
    tf = transformers_module()
    config = getattr(tf, config_class)(
        vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.ffn, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim,
        rms_norm_eps=cfg.eps, rope_theta=cfg.rope_theta, max_position_embeddings=max(cfg.seq * 2, 128),
        tie_word_embeddings=False, hidden_act="silu", **extra)
    dtype_kw = "dtype" if int(tf.__version__.split(".")[0]) >= 5 else "torch_dtype"
    with torch.device(device):
        lm = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", **{dtype_kw: dtype})
    init_weights(lm, 0.02, seed)  # one seed, the same model each time, as the shipped model files
    return HFCausalLMLoss(lm).train()


def get_model(preset: str = "tiny", device="cpu", dtype=torch.bfloat16) -> HFCausalLMLoss:
    return build(PRESETS[preset], device, dtype)


def get_inputs(preset: str = "tiny", device="cpu", seed: int = 0) -> list[torch.Tensor]:
    return token_inputs(PRESETS[preset], device, seed)


def token_inputs(cfg, device="cpu", seed: int = 0) -> list[torch.Tensor]:
    """Random token ids [batch, seq] and their labels: the ids themselves, as transformers shifts them."""
    ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=torch.Generator().manual_seed(seed))
    return [ids.to(device), ids.clone().to(device)]
