"""Find a model's fusable regions: its leaf modules matched to crucible's tasks, with the shapes they ran at in a
real forward (captured by forward hooks), and the ops left to PyTorch, read from a torch.fx trace.

A module is matched by its class name (the shipped models' leaf modules, and the names Hugging Face's Llama and
Mixtral give the same ops), then confirmed by the call itself: the hook reads the arguments' shapes and a call that
does not fit the task's contract (e.g. an odd head dim for RoPE) leaves the module unmatched, never guessed.
"""
from __future__ import annotations

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
        def record(mod: nn.Module, args: tuple) -> None:
            try:
                consts, key, floats = READERS[kind](mod, args)
            except (ValueError, AttributeError, IndexError) as exc:
                misfits[name] = str(exc)
                return
            entry = seen.setdefault((kind, key), {"modules": [], "constants": consts, "floats": floats,
                                                  "dtype": str(args[0].dtype).removeprefix("torch.")})
            if name not in entry["modules"]:
                entry["modules"].append(name)
        return record

    for name, kind in found.items():
        handles.append(named[name].register_forward_pre_hook(hook(name, kind)))
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
    leaves = set(CLASS_KINDS)

    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            return type(m).__name__ in leaves or super().is_leaf_module(m, qualname)

    try:
        graph = Tracer().trace(model, concrete_args=concrete)
    except Exception as exc:  # noqa: BLE001 - fx refuses data-dependent control flow; say so, do not guess
        return {f"(the model could not be traced by torch.fx: {type(exc).__name__})": 0}
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


_SHAPE_ONLY = {"view", "reshape", "transpose", "getitem", "getattr", "size", "contiguous", "chunk", "arange",
               "repeat_interleave", "float", "to", "outer", "cat", "cos", "sin", "truediv", "pow", "rpow", "neg",
               "mul", "sub", "__getitem__", "_assert_is_none"}
