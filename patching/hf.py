"""Hugging Face transformers' Llama and Mixtral classes, read and patched through the same regions as the shipped
models.

transformers' modules are not leaf modules of crucible's contracts, so some are read (and replaced) whole:
- `LlamaMLP` (x -> down_proj(act_fn(gate_proj(x)) * up_proj(x))), the SwiGLU region where act_fn is SiLU: the
  patched forward is down_proj(SwiGLU(gate_proj(x), up_proj(x))), the projections PyTorch's;
- `LlamaForCausalLM`, the LM loss region for a training call (labels given, training mode, no cache, every logit):
  the patched forward runs the decoder (`model.model`), shifts the labels as transformers' ForCausalLMLoss does (the
  last position of each row ignored) and calls the fused linear cross-entropy on the final hidden states, so the
  [tokens, vocab] logits are never materialised. Such a call returns `logits=None`, as Liger's patch of
  transformers does; any other call (eval mode, no labels, a cache, `return_dict=False`, ...) runs the model's own
  forward and is counted as a fallback. `MixtralForCausalLM` the same, where the call adds no router auxiliary
  loss (`output_router_logits`, False by default);
- `MixtralSparseMoeBlock` (transformers 5: a MixtralTopKRouter, softmax top-k with the weights renormalised, over
  fused MixtralExperts), the MoE region: the router's logits are the router's own (PyTorch's, with their backward),
  the experts run in _FusedMoE on their fused gate_up_proj [E, 2F, H] and down_proj [E, H, F]. A block with router
  jitter in training is unmatched.
Their calls are read by patching/find.py (HF_READERS); their patched forwards are registered in
patching.functions.FORWARDS when this module is imported (patching.patch imports it). RoPE and attention are
functions called inside transformers' attention forward (`apply_rotary_pos_emb` and the configured attention
interface), not modules: `left_to_pytorch` lists them with the reason. Nothing here imports transformers but the
patched LM forward, which only runs on a transformers model.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from patching.find import training_call
from patching.functions import MOE_WEIGHTS, FORWARDS, Installed, _bind_weight, _call_with, _LMLoss, _SwiGLU

IGNORE_INDEX = -100  # transformers' ForCausalLMLoss default, and the task's


def mlp_forward(module: nn.Module, inst: Installed, args: tuple, kwargs: dict) -> torch.Tensor:
    x = args[0] if args else kwargs["x"]
    k = inst.kernels
    return module.down_proj(_SwiGLU.apply(module.gate_proj(x), module.up_proj(x), k["forward"], k["backward"]))


def causal_lm_forward(module: nn.Module, inst: Installed, args: tuple, kwargs: dict):
    from transformers.modeling_outputs import CausalLMOutputWithPast

    call = training_call(module, args, kwargs)
    labels = call.pop("labels")
    call.pop("logits_to_keep", None)
    call.pop("output_router_logits", None)  # None or False: training_call refuses the router's auxiliary loss
    out = module.model(**call)
    x = out.last_hidden_state
    # ForCausalLMLoss's shift: position t predicts labels[t + 1]; the last position of each row has no target
    target = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].reshape(-1).to(x.device)
    kernel = inst.kernels["forward+backward"]
    w = module.lm_head.weight
    _bind_weight(kernel, w)
    loss = _LMLoss.apply(x.reshape(-1, x.shape[-1]), w, target, kernel)
    return CausalLMOutputWithPast(loss=loss, logits=None, hidden_states=getattr(out, "hidden_states", None),
                                  attentions=getattr(out, "attentions", None))


class _FusedMoE(torch.autograd.Function):
    """patching.functions._MoE for experts stored fused, as transformers 5's MixtralExperts: gate_up [E, 2F, H]
    (each expert's gate rows, then its up rows) goes to the forward kernel as it is; the backward kernel takes
    w1 = gate_up[:, :F], w3 = gate_up[:, F:] (one copy of each for the call) and w2 = down, and its dw1, dw3 are
    joined into gate_up's gradient."""

    @staticmethod
    def forward(ctx, x, logits, fwd, bwd, gate_up, down):
        ctx.save_for_backward(x, logits, gate_up, down)
        ctx.bwd = bwd
        return _call_with(fwd, MOE_WEIGHTS["forward"], (gate_up.contiguous(), down.contiguous()), x, logits)

    @staticmethod
    def backward(ctx, dy):
        x, logits, gate_up, down = ctx.saved_tensors
        ffn = down.shape[2]
        weights = (gate_up[:, :ffn].contiguous(), gate_up[:, ffn:].contiguous(), down.contiguous())
        _, dx, dlogits, dw1, dw3, dw2 = _call_with(ctx.bwd, MOE_WEIGHTS["backward"], weights, x, logits,
                                                   dy.contiguous())
        return dx, dlogits, None, None, torch.cat([dw1, dw3], dim=1), dw2


def mixtral_moe_forward(module: nn.Module, inst: Installed, args: tuple, kwargs: dict) -> torch.Tensor:
    x = args[0] if args else kwargs["hidden_states"]
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    # the router itself, so its logits stay PyTorch's (with their backward) and transformers still records them
    # (output_router_logits); its own top-k choice is recomputed by the kernels from the same logits
    logits = module.gate(rows)[0].contiguous()
    k = inst.kernels
    return _FusedMoE.apply(rows, logits, k["forward"], k["backward"], module.experts.gate_up_proj,
                           module.experts.down_proj).view(x.shape)


# the patched forwards of the classes find.HF_READERS reads
FORWARDS.update({"LlamaMLP": mlp_forward, "LlamaForCausalLM": causal_lm_forward,
                 "MixtralForCausalLM": causal_lm_forward, "MixtralSparseMoeBlock": mixtral_moe_forward})

_LEFT = {
    "apply_rotary_pos_emb": "RoPE, a function transformers calls inside the attention's forward, not a module: "
                            "patching it means replacing transformers' module-level function for every model",
    "attention": "transformers' attention interface, called inside the attention's forward with the model's mask; "
                 "crucible's causal contract takes no mask and repeated key/value heads",
}


def left_to_pytorch(model: nn.Module) -> dict[str, int]:
    """{"op (left to PyTorch: why)": count} for the ops transformers' attention modules compute inline."""
    attns = [m for m in model.modules() if type(m).__module__.startswith("transformers.")
             and type(m).__name__.endswith("Attention") and hasattr(m, "q_proj")]
    if not attns:
        return {}
    impl = getattr(attns[0].config, "_attn_implementation", None) or "eager"
    return {f"{op}{f' ({impl})' if op == 'attention' else ''} (left to PyTorch: {why})": len(attns)
            for op, why in _LEFT.items()}
