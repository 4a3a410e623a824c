"""Gated linear units: y = act(a) * b, forward and backward, for SwiGLU (act = SiLU) and GeGLU (act = GELU, tanh or
erf form). This file holds the kernels of the whole family; seeds/geglu.py and the *_bwd.py files reuse them.

Shapes: a, b and dy of any shape (the last dimension is the FFN width, e.g. 16384 x 14336 tokens x features), any
float dtype; the maths runs in fp32 and rounds once to the input dtype.
Bytes (bf16): forward reads a, b and writes y: 6 B/element, 1.41 GB at 16384 x 14336 (0.33 ms at the H200's measured
copy bandwidth of 4,244 GB/s). Backward reads a, b, dy and writes da, db: 10 B/element, 2.35 GB.
The kernels see the tensors as flat arrays (a, b and dy are made contiguous), so any shape is one 1-D grid of
BLOCK-element programs and every load is a 16-byte vector.

Measured on the H200 (docs/bench-mix.md), 16384 x 14336 bf16, 2048-element blocks: SwiGLU fwd 0.328 ms = 4,293 GB/s
(101% of the measured copy; torch.compile 0.327, Liger 0.329: a tie), bwd 0.552 ms = 4,252 GB/s (1.58x torch.compile's
forward+backward, the best baseline); GeGLU tanh fwd 1.65x Liger, bwd 2.15x; GeGLU erf fwd 3,955 GB/s, bwd 3.0x eager.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CRUCIBLE_SEED = {
    "name": "swiglu",
    "tasks": ["swiglu_fwd.py"],
    "ops": ["SwiGLU fwd"],
}

SILU, GELU_TANH, GELU_ERF = 0, 1, 2
ACTIVATIONS = {"silu": SILU, "tanh": GELU_TANH, "none": GELU_ERF}  # keys: F.gelu's `approximate`, plus "silu"

_SQRT_2_OVER_PI = 0.7978845608028654
_INV_SQRT_2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


@triton.jit
def _act_and_grad(a, ACT: tl.constexpr, NEED_GRAD: tl.constexpr):
    """act(a) and, when NEED_GRAD, act'(a); `a` is fp32.

    SiLU:       act = a s,  s = sigmoid(a);       act' = s (1 + a (1 - s))
    GELU tanh:  act = a (1 + t) / 2,  t = tanh(u),  u = sqrt(2/pi) (a + 0.044715 a^3);
                act' = (1 + t) / 2 + a (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 a^2) / 2
    GELU erf:   act = a (1 + erf(a / sqrt 2)) / 2;  act' = (1 + erf(a / sqrt 2)) / 2 + a exp(-a^2 / 2) / sqrt(2 pi)
    """
    if ACT == 0:
        s = 1.0 / (1.0 + tl.exp(-a))
        act = a * s
        grad = s * (1.0 + a * (1.0 - s)) if NEED_GRAD else act
    elif ACT == 1:
        u = 0.7978845608028654 * (a + 0.044715 * a * a * a)
        # tanh(u) = 1 - 2 / (exp(2u) + 1): exact limits +-1 when exp overflows or underflows.
        t = 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)
        act = 0.5 * a * (1.0 + t)
        if NEED_GRAD:
            grad = 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * a * a)
        else:
            grad = act
    else:
        cdf = 0.5 * (1.0 + tl.erf(a * 0.7071067811865476))
        act = a * cdf
        grad = cdf + a * tl.exp(-0.5 * a * a) * 0.3989422804014327 if NEED_GRAD else act
    return act, grad


@triton.jit
def _glu_fwd_kernel(A, B, Y, n_elements, ACT: tl.constexpr, BLOCK: tl.constexpr, I64: tl.constexpr = True,
                    EVEN: tl.constexpr = False):
    """I64: 64-bit offsets (else 32-bit: the launcher allows it below 2**31 elements, fewer address instructions);
    EVEN: every program's block is whole (n_elements % BLOCK == 0), so no masks."""
    if I64:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        a = tl.load(A + offs).to(tl.float32)
        b = tl.load(B + offs).to(tl.float32)
    else:
        mask = offs < n_elements
        a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    act, _ = _act_and_grad(a, ACT, False)
    if EVEN:
        tl.store(Y + offs, (act * b).to(Y.dtype.element_ty))
    else:
        tl.store(Y + offs, (act * b).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _glu_bwd_kernel(A, B, DY, DA, DB, n_elements, ACT: tl.constexpr, BLOCK: tl.constexpr):
    """y = act(a) b  =>  da = dy b act'(a),  db = dy act(a)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    act, grad = _act_and_grad(a, ACT, True)
    tl.store(DA + offs, (dy * b * grad).to(DA.dtype.element_ty), mask=mask)
    tl.store(DB + offs, (dy * act).to(DB.dtype.element_ty), mask=mask)


def _settings(n_elements: int, elem_bytes: int) -> tuple[int, int]:
    """BLOCK and warps for a streaming kernel: 4 KiB of each tensor per program at 4 warps (2048 bf16 elements, two
    16-byte vectors per thread), smaller blocks for small tensors so several programs still run. On the H200 this
    was within 0.7% of the best of 1024/2048/4096/8192-element variants for every GLU op and 4% ahead on the erf
    forward; 8192 at 8 warps lost 3-12% (docs/bench-mix.md)."""
    block = 4096 // elem_bytes
    while block > 256 and triton.cdiv(n_elements, block) < 264:
        block //= 2
    return block, 4


def _check(op: str, act: str, *tensors: torch.Tensor) -> int:
    if act not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {sorted(ACTIVATIONS)}, got {act!r}")
    first = tensors[0]
    for t in tensors[1:]:
        if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
            raise ValueError(f"{op}: all inputs must share shape, dtype and device; got {tuple(first.shape)} "
                             f"{first.dtype} and {tuple(t.shape)} {t.dtype}")
    if not first.is_floating_point():
        raise ValueError(f"{op}: expected floating-point inputs, got {first.dtype}")
    return ACTIVATIONS[act]


def glu_fwd(a: torch.Tensor, b: torch.Tensor, act: str = "silu", block: int | None = None,
            num_warps: int | None = None, lean: bool = True) -> torch.Tensor:
    """act(a) * b; `act` is "silu", "tanh" (GELU tanh form) or "none" (GELU erf form). lean (the default, the same
    bits): 32-bit offsets below 2**31 elements and no masks when the blocks divide the tensor. SiLU on 2-byte
    inputs takes 1024-element blocks: on the H200 (benchmarks/sweep_glu.py, 16384 x 14336 bf16) lean 1024
    read 0.3269 ms against torch.compile's 0.3268 and 0.3286 for the old 2048 default (copy ceiling 0.3258)."""
    code = _check("glu_fwd", act, a, b)
    a, b = a.contiguous(), b.contiguous()
    y = torch.empty_like(a)
    n = a.numel()
    if n == 0:
        return y
    blk, warps = _settings(n, a.element_size())
    if code == SILU and a.element_size() == 2:
        blk = min(blk, 1024)
    blk, warps = block or blk, num_warps or warps
    _glu_fwd_kernel[(triton.cdiv(n, blk),)](a, b, y, n, ACT=code, BLOCK=blk, I64=not (lean and n < 2**31),
                                            EVEN=lean and n % blk == 0, num_warps=warps)
    return y


def glu_bwd(a: torch.Tensor, b: torch.Tensor, dy: torch.Tensor, act: str = "silu", block: int | None = None,
            num_warps: int | None = None, out: tuple[torch.Tensor, torch.Tensor] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, db) for y = act(a) * b and upstream gradient dy. `out`: contiguous tensors like a to write them into,
    which may be a and b themselves (each program reads its elements before it writes them)."""
    code = _check("glu_bwd", act, a, b, dy)
    a, b, dy = a.contiguous(), b.contiguous(), dy.contiguous()
    if out is not None and any(o.shape != a.shape or o.dtype != a.dtype or not o.is_contiguous() for o in out):
        raise ValueError("glu_bwd: out must be two contiguous tensors of a's shape and dtype")
    da, db = out if out is not None else (torch.empty_like(a), torch.empty_like(b))
    n = a.numel()
    if n == 0:
        return da, db
    blk, warps = _settings(n, a.element_size())
    blk, warps = block or blk, num_warps or warps
    _glu_bwd_kernel[(triton.cdiv(n, blk),)](a, b, dy, da, db, n, ACT=code, BLOCK=blk, num_warps=warps)
    return da, db


class GLUFunction(torch.autograd.Function):
    """act(a) * b with the fused backward; saves a and b (recomputing act in the backward costs no bytes)."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, act: str = "silu") -> torch.Tensor:
        ctx.save_for_backward(a, b)
        ctx.act = act
        return glu_fwd(a, b, act)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        a, b = ctx.saved_tensors
        da, db = glu_bwd(a, b, dy, ctx.act)
        return da, db, None


class ModelNew(torch.nn.Module):
    """tasks/swiglu_fwd.py: silu(a) * b."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return glu_fwd(a, b, "silu")
