"""The baselines a candidate is timed against, built from the task's reference model.

- `eager`: the reference `Model` as written.
- `compile`: `torch.compile(model)` in the default mode (compiled at its first call, which the timing makes before
  its measurement, never in a timed call).
- `liger`: Liger Kernel's kernel for the same op, when the task file defines `crucible_liger(model)` returning a
  callable that takes the same positional inputs as the model (the task knows which Liger op matches and how to carry
  over the weights) and liger-kernel is installed.
- `vendor`: a vendor library's kernel for the same op, when the task file defines `crucible_vendor(model)` the same
  way (e.g. torch._grouped_mm, cuBLAS's grouped GEMM, for the MoE grouped GEMM, whose eager reference is a loop).
A baseline that cannot be built is reported as unavailable with the reason, never silently dropped. Each callable
takes one input set (a list), as profiler.timing.measure expects, and runs without autograd unless an input asks
for gradients.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

log = logging.getLogger(__name__)

KNOWN = ("eager", "compile", "liger", "vendor")
LIGER_HOOK = "crucible_liger"
VENDOR_HOOK = "crucible_vendor"


@dataclass(frozen=True)
class Baseline:
    name: str
    fn: Callable[[list], Any] | None
    reason: str = ""  # why unavailable
    versions: dict[str, str | None] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        return self.fn is not None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "available": self.available, "reason": self.reason, "versions": dict(self.versions)}


def parse_names(text: str | None) -> tuple[str, ...]:
    """'eager,compile' -> ('eager', 'compile'); ValueError with one sentence for an unknown name."""
    if not text:
        return ("eager",)
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in KNOWN]
    if bad:
        raise ValueError(f"unknown baseline {', '.join(bad)}; choose from {', '.join(KNOWN)}")
    return names


def _call(target: Callable[..., Any]) -> Callable[[list], Any]:
    """target(*args) without autograd, as a forward is timed in inference; a target that needs autograd (a backward
    task's reference or adapter calls torch.autograd.grad in its forward) fails so on its first call (a warm-up
    call) and then runs with grad enabled from there on."""
    grad = {"on": False, "known": False}

    def run(args: list) -> Any:
        if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return target(*args)
        if not grad["known"]:
            grad["known"] = True
            try:
                with torch.no_grad():
                    return target(*args)
            except RuntimeError:
                grad["on"] = True
        with torch.set_grad_enabled(grad["on"]):
            return target(*args)
    return run


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def build(name: str, model: torch.nn.Module, task_module: Any = None) -> Baseline:
    """One baseline around an already constructed reference `model` (on its device, in eval mode)."""
    torch_v = {"torch": torch.__version__}
    if name == "eager":
        return Baseline("eager", _call(model), versions=torch_v)
    if name == "compile":
        try:
            compiled = torch.compile(model)
        except Exception as exc:  # noqa: BLE001 - reported as unavailable
            return Baseline("compile", None, f"torch.compile failed: {type(exc).__name__}: {exc}", torch_v)
        return Baseline("compile", _call(compiled), versions={**torch_v, "triton": _dist_version("triton")})
    if name == "liger":
        versions = {**torch_v, "liger_kernel": _dist_version("liger-kernel")}
        if importlib.util.find_spec("liger_kernel") is None and hasattr(task_module, LIGER_HOOK):
            return Baseline("liger", None, "liger-kernel is not installed", versions)
        return _from_hook("liger", LIGER_HOOK, "Liger's matching op", model, task_module, versions)
    if name == "vendor":
        return _from_hook("vendor", VENDOR_HOOK, "a vendor library's matching op", model, task_module, torch_v)
    raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(KNOWN)}")


def _from_hook(name: str, hook_name: str, what: str, model: torch.nn.Module, task_module: Any,
               versions: dict[str, str | None]) -> Baseline:
    """The baseline the task's `hook_name(model)` returns, or unavailable with the reason."""
    hook = getattr(task_module, hook_name, None)
    if hook is None:
        return Baseline(name, None, f"the task defines no {hook_name}(model) for {what}", versions)
    try:
        fn = hook(model)
    except Exception as exc:  # noqa: BLE001 - reported as unavailable
        return Baseline(name, None, f"{hook_name} failed: {type(exc).__name__}: {exc}", versions)
    if not callable(fn):
        return Baseline(name, None, f"{hook_name}(model) returned {type(fn).__name__}, not a callable", versions)
    return Baseline(name, _call(fn), versions=versions)


def build_all(names: tuple[str, ...], model: torch.nn.Module, task_module: Any = None) -> dict[str, Baseline]:
    """Every requested baseline, in the order asked (torch.compile wraps the module; eager calls stay eager)."""
    out = {}
    for name in names:
        out[name] = build(name, model, task_module)
        log.info("baseline %s: %s", name, "available" if out[name].available else out[name].reason)
    return out
