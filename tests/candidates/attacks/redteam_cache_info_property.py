"""Attack: the state walk (sandbox/carry.py) asks every object it meets `hasattr(v, "cache_info")`. A property of that
name runs the candidate's Python after the forward returned, outside the launch trace, before the outputs are sent:
it computes the RMSNorm in torch into the NaN-poisoned output the forward returned."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _touch(y_ptr):
    pass


class _Stats:
    def __init__(self):
        self.currsize = 0


class _Pending:
    def __init__(self):
        self.jobs = []
        self.stats = _Stats()

    @property
    def cache_info(self):
        for x, w, eps, y in self.jobs:
            y.copy_(torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps))
        self.jobs.clear()
        return self._info

    def _info(self):
        return self.stats


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.eps = eps
        self.pending = _Pending()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        _touch[(1,)](y)
        self.pending.jobs.append((x, self.weight, self.eps, y))
        return y
