"""A tiled Triton matmul for KernelBench's level1/2_Standard_matrix_multiplication_.py: C = A @ B.

A is (M, K), B is (K, N), both float32 at the task's size (M = 2048, K = 8192, N = 4096): 2·M·N·K = 137 GFLOP, and
(M·K + K·N + M·N)·4 = 235 MB, so the op is compute-bound.

Accuracy: the task declares no tf32 allowance, so the harness holds a float32 output to float32's tolerance
(sandbox/tolerance.py: relative L2 error 1e-5, which a plain tf32 product fails at this K). The float32 products run
as 3xTF32 (`input_precision="tf32x3"`): each operand is split into a tf32 high part and a tf32 remainder and three
tensor-core products (hi·hi + hi·lo + lo·hi) are summed in float32, which keeps the error of a float32 product while
running on the tensor cores; eager PyTorch (tf32 off, its default) runs cuBLAS's float32 SIMT kernels. Half and
bfloat16 inputs take a plain tensor-core product.

Tiles: 128x128 outputs per program, K in steps of 32, three stages of operands in flight (3 · 32 KB of shared
memory), eight warps; programs are grouped eight row-tiles at a time so that the B tiles they share stay in L2.
Speed on the H200 is measured by the command in docs/kernelbench.md ("Level-1 slice").
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _matmul_kernel(
    A, B, C,
    M, N, K,
    stride_am, stride_ak,  # elements between rows / columns of A
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,  # row-tiles that run side by side and share B's column tiles in L2
    EVEN_K: tl.constexpr,  # K is a multiple of BLOCK_K: no mask on the K steps
    PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * tiles_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows

    # Rows and columns past the edge wrap around (always in bounds); the store masks them out.
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = A + rm.to(tl.int64)[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = B + rk[:, None] * stride_bk + rn.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = C + cm.to(tl.int64)[:, None] * stride_cm + cn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=(cm[:, None] < M) & (cn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs (M, K) @ (K, N); got {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != b.dtype or a.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"matmul takes two float32, float16 or bfloat16 matrices; got {a.dtype} and {b.dtype}")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    if M == 0 or N == 0:
        return c  # nothing to write (K = 0 runs no K step and writes zeros, as torch does)
    block_m, block_n, block_k = 128, 128, 32 if a.dtype == torch.float32 else 64
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    _matmul_kernel[grid](
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, EVEN_K=K % block_k == 0,
        PRECISION="tf32x3" if a.dtype == torch.float32 else "tf32",
        num_warps=8, num_stages=3,
    )
    return c


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return matmul(A, B)
