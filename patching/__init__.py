"""Find a model's fusable ops, write their task files, and patch in kernels the harness verified at the model's
shapes: `patching.patch(model, inputs)`; and the optimizer step: `patching.adamw(model, ...)` (docs/model.md)."""
from patching.optimizer import adamw
from patching.patch import call_counts, patch, survey, unpatch

__all__ = ["patch", "survey", "unpatch", "call_counts", "adamw"]
