"""Fused linear + cross-entropy, forward and backward, that never materialises the full logits.

x: [BT, H], weight: [V, H] (an LM head: BT 8192, H 4096, V 128256 in bf16 in the task), target: [BT] int64.
Returns the loss (fp32 scalar), dx [BT, H] and dweight [V, H], the gradients of
    loss = cross_entropy((x @ weight^T).float(), target, ignore_index, label_smoothing, reduction).
The tokens are processed in chunks of C rows; for each chunk, four launches:
    1. L = x_c @ weight^T                       [C, V] logits in the input dtype (the only large buffer)
    2. L <- dlogits, in place                   the cross-entropy kernel of seeds/cross_entropy.py; per-row losses
    3. dx_c = L @ weight                        split over K (= V) in fp32 partials, summed in a fixed order
    4. dweight (+)= L^T @ x_c                   accumulated in dweight's dtype from the second chunk on
then one small kernel sums the per-row losses. All three products are one tl.dot kernel with strides.
FLOPs: 3 x 2 BT V H = 25.8 TFLOP at the task's shape: 37 ms at cuBLAS's measured 694 TFLOP/s.
Extra memory: dweight (1002 MiB) + dx (64 MiB) + the chunk's logits (C V 2 B: 125 MiB at C = 512) + the fp32
split-K partials; the chunk size is chosen to keep the last two under CHUNK_BUDGET.
Bytes: every chunk reads weight twice and reads and writes dweight once (4.2 GB a chunk), so a smaller chunk costs
memory traffic: that is the trade this op makes for memory.

Measured on the H200 (docs/bench-mix.md): 59.0 ms (437 TFLOP/s) at 1.18 GiB extra, 512-token chunks; eager 49.1 ms
at 13.7 GiB; ANCHORS.md has Liger at 54.9 ms / 1.1 GiB. Neither target (45 ms, 1.1 GiB) is met: each chunk re-reads
the 1 GiB weight twice and reads and writes the 1 GiB dweight, about 4.2 GB of traffic a chunk beside its GEMMs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from seeds.cross_entropy import ce_rows, count_valid, needs_rne, round_bf16_rne, sum_rows

CRUCIBLE_SEED = {
    "name": "linear_cross_entropy",
    "tasks": ["linear_cross_entropy.py"],
    "ops": ["fused linear + cross-entropy fwd+bwd (loss, dx, dW)"],
}

# Bytes for the chunk's logits and split-K partials: 160 MiB gives 512-token chunks at V 128256, the fastest measured
# (59.0 ms at 1.18 GiB extra); 64 MiB (192 tokens, 1.09 GiB) took 101.5 ms and 256 tokens (1.11-1.12 GiB) 72.8-79.7 ms.
CHUNK_BUDGET = 160 << 20


@triton.jit
def _matmul_kernel(
    A, B, C,  # C[s] = A[:, K_s] @ B[K_s, :] for split s (program axis 1), or C (+)= A @ B with one split
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    stride_cs,    # elements between the splits' partial outputs
    k_per_split,  # a multiple of BK
    ACCUMULATE: tl.constexpr,  # add the product to what C holds
    IEEE: tl.constexpr,        # full fp32 products for fp32 inputs (tf32 would fail an fp32 tolerance)
    UPCAST: tl.constexpr,      # multiply in fp32 (the CPU interpreter: its bf16 tl.dot is wrong in Triton 3.9)
    RNE: tl.constexpr,         # round to nearest bf16 before the store (the interpreter truncates)
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    # Programs in groups of GROUP_M row-tiles walk the column tiles together, so B's tiles are reused from L2.
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    group_size = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % group_size
    pid_n = (pid % (GROUP_M * num_n)) // group_size

    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    k_lo = split * k_per_split
    k_hi = min(K, k_lo + k_per_split)
    a_ptrs = A + rm[:, None].to(tl.int64) * stride_am + (k_lo + rk)[None, :].to(tl.int64) * stride_ak
    b_ptrs = B + (k_lo + rk)[:, None].to(tl.int64) * stride_bk + rn[None, :].to(tl.int64) * stride_bn
    m_ok = rm[:, None] < M
    n_ok = rn[None, :] < N
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in range(k_lo, k_hi, BK):
        k_ok = (k + rk) < k_hi
        a = tl.load(a_ptrs, mask=m_ok & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok, other=0.0)
        if UPCAST:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        elif IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BK * stride_ak
        b_ptrs += BK * stride_bk
    c_ptrs = C + split.to(tl.int64) * stride_cs + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    if ACCUMULATE:
        acc += tl.load(c_ptrs, mask=m_ok & n_ok).to(tl.float32)
    if RNE:
        acc = round_bf16_rne(acc)
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=m_ok & n_ok)


@triton.jit
def _sum_splits_kernel(P, OUT, n_elements, splits, RNE: tl.constexpr, BLOCK: tl.constexpr):
    """OUT = sum over s of P[s] (P: [splits, n_elements] fp32), in split order."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, splits):
        acc += tl.load(P + s * n_elements + offs, mask=mask, other=0.0)
    if RNE:
        acc = round_bf16_rne(acc)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=mask)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, accumulate: bool = False, split_k: int = 1,
           config: tuple[int, int, int, int, int] | None = None, partials: torch.Tensor | None = None) -> None:
    """out (+)= a @ b for 2-D views with any strides; `config` = (BM, BN, BK, warps, stages). With split_k > 1,
    the flat fp32 buffer `partials` (at least split_k M N elements) receives the split products and `out`
    (contiguous) their sum."""
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return
    bm, bn, bk, warps, stages = config or _default_config(a.device)
    k_per_split = triton.cdiv(triton.cdiv(K, split_k), bk) * bk if K else bk
    split_k = max(1, triton.cdiv(K, k_per_split)) if K else 1
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), split_k)
    ieee = a.dtype == torch.float32
    # bf16 and fp16 products are exact in fp32, so upcasting on the interpreter changes no result.
    common = dict(IEEE=ieee, UPCAST=a.device.type != "cuda", BM=bm, BN=bn, BK=bk, GROUP_M=8, num_warps=warps, num_stages=stages)
    if split_k == 1:
        _matmul_kernel[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                             out.stride(1), 0, k_per_split, ACCUMULATE=accumulate, RNE=needs_rne(out), **common)
        return
    if accumulate or not out.is_contiguous():
        raise ValueError("matmul: split-K writes a fresh contiguous output")
    p = partials[: split_k * M * N]
    _matmul_kernel[grid](a, b, p, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), N, 1, M * N,
                         k_per_split, ACCUMULATE=False, RNE=False, **common)
    _sum_splits_kernel[(triton.cdiv(M * N, 1024),)](p, out, M * N, split_k, RNE=needs_rne(out), BLOCK=1024,
                                                    num_warps=4)


def _default_config(device: torch.device) -> tuple[int, int, int, int, int]:
    """(BM, BN, BK, warps, stages): Hopper-sized tiles on a GPU, small ones on the interpreter."""
    return (128, 256, 64, 8, 3) if device.type == "cuda" else (64, 64, 64, 4, 1)


def default_chunk(n_tokens: int, v: int, h: int, split_k: int, elem_bytes: int) -> int:
    """Tokens per chunk: the largest power of two (at least 64) whose logits and split-K partials fit CHUNK_BUDGET."""
    per_token = v * elem_bytes + split_k * h * 4
    fit = max(1, CHUNK_BUDGET // per_token)
    chunk = max(64, 1 << (fit.bit_length() - 1))
    return min(chunk, max(1, n_tokens))


def linear_cross_entropy_fwd_bwd(
    x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
    label_smoothing: float = 0.0, reduction: str = "mean", chunk: int | None = None, split_k: int | None = None,
    logits_config=None, dx_config=None, dw_config=None, fused_ce: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, dx, dweight) of cross_entropy(x @ weight^T, target) for an upstream gradient of 1."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy: expected x [BT, H] and weight [V, H], got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if target.shape != (x.shape[0],) or target.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"linear_cross_entropy: expected an integer target of shape [{x.shape[0]}], got "
                         f"{tuple(target.shape)} {target.dtype}")
    if x.dtype != weight.dtype or not x.is_floating_point():
        raise ValueError(f"linear_cross_entropy: x and weight must share one float dtype, got {x.dtype} and "
                         f"{weight.dtype}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"linear_cross_entropy: reduction must be 'mean' or 'sum', got {reduction!r}")
    x, weight, target = x.contiguous(), weight.contiguous(), target.contiguous()
    bt, h = x.shape
    v = weight.shape[0]
    mean = reduction == "mean"
    if split_k is None:
        split_k = 2 if x.is_cuda else 3
    dx = torch.empty_like(x)
    dw = torch.empty_like(weight) if bt else torch.zeros_like(weight)
    loss_rows = torch.empty(bt, dtype=torch.float32, device=x.device)
    n_valid = count_valid(target, ignore_index)
    c = chunk or default_chunk(bt, v, h, split_k, x.element_size())
    logits = torch.empty((min(c, bt), v), dtype=x.dtype, device=x.device)
    partials = torch.empty(split_k * min(c, bt) * h, dtype=torch.float32, device=x.device) if split_k > 1 else None
    for i, r0 in enumerate(range(0, bt, c)):
        r1 = min(bt, r0 + c)
        lc, xc = logits[: r1 - r0], x[r0:r1]
        matmul(xc, weight.t(), lc, config=logits_config)
        ce_rows(lc, target[r0:r1], lc, loss_rows[r0:r1], n_valid, ignore_index, label_smoothing, mean,
                fused=fused_ce)
        matmul(lc, weight, dx[r0:r1], split_k=split_k, config=dx_config, partials=partials)
        matmul(lc.t(), xc, dw, accumulate=i > 0, config=dw_config)
    return sum_rows(loss_rows, n_valid, mean), dx, dw


class ModelNew(torch.nn.Module):
    """tasks/linear_cross_entropy.py: (loss, dx, dweight) of an LM head's cross-entropy."""

    def __init__(self, hidden: int, vocab: int, ignore_index: int = -100, label_smoothing: float = 0.0,
                 reduction: str = "mean"):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(vocab, hidden, dtype=torch.bfloat16))
        self.ignore_index, self.label_smoothing, self.reduction = ignore_index, label_smoothing, reduction

    def forward(self, x: torch.Tensor, target: torch.Tensor):
        return linear_cross_entropy_fwd_bwd(x, self.weight.detach(), target, self.ignore_index,
                                            self.label_smoothing, self.reduction)
