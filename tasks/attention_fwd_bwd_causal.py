"""Attention forward + backward, causal: (o, dq, dk, dv) of scaled_dot_product_attention(q, k, v, is_causal=True)
for an upstream gradient do, bf16 [B, H, S, D]; the reference runs SDPA and autograd.

FLOPs: 3.5x the forward's (forward 2 matmuls, backward 5 with the recomputation of P), the convention of ANCHORS.md:
7 * B * H * S^2 * D. The ANCHORS row: B4 H32 S4096 D128 (SDPA flash backend 269 / cuDNN 449 TFLOP/s on the H200).
Bytes: read q, k, v, do; write o, dq, dk, dv.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

B = 4
H = 32
S = 4096
D = 128

CRUCIBLE_FIXED = ["D"]
CRUCIBLE_FLOPS = "lambda c: 7 * c['B'] * c['H'] * c['S'] ** 2 * c['D']"
CRUCIBLE_BYTES = "lambda c: 2 * 8 * c['B'] * c['H'] * c['S'] * c['D']"
# Not "large" (inputs x100): scores of order 1e4 make every softmax row one-hot, where the true dq and dk are exactly
# 0 and SDPA's CPU backward (dS from the row's own P and dP) returns exact zeros, so the elementwise bound there is
# 0. FlashAttention's backward takes delta = rowsum(dO o O) apart from dP and recomputes P from the saved
# log-sum-exp, which leaves fp32 residue of order 1e-2 in dS: every FA-style kernel fails that draw, the
# seed included (measured on the CPU harness), though no training run sees such scores.
CRUCIBLE_DISTRIBUTIONS = ["normal", "uniform", "outliers", "constant_rows"]
# On a Hopper GPU SDPA runs cuDNN's backward, whose dq and dk are more accurate than any FlashAttention-2-style
# kernel's where few keys take a row (causal rows near the start, "outliers" and "constant_rows" draws). Held to
# cuDNN's elementwise errors alone, PyTorch's own FlashAttention-2 backend failed 6 of these 8 task x distribution
# draws on the H200 (benchmarks/diag_attention_precision.py: e.g. causal "normal" 181 dq and 463 dk elements
# outside), so that backend is named here as a second honest reference (sandbox/tolerance.py: a candidate is held
# to the less accurate of the two, elementwise). On the CPU the alternate is SDPA's CPU flash kernel.


def crucible_references(model):
    """{name: fn(*inputs)}: other honest PyTorch implementations of this op (sandbox/reference.py)."""
    def flash(q, k, v, do):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return model(q, k, v, do)
    return {"SDPA FlashAttention-2 backend": flash}


# The harness checks candidates against this model run in float64 (its "truth"): there it runs a few heads at a
# time, so that its float64 [B, heads, S, S] scores take 1 GB a tensor at the task's size instead of 17 (the whole
# truth passes through several such, which a GPU busy with a search's other checks may not have room for). Heads
# are independent: the values are the same.
_TRUTH_HEADS = 2


def _by_heads(fn, *ts):
    """fn over _TRUTH_HEADS heads (dim 1) of the tensors at a time, its outputs concatenated along the heads."""
    parts = [fn(*(t[:, h:h + _TRUTH_HEADS] for t in ts)) for h in range(0, ts[0].shape[1], _TRUTH_HEADS)]
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts, dim=1)
    return tuple(torch.cat(p, dim=1) for p in zip(*parts))


class Model(nn.Module):
    def __init__(self, causal: bool = True):
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor):
        if q.dtype == torch.float64:
            return _by_heads(self._attend, q, k, v, do)
        return self._attend(q, k, v, do)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor):
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        return o.detach(), dq, dk, dv


def get_inputs():
    return [torch.randn(B, H, S, D, dtype=torch.bfloat16) for _ in range(4)]


def get_init_inputs():
    return [True]
