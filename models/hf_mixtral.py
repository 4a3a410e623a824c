"""Hugging Face's MixtralForCausalLM built from a config, with random weights (nothing downloaded): a model file for
`crucible model` (docs/model.md). Needs `transformers` (`pip install 'kernel-crucible[hf]'`).

The training loss is the one a user of transformers computes, `MixtralForCausalLM(input_ids=ids, labels=ids).loss`
(transformers shifts the labels itself), wrapped so that `model(ids, labels)` returns it. The config's
`output_router_logits` is False, transformers' default, so the loss adds no router auxiliary loss. Attention runs
through SDPA (attn_implementation="sdpa"); the experts are transformers 5's fused `MixtralExperts`.

Presets: models/mixtral.py's, "tiny" (hidden 64, 2 layers, 4 experts of FFN 96, top-2: the CPU test through
Triton's interpreter) and "small" (hidden 1024, 8 layers, 8 experts of FFN 3584, 16/8 heads of 64, vocabulary
32000, batch 8 x 1024).
"""
from __future__ import annotations

import torch

from models.hf_llama import HFCausalLMLoss, build_hf, token_inputs  # ModelFileError without transformers
from models.mixtral import PRESETS as MIXTRAL_PRESETS
from models.mixtral import MixtralConfig

# Mixtral's sizes, as models/mixtral.py's presets, so that the two model files compare
PRESETS = {"tiny": MIXTRAL_PRESETS["tiny"], "small": MIXTRAL_PRESETS["small"]}


def build(cfg: MixtralConfig, device="cpu", dtype=torch.bfloat16, seed: int = 0) -> HFCausalLMLoss:
    return build_hf("MixtralConfig", cfg, device, dtype, seed, num_local_experts=cfg.experts,
                    num_experts_per_tok=cfg.top_k, sliding_window=None, output_router_logits=False,
                    router_jitter_noise=0.0)


def get_model(preset: str = "tiny", device="cpu", dtype=torch.bfloat16) -> HFCausalLMLoss:
    return build(PRESETS[preset], device, dtype)


def get_inputs(preset: str = "tiny", device="cpu", seed: int = 0) -> list[torch.Tensor]:
    return token_inputs(PRESETS[preset], device, seed)
