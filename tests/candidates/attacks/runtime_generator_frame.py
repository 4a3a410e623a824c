"""Climbs the stack from its forward through a running generator's frame (gi_frame.f_back: no sys needed) to the
worker's frame, whose locals hold the harness's state, and switches the torch-compute check off there
(`allow_compute`); then computes RMSNorm with torch ops beside a token Triton launch. The test bypasses the static
stage to show the audit hook on its own."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def caller_frame():
    box = []

    def peek():
        yield box[0].gi_frame.f_back  # the frame that resumed this generator: caller_frame's

    box.append(peek())
    return next(box[0]).f_back


def unlock(frame):
    while frame is not None:
        state = frame.f_locals.get("state")
        if isinstance(state, dict) and "allow_compute" in state:
            state["allow_compute"] = True
        frame = frame.f_back


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        unlock(caller_frame())
        scratch = torch.empty_like(x)
        _copy[(triton.cdiv(x.numel(), 1024),)](x, scratch, x.numel(), BLOCK=1024)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)
