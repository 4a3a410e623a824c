"""Find a model's fusable regions: its leaf modules matched to crucible's tasks, with the shapes they ran at in a
real forward (captured by forward hooks), and the ops left to PyTorch, read from a torch.fx trace (or, where fx
cannot trace the model, as transformers' models, the leaf modules outside the regions).

A module is matched by its class name (the shipped models' leaf modules, Hugging Face's RMSNorm classes, and its
LlamaMLP, LlamaForCausalLM, MixtralForCausalLM and MixtralSparseMoeBlock, read whole: HF_READERS, patched by
patching/hf.py), then confirmed by the call itself:
the hook reads the arguments' shapes and a call that does not fit the task's contract (e.g. an odd head dim for
RoPE) leaves the module unmatched, never guessed.
"""
from __future__ import annotations

import inspect
import logging
from collections import Counter
from typing import Any, Callable

import torch
import torch.nn as nn

from patching.records import Kind, Region

log = logging.getLogger(__name__)

CLASS_KINDS: dict[str, Kind] = {
    "RMSNorm": Kind.RMSNORM, "LlamaRMSNorm": Kind.RMSNORM, "MixtralRMSNorm": Kind.RMSNORM,
    "SiluMul": Kind.SWIGLU,
    "Rotary": Kind.ROPE,
    "CausalAttention": Kind.ATTENTION,
    "LMLoss": Kind.LM_LOSS,
    "SparseMoE": Kind.MOE,
    # Hugging Face's modules read and replaced whole (patching/hf.py): the MLP around its SwiGLU, the causal LMs
    # around their head and loss, Mixtral's MoE block around its router and fused experts
    "LlamaMLP": Kind.SWIGLU, "LlamaForCausalLM": Kind.LM_LOSS, "MixtralForCausalLM": Kind.LM_LOSS,
    "MixtralSparseMoeBlock": Kind.MOE,
}


def _rmsnorm(mod: nn.Module, args: tuple) -> tuple[dict[str, int], tuple[int, ...], dict[str, float]]:
    x = args[0]
    n = x.shape[-1]
    eps = getattr(mod, "eps", getattr(mod, "variance_epsilon", None))
    if eps is None or mod.weight.shape != (n,):
        raise ValueError("not an RMSNorm over the last dimension with a weight")
    return {"M": x.numel() // n, "N": n}, (n,), {"EPS": float(eps)}


def _swiglu(mod: nn.Module, args: tuple):
    a, b = args[0], args[1]
    if a.shape != b.shape:
        raise ValueError("silu(a) * b needs a and b of one shape")
    n = a.shape[-1]
    return {"M": a.numel() // n, "N": n}, (n,), {}


def _rope(mod: nn.Module, args: tuple):
    q, k, cos = args[0], args[1], args[2]
    if q.dim() != 4 or k.dim() != 4 or q.shape[-1] % 2 or cos.shape != (q.shape[1], q.shape[-1]):
        raise ValueError("RoPE needs q [B, T, Hq, D], k [B, T, Hk, D] and tables [T, D]")
    b, t, hq, d = q.shape
    return {"B": b, "T": t, "HQ": hq, "HK": k.shape[2], "D": d}, (hq, k.shape[2], d), {}


def _attention(mod: nn.Module, args: tuple):
    q, k = args[0], args[1]
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError("causal attention over q, k, v [B, H, S, D] of one shape")
    b, h, s, d = q.shape
    return {"B": b, "H": h, "S": s, "D": d}, (h, d), {}


def _lm_loss(mod: nn.Module, args: tuple):
    x, w = args[0], args[1]
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError("the LM loss needs x [BT, H] and a head weight [V, H]")
    return {"BT": x.shape[0], "H": x.shape[1], "V": w.shape[0]}, (x.shape[1], w.shape[0]), {}


def _moe(mod: nn.Module, args: tuple):
    x, experts, gate = args[0], getattr(mod, "experts", None), getattr(mod, "gate", None)
    if not isinstance(experts, nn.ModuleList) or not len(experts) or not all(_linears(e) for e in experts):
        raise ValueError("a mixture block with a ModuleList of gated experts (gate_proj, up_proj, down_proj)")
    h, ffn, n = x.shape[-1], experts[0].gate_proj.out_features, len(experts)
    if not isinstance(gate, nn.Linear) or gate.bias is not None or gate.weight.shape != (n, h):
        raise ValueError("the router must be a Linear(hidden, experts) without bias")
    if any(_linears(e) != ((ffn, h), (ffn, h), (h, ffn)) for e in experts):
        raise ValueError("experts of one shape (gate and up [FFN, hidden], down [hidden, FFN]) without biases")
    top_k = int(mod.top_k)
    return {"T": x.numel() // h, "H": h, "FFN": ffn, "EXPERTS": n, "TOP_K": top_k}, (h, ffn, n, top_k), {}


def _linears(expert: nn.Module) -> tuple | None:
    """The weight shapes of a gated expert's gate, up and down projections; None unless all three are Linear
    layers without bias."""
    layers = [getattr(expert, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(m, nn.Linear) and m.bias is None for m in layers):
        return None
    return tuple(tuple(m.weight.shape) for m in layers)


READERS: dict[Kind, Callable[[nn.Module, tuple], tuple[dict[str, int], tuple[int, ...], dict[str, float]]]] = {
    Kind.RMSNORM: _rmsnorm, Kind.SWIGLU: _swiglu, Kind.ROPE: _rope, Kind.ATTENTION: _attention,
    Kind.LM_LOSS: _lm_loss, Kind.MOE: _moe,
}


def read_call(mod: nn.Module, kind: Kind, args: tuple, kwargs: dict
              ) -> tuple[dict[str, int], tuple[int, ...], dict[str, float], torch.dtype]:
    """The task constants, shape key, float settings and dtype of one call of a matched module; ValueError (or
    AttributeError, IndexError, TypeError) where the call does not fit the contract."""
    hf = HF_READERS.get(type(mod).__name__)
    if hf is not None:
        return hf(mod, args, kwargs)
    return (*READERS[kind](mod, args), args[0].dtype)


MISFITS = (ValueError, AttributeError, IndexError, TypeError)


def _silu(act: nn.Module) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def read_mlp(mod: nn.Module, args: tuple, kwargs: dict):
    x = args[0] if args else kwargs.get("x")
    if not _silu(getattr(mod, "act_fn", None)):
        raise ValueError(f"the MLP's activation is {type(getattr(mod, 'act_fn', None)).__name__}, not SiLU: "
                         "not a SwiGLU")
    layers = [getattr(mod, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(m, nn.Linear) for m in layers) or layers[0].out_features != layers[1].out_features:
        raise ValueError("a gated MLP needs Linear gate_proj and up_proj of one width, and a Linear down_proj")
    h, n = x.shape[-1], layers[0].out_features
    return {"M": x.numel() // h, "N": n}, (n,), {}, x.dtype


def training_call(mod: nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The causal LM's arguments for a call the fused loss serves; ValueError saying why for any other call."""
    bound = inspect.signature(type(mod).forward).bind(mod, *args, **kwargs).arguments
    bound.pop("self")
    extra = bound.pop("kwargs", {})
    if extra:
        raise ValueError(f"a call with {', '.join(sorted(extra))}, which the fused loss does not take")
    if bound.get("labels") is None:
        raise ValueError("a call without labels: no loss to fuse")
    if not mod.training:
        raise ValueError("a call in eval mode, which returns the logits")
    if bound.get("cache", bound.get("past_key_values")) is not None:
        raise ValueError("a call with a cache")
    aux = bound.get("output_router_logits")
    if aux if aux is not None else getattr(mod.config, "output_router_logits", False):
        raise ValueError("a call with output_router_logits, whose loss adds the router's auxiliary loss")
    if not isinstance(bound.get("logits_to_keep", 0), int) or bound.get("logits_to_keep", 0) != 0:
        raise ValueError("a call with logits_to_keep")
    if getattr(mod.loss_function, "__name__", "") != "ForCausalLMLoss":
        raise ValueError(f"the loss is {getattr(mod.loss_function, '__name__', mod.loss_function)}, not "
                         "transformers' ForCausalLMLoss")
    head = getattr(mod, "lm_head", None)
    if not isinstance(head, nn.Linear) or head.bias is not None or head.out_features != mod.config.vocab_size:
        raise ValueError("the LM head must be a Linear(hidden, vocab) without bias")
    return bound


def read_causal_lm(mod: nn.Module, args: tuple, kwargs: dict):
    labels = training_call(mod, args, kwargs)["labels"]
    v, h = mod.lm_head.weight.shape
    return {"BT": labels.numel(), "H": h, "V": v}, (h, v), {}, mod.lm_head.weight.dtype


def read_mixtral_moe(mod: nn.Module, args: tuple, kwargs: dict):
    """transformers 5's MixtralSparseMoeBlock: a MixtralTopKRouter (softmax, top-k, the weights renormalised: the
    MoE tasks' routing) over MixtralExperts, fused [E, 2F, H] gate_up_proj (gate rows, then up rows) and
    [E, H, F] down_proj, SiLU-gated."""
    x = args[0] if args else kwargs.get("hidden_states")
    gate, experts = getattr(mod, "gate", None), getattr(mod, "experts", None)
    if type(gate).__name__ != "MixtralTopKRouter" or type(experts).__name__ != "MixtralExperts":
        raise ValueError(f"a router {type(gate).__name__} and experts {type(experts).__name__}, not transformers' "
                         "MixtralTopKRouter (softmax top-k, renormalised) and MixtralExperts")
    if x.dim() != 3:
        raise ValueError("the block takes hidden states [batch, seq, hidden]")
    if mod.training and getattr(mod, "jitter_noise", 0) > 0:
        raise ValueError(f"router jitter noise {mod.jitter_noise} in training scales the input by random noise, "
                         "which the MoE contract does not")
    if not _silu(getattr(experts, "act_fn", None)):
        raise ValueError(f"the experts' activation is {type(getattr(experts, 'act_fn', None)).__name__}, not "
                         "SiLU: not SwiGLU experts")
    if getattr(experts, "has_bias", False) or getattr(gate, "bias", None) is not None:
        raise ValueError("experts or a router with biases, which the MoE contract does not have")
    h, (n, f2, _) = x.shape[-1], experts.gate_up_proj.shape
    ffn, top_k = f2 // 2, int(mod.top_k)
    if (experts.gate_up_proj.shape != (n, 2 * ffn, h) or experts.down_proj.shape != (n, h, ffn)
            or gate.weight.shape != (n, h) or int(gate.top_k) != top_k):
        raise ValueError("experts' gate_up_proj [E, 2F, H], down_proj [E, H, F] and a router [E, H] of one "
                         "hidden size and expert count, the block's top-k the router's")
    if not experts.gate_up_proj.dtype == experts.down_proj.dtype == x.dtype:
        raise ValueError("experts' weights of another dtype than the hidden states")
    return {"T": x.numel() // h, "H": h, "FFN": ffn, "EXPERTS": n, "TOP_K": top_k}, (h, ffn, n, top_k), {}, x.dtype


# Hugging Face's modules read (and replaced, patching/hf.py) whole: their calls are not the shipped leaf modules'
HF_READERS = {"LlamaMLP": read_mlp, "LlamaForCausalLM": read_causal_lm, "MixtralForCausalLM": read_causal_lm,
              "MixtralSparseMoeBlock": read_mixtral_moe}


def candidates(model: nn.Module) -> dict[str, Kind]:
    """Qualified module name -> the kind its class names."""
    return {name: CLASS_KINDS[type(m).__name__] for name, m in model.named_modules()
            if type(m).__name__ in CLASS_KINDS}


def find_regions(model: nn.Module, inputs: list[Any], forward: Callable[..., Any] | None = None
                 ) -> tuple[list[Region], dict[str, str]]:
    """Run one forward (no gradients) with hooks on the matched modules; the regions found, grouped by kind and
    shape key, and {module: why it was not matched} for modules whose calls did not fit."""
    named = dict(model.named_modules())
    found = candidates(model)
    seen: dict[tuple[Kind, tuple[int, ...]], dict[str, Any]] = {}
    misfits: dict[str, str] = {}
    handles = []

    def hook(name: str, kind: Kind):
        def record(mod: nn.Module, args: tuple, kwargs: dict) -> None:
            try:
                consts, key, floats, dtype = read_call(mod, kind, args, kwargs)
            except MISFITS as exc:
                misfits[name] = str(exc)
                return
            entry = seen.setdefault((kind, key), {"modules": [], "constants": consts, "floats": floats,
                                                  "dtype": str(dtype).removeprefix("torch.")})
            if name not in entry["modules"]:
                entry["modules"].append(name)
        return record

    for name, kind in found.items():
        handles.append(named[name].register_forward_pre_hook(hook(name, kind), with_kwargs=True))
    try:
        with torch.no_grad():
            (forward or model)(*inputs)
    finally:
        for h in handles:
            h.remove()
    inner = _inside_moe(found)
    regions = [Region(kind, tuple(e["modules"]), e["constants"], e["dtype"], key, e["floats"])
               for (kind, key), e in seen.items()]
    for name in found:
        if not any(name in r.modules for r in regions) and name not in misfits:
            misfits[name] = "never called in the forward" + (" (an expert no token was routed to)" if name in inner
                                                              else "")
    return regions, misfits


def _inside_moe(found: dict[str, Kind]) -> set[str]:
    moes = [n for n, k in found.items() if k is Kind.MOE]
    return {n for n in found if any(n.startswith(m + ".") for m in moes)}


def unmatched_ops(model: nn.Module, concrete: dict[str, Any] | None = None) -> dict[str, int]:
    """The ops a torch.fx trace of the model shows outside the matched regions, by name with their counts (the
    projections, the embedding, residual adds...): what stays PyTorch's. {"(not traceable)": 0}-style one entry
    naming the failure where fx cannot trace the model."""
    leaves = set(CLASS_KINDS) - set(HF_READERS)  # they hold ops left to PyTorch: the projections, the decoder

    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            return type(m).__name__ in leaves or super().is_leaf_module(m, qualname)

    try:
        graph = Tracer().trace(model, concrete_args=concrete)
    except Exception as exc:  # noqa: BLE001 - fx refuses data-dependent control flow; say so, do not guess
        return {f"(not traced by torch.fx: {type(exc).__name__}; the leaf modules outside the regions instead)": 0,
                **_unmatched_leaves(model)}
    named = dict(model.named_modules())
    counts: Counter[str] = Counter()
    for node in graph.nodes:
        if node.op == "call_module":
            cls = type(named[node.target]).__name__
            if cls not in leaves:
                counts[cls] += 1
        elif node.op in ("call_function", "call_method"):
            name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
            if name not in _SHAPE_ONLY:
                counts[name] += 1
    return dict(counts.most_common())


def _unmatched_leaves(model: nn.Module) -> dict[str, int]:
    """The leaf modules left to PyTorch, by class with their counts, where no trace lists the ops: all but the
    matched modules and what their patched forwards replace (a gated MLP's activation, a causal LM's head)."""
    kinds = {name: CLASS_KINDS[type(m).__name__] for name, m in model.named_modules()
             if type(m).__name__ in CLASS_KINDS}
    counts: Counter[str] = Counter()
    for name, m in model.named_modules():
        parent, _, attr = name.rpartition(".")
        replaced = (kinds.get(parent) is Kind.SWIGLU and not isinstance(m, nn.Linear)
                    or kinds.get(parent) is Kind.LM_LOSS and attr == "lm_head"
                    or kinds.get(parent.rpartition(".")[0]) is Kind.MOE and parent.endswith(".experts"))
        if next(m.children(), None) is None and name not in kinds and not replaced:
            counts[type(m).__name__] += 1
    return dict(counts.most_common())


_SHAPE_ONLY = {"view", "reshape", "transpose", "getitem", "getattr", "size", "contiguous", "chunk", "arange",
               "repeat_interleave", "float", "to", "outer", "cat", "cos", "sin", "truediv", "pow", "rpow", "neg",
               "mul", "sub", "__getitem__", "_assert_is_none"}
