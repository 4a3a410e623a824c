"""Where candidates run: the device a run asks for, resolved against what this machine has, and what this machine's
Triton CPU interpreter cannot do.

Triton's interpreter before 3.7 turns a kernel's integer argument into a Python integer with `int()` of a
one-element numpy array, which numpy 2.4 and newer refuse ("only 0-dimensional arrays can be converted to Python
scalars"): every kernel whose loop bound (`range(0, n, BLOCK)`) or index comes from a runtime argument fails on such a
machine, whatever it computes. That is the machine's fault, not the candidate's: `interpreter_fault` names it, and
the harness reports it as its own error (a run stops after a few), never as the candidate's runtime error.
"""
from __future__ import annotations

import re

import torch

NUMPY_SCALAR_ERROR = "only 0-dimensional arrays can be converted to Python scalars"


def resolve_device(device: str) -> str:
    """'auto', 'cpu' or 'cuda' -> the device a run uses; ValueError with one sentence for one it cannot use."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}; use cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("no CUDA GPU is visible; use --device cpu to check correctness through Triton's interpreter")
    return device


def _release(version: str) -> tuple[int, int]:
    """'3.6.0' -> (3, 6); '2.4.0rc1' -> (2, 4); anything unreadable -> (0, 0)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def installed_versions() -> tuple[str, str]:
    """(Triton's version, numpy's version) on this machine."""
    import numpy
    import triton
    return triton.__version__, numpy.__version__


def interpreter_fault(message: str, versions: tuple[str, str] | None = None) -> str | None:
    """The sentence for a candidate's CPU-interpreter error that this machine's Triton and numpy (or `versions`)
    caused, else None."""
    if NUMPY_SCALAR_ERROR not in message:
        return None
    triton_version, numpy_version = versions or installed_versions()
    if _release(triton_version) >= (3, 7) or _release(numpy_version) < (2, 4):
        return None
    return (f"Triton {triton_version}'s CPU interpreter cannot run a kernel that uses an integer argument as a loop "
            f"bound or index with numpy {numpy_version}: install 'numpy<2.4' or Triton 3.7 or newer, then run again")
