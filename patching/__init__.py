"""Find a model's fusable ops, write their task files, and patch in kernels the harness verified at the model's
shapes: `patching.patch(model, inputs)` (docs/model.md)."""
from patching.patch import call_counts, patch, survey, unpatch

__all__ = ["patch", "survey", "unpatch", "call_counts"]
