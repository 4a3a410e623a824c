"""A fused Triton hinge loss for KernelBench's level1/100_HingeLoss.py: mean(clamp(1 - predictions * targets, min=0)).

predictions is (batch, *input_shape); targets is (batch,), which broadcasts against predictions' LAST dimension (the
task only runs while batch_size == input_shape[0]). At the task's size, 32768 x 32768 float32, the op reads
4.3 GB of predictions once and writes one number: memory-bound. Eager PyTorch runs three passes (the product, the
clamp, the mean) and writes two 4.3 GB temporaries.

One pass: predictions are viewed as (R, L) rows, L its last dimension; each program sums the hinge of a contiguous
band of rows in float32, a column block at a time (BLOCK_R x BLOCK_L tiles of 4096 elements; where targets are the
same for every row, as here, their slice is loaded once per column block), and writes its partial sum; a second one-program kernel adds the partials in a fixed order and divides
by the element count. No atomics, so the result is the same bits at every call. Speed on the H200 is measured by the
command in docs/kernelbench.md ("Level-1 slice").
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

TILE = 4096  # elements per tile: 16 per thread at eight warps
MAX_PARTIALS = 4096  # programs of the first pass at most (a few waves on 132 SMs)


@triton.jit
def _hinge_partial_kernel(
    P, T, Partial,
    R, L,
    stride_pr,  # elements between rows of P (its columns are contiguous)
    stride_tr, stride_tl,  # targets broadcast to (R, L): 0 along a broadcast dimension
    ROWS_PER_PROG,  # rows each program sums (a multiple of BLOCK_R)
    BLOCK_R: tl.constexpr, BLOCK_L: tl.constexpr,
    T_SAME_ROWS: tl.constexpr,  # stride_tr == 0 (the task's case): targets' slice is loaded once per column block
):
    pid = tl.program_id(0)
    first = pid * ROWS_PER_PROG
    last = tl.minimum(first + ROWS_PER_PROG, R)
    acc = tl.zeros((BLOCK_R, BLOCK_L), dtype=tl.float32)
    for c0 in range(0, L, BLOCK_L):
        cols = c0 + tl.arange(0, BLOCK_L)
        col_ok = cols < L
        if T_SAME_ROWS:
            t_cols = tl.load(T + cols * stride_tl, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        for r0 in range(first, last, BLOCK_R):
            rows = r0 + tl.arange(0, BLOCK_R)
            rows64 = rows.to(tl.int64)[:, None]
            mask = (rows < last)[:, None] & col_ok[None, :]
            p = tl.load(P + rows64 * stride_pr + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            if T_SAME_ROWS:
                t = t_cols
            else:
                t = tl.load(T + rows64 * stride_tr + cols[None, :] * stride_tl, mask=mask, other=0.0).to(tl.float32)
            acc += tl.where(mask, tl.maximum(1.0 - p * t, 0.0), 0.0)
    tl.store(Partial + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


@triton.jit
def _mean_kernel(Partial, Out, n_partials, count, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    total = tl.sum(tl.load(Partial + offs, mask=offs < n_partials, other=0.0), axis=0)
    tl.store(Out, (total / count).to(Out.dtype.element_ty))


def hinge_loss(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if predictions.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"hinge_loss takes float32, float16 or bfloat16 predictions; got {predictions.dtype}")
    shape = torch.broadcast_shapes(predictions.shape, targets.shape)
    if shape != predictions.shape:
        raise ValueError(f"targets {tuple(targets.shape)} must broadcast to predictions {tuple(predictions.shape)}")
    if targets.dtype != predictions.dtype:
        raise ValueError(f"hinge_loss takes targets of predictions' dtype {predictions.dtype}; got {targets.dtype}")
    out = torch.empty((), device=predictions.device, dtype=predictions.dtype)
    count = predictions.numel()
    if count == 0:
        raise ValueError("hinge_loss of an empty tensor is NaN in torch; this kernel takes at least one element")
    L = predictions.shape[-1] if predictions.ndim else 1
    R = count // L
    p = predictions.reshape(R, L)  # a view for the contiguous inputs the task makes
    if p.stride(1) != 1:
        raise ValueError("hinge_loss needs predictions whose last dimension is contiguous")
    t = targets.expand(shape).reshape(R, L)  # a view: stride 0 along the broadcast dimensions
    block_l = min(triton.next_power_of_2(L), TILE)
    block_r = TILE // block_l
    bands = triton.cdiv(R, block_r)
    programs = min(bands, MAX_PARTIALS)
    rows_per_prog = triton.cdiv(bands, programs) * block_r
    programs = triton.cdiv(R, rows_per_prog)
    partial = torch.empty(programs, device=predictions.device, dtype=torch.float32)
    _hinge_partial_kernel[(programs,)](p, t, partial, R, L, p.stride(0), t.stride(0), t.stride(1), rows_per_prog,
                                       BLOCK_R=block_r, BLOCK_L=block_l, T_SAME_ROWS=t.stride(0) == 0, num_warps=8)
    _mean_kernel[(1,)](partial, out, programs, count, BLOCK=triton.next_power_of_2(programs), num_warps=8)
    return out


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return hinge_loss(predictions, targets)
