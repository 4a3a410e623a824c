"""The launch trace: which Triton kernels a call launched, and which torch ops it ran besides.

Two hooks, installed by trusted code in the candidate's process before the candidate is imported:
  - Triton's `JITFunction.run` (and the interpreter's `InterpretedFunction.run`) are wrapped: each launch records
    the file and name of the kernel's Python function. Kernels must come from the candidate's file or from the
    `seeds` package (crucible's own verified kernels).
  - a TorchDispatchMode sees every aten op on every device, CPU included. The policy below splits them into glue
    (allowed always) and compute (allowed only where the task says CRUCIBLE_ALLOW_TORCH_COMPUTE). While a Triton
    launch is in progress the mode stands aside: the interpreter's own tensor copies are not the candidate's.
The mode also poisons every fresh allocation (NaN for floating tensors, the dtype's minimum for integers), so an
output the candidate allocates but does not fully write shows up as NaN, and memory freed by anything earlier can
never pass as a result.

Glue policy (write it down, since the LLM is told the same): allocation (empty/zeros/ones/full and *_like, new_*,
arange), fills (fill_, zero_), copies and dtype/device conversion (copy_, clone, contiguous, .to), views and shape
changes (view, reshape, transpose, permute, expand, squeeze/unsqueeze, slicing, select, split/chunk/unbind, as_strided),
concatenation (cat, stack) and reading a scalar (.item()). Everything else is compute.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import policy

GLUE_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "scalar_tensor", "arange", "fill_", "zero_",
    "copy_", "clone", "contiguous", "_to_copy", "to", "detach", "alias", "lift_fresh", "lift_fresh_copy", "view",
    "_unsafe_view", "reshape", "_reshape_alias", "view_as", "as_strided", "transpose", "t", "permute", "expand",
    "expand_as", "squeeze", "unsqueeze", "flatten", "unflatten", "select", "slice", "narrow", "split",
    "split_with_sizes", "chunk", "unbind", "cat", "stack", "_local_scalar_dense", "resize_", "sym_size",
    "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "record_stream", "set_",
})
ALLOCATING_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})


@dataclass
class CallTrace:
    launches: list[tuple[str, str]] = field(default_factory=list)  # (file, kernel name)
    compute_ops: list[str] = field(default_factory=list)
    foreign: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "launches": len(self.launches),
            "kernels": sorted({name for _, name in self.launches}),
            "compute_ops": sorted(set(self.compute_ops)),
            "foreign_kernels": sorted({f"{name} ({os.path.basename(f)})" for f, name in self.foreign}),
        }


class _State:
    active: CallTrace | None = None
    in_launch: int = 0
    allowed_files: set[str] = set()
    allowed_dirs: tuple[str, ...] = ()
    poison: bool = True


def install(candidate_file: str, seeds_dir: str) -> None:
    """Wrap Triton's launch entry points. Call once, before the candidate is imported."""
    _State.allowed_files = {os.path.realpath(candidate_file)}
    _State.allowed_dirs = (os.path.realpath(seeds_dir) + os.sep,)
    from triton.runtime import jit as _jit
    _wrap(_jit.JITFunction)
    try:
        from triton.runtime import interpreter as _interp
    except ImportError:  # pragma: no cover - every supported Triton has it
        return
    _wrap(_interp.InterpretedFunction)


def _wrap(cls: type) -> None:
    original = cls.run
    if getattr(original, "_crucible_wrapped", False):
        return

    def run(self, *args, **kwargs):
        trace = _State.active
        if trace is not None and _State.in_launch == 0:
            fn = getattr(self, "fn", None)
            code = getattr(fn, "__code__", None)
            origin = os.path.realpath(code.co_filename) if code else "?"
            record = (origin, getattr(fn, "__name__", "?"))
            trace.launches.append(record)
            if origin not in _State.allowed_files and not origin.startswith(_State.allowed_dirs):
                trace.foreign.append(record)
        _State.in_launch += 1
        try:
            with policy.trusted():
                return original(self, *args, **kwargs)
        finally:
            _State.in_launch -= 1

    run._crucible_wrapped = True  # type: ignore[attr-defined]
    cls.run = run


class TraceMode(TorchDispatchMode):
    """Records compute ops and poisons fresh allocations while the candidate runs."""

    def __init__(self, trace: CallTrace, poison: bool = True):
        super().__init__()
        self.trace = trace
        self.poison = poison

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if _State.in_launch:
            return out
        name = func.__name__.split(".")[0]
        if name not in GLUE_OPS:
            self.trace.compute_ops.append(name)
        elif self.poison and name in ALLOCATING_OPS and isinstance(out, torch.Tensor):
            _poison(out)
        return out


def _poison(t: torch.Tensor) -> None:
    if t.numel() == 0:
        return
    with torch.no_grad():
        if t.is_floating_point() or t.is_complex():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(torch.iinfo(t.dtype).min)


class tracing:
    """Context manager: trace one call of the candidate."""

    def __init__(self, poison: bool = True):
        self.trace = CallTrace()
        self.mode = TraceMode(self.trace, poison)

    def __enter__(self) -> CallTrace:
        _State.active = self.trace
        self.mode.__enter__()
        return self.trace

    def __exit__(self, *exc: object) -> None:
        self.mode.__exit__(*exc)
        _State.active = None
