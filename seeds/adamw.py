"""Fused AdamW step: fp32 master weights and moments updated in one pass, a bf16 copy of the weights written out.

Per parameter, with g the gradient (fp32, or bf16/fp16), t the step (a 0-d tensor read on the device, so the step
never synchronises with the host):
    p <- p (1 - lr wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps);  p16 <- bf16(p)
which is torch.optim.AdamW's update (decoupled weight decay, no amsgrad).
Bytes: read p, g, m, v (16 B with fp32 g) and write p, m, v, p16 (14 B): 30 B/param, 28 with bf16 grads.
torch's fused=True moves 28 B/param with fp32 grads and writes no bf16 copy.
One launch per tensor (a step over a model's tensors is a handful of long launches queued back to back; at 1B
parameters in 64 tensors each launch streams ~470 MB, so launch cost is hidden behind the previous kernel).
Updates in place by default; with inplace=False new tensors are returned (the task's contract).

Measured on the H200 (docs/bench-mix.md), 1B fp32 params in 64 tensors, fp32 grads: 10.8 ms = 2,775 GB/s (65% of the
measured copy) against torch fused=True 8.05 ms (28 B/param, no bf16 copy; 9.65 ms with the copy): 0.74x, not the
1.0x target. Larger blocks were slower still (16 ms), which points at the kernel, not launch cost; not yet explained.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CRUCIBLE_SEED = {"name": "adamw", "tasks": ["adamw.py"], "ops": ["AdamW step (fp32 master, bf16 copy)"]}


@triton.jit
def _adamw_kernel(
    P, G, M, V,                 # inputs: fp32 params, grads (any float), fp32 moments
    P_OUT, M_OUT, V_OUT, P16,   # outputs (P_OUT, M_OUT, V_OUT may alias P, M, V: each element is read first)
    STEP,                       # 0-d tensor: the step number after this update (1 on the first step)
    n_elements, lr, beta1, beta2, eps, weight_decay,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    step = tl.load(STEP).to(tl.float32)
    # b^t = 2^(t log2 b): fp32-accurate for the step counts of training (relative error ~1e-7 at t = 1e5).
    bias1 = 1.0 - tl.exp2(step * tl.log2(beta1))
    bias2 = 1.0 - tl.exp2(step * tl.log2(beta2))
    p = tl.load(P + offs, mask=mask, other=0.0)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(M + offs, mask=mask, other=0.0)
    v = tl.load(V + offs, mask=mask, other=0.0)
    p = p * (1.0 - lr * weight_decay)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    denom = tl.sqrt(v) / tl.sqrt(bias2) + eps
    p = p - (lr / bias1) * (m / denom)
    tl.store(P_OUT + offs, p, mask=mask)
    tl.store(M_OUT + offs, m, mask=mask)
    tl.store(V_OUT + offs, v, mask=mask)
    tl.store(P16 + offs, p.to(P16.dtype.element_ty), mask=mask)


def _settings(n: int) -> tuple[int, int]:
    """BLOCK and warps: 1024 elements at 4 warps (two 16-byte vectors per thread and tensor), smaller for small
    tensors. The H200 run: 1024/4 10.8 ms, 2048/8 13.2, 4096/8 16.3, 8192/8 15.9 for 1B params in 64 tensors."""
    block = 1024
    while block > 256 and triton.cdiv(n, block) < 264:
        block //= 2
    return block, 4


def adamw_step(params, grads, exp_avgs, exp_avg_sqs, step: torch.Tensor, lr: float = 1e-3,
               betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
               inplace: bool = True, low_precision_dtype: torch.dtype = torch.bfloat16,
               block: int | None = None, num_warps: int | None = None):
    """One AdamW step over lists of tensors; returns (params, exp_avgs, exp_avg_sqs, low-precision params)."""
    n = len(params)
    if not (len(grads) == len(exp_avgs) == len(exp_avg_sqs) == n):
        raise ValueError(f"adamw_step: {n} params but {len(grads)} grads, {len(exp_avgs)} exp_avgs and "
                         f"{len(exp_avg_sqs)} exp_avg_sqs")
    if step.numel() != 1:
        raise ValueError(f"adamw_step: step must be a one-element tensor, got shape {tuple(step.shape)}")
    beta1, beta2 = betas
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
        raise ValueError(f"adamw_step: betas must lie in [0, 1), got {betas}")
    outs = ([], [], [], [])
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        if p.dtype != torch.float32 or m.dtype != torch.float32 or v.dtype != torch.float32:
            raise ValueError(f"adamw_step: params and moments must be float32 (master weights), got {p.dtype}, "
                             f"{m.dtype}, {v.dtype}")
        if not (p.shape == g.shape == m.shape == v.shape) or not g.is_floating_point():
            raise ValueError(f"adamw_step: a param {tuple(p.shape)} needs a float grad and moments of its shape, "
                             f"got {tuple(g.shape)}, {tuple(m.shape)}, {tuple(v.shape)}")
        if inplace and not (p.is_contiguous() and m.is_contiguous() and v.is_contiguous()):
            raise ValueError("adamw_step: in-place updates need contiguous params and moments")
        p_in, g, m_in, v_in = p.contiguous(), g.contiguous(), m.contiguous(), v.contiguous()
        p_out = p_in if inplace else torch.empty_like(p_in)
        m_out = m_in if inplace else torch.empty_like(m_in)
        v_out = v_in if inplace else torch.empty_like(v_in)
        p16 = torch.empty(p_in.shape, dtype=low_precision_dtype, device=p_in.device)
        numel = p_in.numel()
        if numel:
            blk, warps = _settings(numel)
            blk, warps = block or blk, num_warps or warps
            _adamw_kernel[(triton.cdiv(numel, blk),)](
                p_in, g, m_in, v_in, p_out, m_out, v_out, p16, step, numel, float(lr), float(beta1), float(beta2),
                float(eps), float(weight_decay), BLOCK=blk, num_warps=warps)
        for lst, t in zip(outs, (p_out, m_out, v_out, p16)):
            lst.append(t)
    return outs


class ModelNew(torch.nn.Module):
    """tasks/adamw.py: forward(*params, *grads, *exp_avgs, *exp_avg_sqs, step) returns new tensors:
    (*params, *exp_avgs, *exp_avg_sqs, *bf16 params)."""

    def __init__(self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float):
        super().__init__()
        self.lr, self.betas, self.eps, self.weight_decay = lr, (beta1, beta2), eps, weight_decay

    def forward(self, *state: torch.Tensor):
        if len(state) % 4 != 1:
            raise ValueError(f"expected 4 lists of equal length and a step tensor, got {len(state)} tensors")
        n = (len(state) - 1) // 4
        p, g, m, v = (list(state[i * n:(i + 1) * n]) for i in range(4))
        outs = adamw_step(p, g, m, v, state[-1], self.lr, self.betas, self.eps, self.weight_decay, inplace=False)
        return tuple(t for lst in outs for t in lst)
