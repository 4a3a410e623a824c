"""Load a model file: a Python file, like a task file but for a whole model (docs/model.md), that defines

    PRESETS = {"tiny": ..., "1b": ...}                       # names of sizes it can build
    def get_model(preset, device="cpu", dtype=torch.bfloat16) -> nn.Module   # random weights, no download
    def get_inputs(preset, device="cpu", seed=0) -> list     # one training batch: model(*inputs) is the loss

and, for inference, a model whose forward(ids, cache=...) returns the last position's logits with
`new_cache(batch, max_len)` (models/llama.py's CausalLM).
"""
from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


class ModelFileError(ValueError):
    """The model file cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class ModelFile:
    path: Path
    module: types.ModuleType
    preset: str

    @property
    def name(self) -> str:
        return f"{self.path.stem}-{self.preset}"

    def build(self, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
        return self.module.get_model(self.preset, device=device, dtype=dtype)

    def inputs(self, device: str | torch.device = "cpu", seed: int = 0) -> list[Any]:
        return list(self.module.get_inputs(self.preset, device=device, seed=seed))


def load_model_file(path: str | Path, preset: str | None = None) -> ModelFile:
    path = Path(path).resolve()
    if not path.exists() or path.suffix != ".py":
        raise ModelFileError(f"model file {path} does not exist or is not a .py file; pass e.g. models/llama.py")
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:  # the shipped model files import models.layers
        sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location(f"crucible_model_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    except ModelFileError as exc:  # the file's own sentence (e.g. a library it needs is not installed)
        raise ModelFileError(f"{path.name}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's file: one sentence, not a traceback
        raise ModelFileError(f"{path.name} failed to import: {type(exc).__name__}: {exc}") from None
    missing = [n for n in ("PRESETS", "get_model", "get_inputs") if not hasattr(module, n)]
    if missing:
        raise ModelFileError(f"{path.name} does not define {', '.join(missing)}; a model file defines PRESETS, "
                             "get_model(preset, device, dtype) and get_inputs(preset, device, seed)")
    presets = list(module.PRESETS)
    preset = preset or presets[0]
    if preset not in presets:
        raise ModelFileError(f"{path.name} has no preset {preset!r}; its presets are {', '.join(presets)}")
    return ModelFile(path, module, preset)
