"""The tolerance module's two passes over an output on a GPU, each one Triton kernel that reads the candidate's output,
the reference's, the float64 truth and the alternates once, in their own dtypes, and writes one row of sums per block
of BLOCK elements: no float32 copies, no temporaries, two launches in place of a few hundred small kernels a chunk
(a SwiGLU output of 235M bf16 elements, compared a dozen times a check). sandbox/tolerance.py says what is computed;
these rows are reduced to its per-chunk rows there, and its torch code keeps the rest: the CPU, outputs of other
dtypes or with more alternates than MAX_ALTERNATES, and locating the worst element of an output that fails.

Each element's arithmetic is the torch code's, in the same working precision (float32 for 16-bit outputs, else
float64), the same order and no fused multiply-adds (torch's elementwise kernels round each step); the sums are
float64 as there. Finite is `x - x == 0` (false for NaN and +-Inf)."""
from __future__ import annotations

import threading
from contextlib import nullcontext

import torch
import triton
import triton.language as tl

BLOCK = 1024  # elements a program; the chunk size of sandbox/tolerance.py is a multiple of it
MAX_ALTERNATES = 2
PASS1_TERMS = 7  # nf_bad, c_nf, r_nf, n_fin, t2, err2, ref_max; then one ref_err2 per reference (r, alternates)
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FLOAT32_MAX = tl.constexpr(3.4028234663852886e38)
_LAUNCH = threading.Lock()  # the parent's check slots are threads: one first compile of a kernel, not several
_broken: list[str] = []  # why the kernels failed in this process (then the torch passes do the work)


@triton.jit
def _finite(x):
    return (x - x) == 0


@triton.jit
def _cast(x, WORK64: tl.constexpr):
    if WORK64:
        w = x.to(tl.float64)
    else:
        w = x.to(tl.float32)
    return w


@triton.jit
def _work(ptr, offs, mask, WORK64: tl.constexpr):
    return _cast(tl.load(ptr + offs, mask=mask, other=0), WORK64)


@triton.jit
def _truth(ptr, offs, mask, WORK64: tl.constexpr, CLAMP: tl.constexpr):
    """The truth in the working precision; a float64 value past float32's range becomes float32's largest of its
    sign, not an infinity (tolerance._Chunks._work_truth)."""
    t = tl.load(ptr + offs, mask=mask, other=0)
    w = _cast(t, WORK64)
    if CLAMP:  # float32 work only
        w = tl.where((w == w) & ~_finite(w) & _finite(t), tl.where(t > 0, FLOAT32_MAX, -FLOAT32_MAX), w)
    return w


@triton.jit
def _param(ptr, i: tl.constexpr, WORK64: tl.constexpr):
    return _cast(tl.load(ptr + i), WORK64)


@triton.jit
def _beyond(ptr, offs, mask, limit2):
    """Where the truth, as computed, lies past twice the output dtype's largest value (tolerance._Chunks.chunk)."""
    return tl.abs(tl.load(ptr + offs, mask=mask, other=0).to(tl.float64)) > limit2


@triton.jit
def _or_truth(a, t):
    return tl.where(_finite(a), a, t)


@triton.jit
def _sum2(x):
    x64 = x.to(tl.float64)
    return tl.sum(x64 * x64, axis=0)


@triton.jit
def _block(C, R, T, n, WORK64: tl.constexpr, CLAMP: tl.constexpr, BLOCK: tl.constexpr):
    """This program's block: its id, offsets and mask, and the candidate's, reference's and truth's elements."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    return pid, offs, mask, _work(C, offs, mask, WORK64), _work(R, offs, mask, WORK64), \
        _truth(T, offs, mask, WORK64, CLAMP)


@triton.jit
def _pass1_kernel(C, R, T, A0, A1, P, OUT, n, WORK64: tl.constexpr, CLAMP: tl.constexpr, N_ALT: tl.constexpr,
                  TERMS: tl.constexpr, BLOCK: tl.constexpr):
    # P: twice the output dtype's largest value, and that value (float64)
    pid, offs, mask, c, r, t = _block(C, R, T, n, WORK64, CLAMP, BLOCK)
    beyond = _beyond(T, offs, mask, tl.load(P + 0))
    c_nf, r_nf, t_nf = ~_finite(c), ~_finite(r), ~_finite(t)
    c_nan, r_nan = c != c, r != r
    same_nf = (c_nf == r_nf) & (c_nan == r_nan) & ((c == r) | c_nan | ~c_nf)
    saturated = ((c > 0) == (t > 0)) & (tl.abs(c).to(tl.float64) >= tl.load(P + 1))
    nf_bad = tl.where(beyond, ~saturated, ~(same_nf | (r_nf & ~t_nf & ~c_nf))) & mask
    fin = ~(c_nf | r_nf | t_nf | beyond) & mask
    tf = tl.where(fin, t, 0.0)
    ref_err = tl.where(fin, r, 0.0) - tf
    row = OUT + pid.to(tl.int64) * TERMS
    tl.store(row + 0, tl.sum(nf_bad.to(tl.float64), axis=0))
    tl.store(row + 1, tl.sum((c_nf & mask).to(tl.float64), axis=0))
    tl.store(row + 2, tl.sum((r_nf & mask).to(tl.float64), axis=0))
    tl.store(row + 3, tl.sum(fin.to(tl.float64), axis=0))
    tl.store(row + 4, _sum2(tf))
    tl.store(row + 5, _sum2(tl.where(fin, c, 0.0) - tf))
    tl.store(row + 7, _sum2(ref_err))
    worst = tl.max(tl.abs(ref_err), axis=0)
    if N_ALT >= 1:
        alt_err = tl.where(fin, _or_truth(_work(A0, offs, mask, WORK64), t), 0.0) - tf
        tl.store(row + 8, _sum2(alt_err))
        worst = tl.maximum(worst, tl.max(tl.abs(alt_err), axis=0))
    if N_ALT >= 2:
        alt_err = tl.where(fin, _or_truth(_work(A1, offs, mask, WORK64), t), 0.0) - tf
        tl.store(row + 9, _sum2(alt_err))
        worst = tl.maximum(worst, tl.max(tl.abs(alt_err), axis=0))
    tl.store(row + 6, worst.to(tl.float64))


@triton.jit
def _pass2_kernel(C, R, T, A0, A1, P, OUT, n, REF_FACTOR: tl.constexpr, TAIL_FACTOR: tl.constexpr,
                  WORK64: tl.constexpr, CLAMP: tl.constexpr, N_ALT: tl.constexpr, BLOCK: tl.constexpr):
    pid, offs, mask, c, r, t = _block(C, R, T, n, WORK64, CLAMP, BLOCK)
    # P: atol x the truth's scale, rtol, PyTorch's RMS error, its worst element's error (float64, cast here as
    # torch casts a Python scalar to the tensor's dtype), twice the output dtype's largest value
    atol_s = _param(P, 0, WORK64)
    rtol = _param(P, 1, WORK64)
    ref_rms = _param(P, 2, WORK64)
    ref_max = _param(P, 3, WORK64)
    fin = _finite(c) & _finite(t) & ~_beyond(T, offs, mask, tl.load(P + 4))
    tf = tl.where(fin, t, 0.0)
    err = tl.abs(tl.where(fin, c, 0.0) - tf)
    ref_err = tl.abs(tl.where(fin & _finite(r), r - t, 0.0))
    if N_ALT >= 1:
        ref_err = tl.maximum(ref_err, tl.abs(tl.where(fin, _or_truth(_work(A0, offs, mask, WORK64), t), 0.0) - tf))
    if N_ALT >= 2:
        ref_err = tl.maximum(ref_err, tl.abs(tl.where(fin, _or_truth(_work(A1, offs, mask, WORK64), t), 0.0) - tf))
    bound = atol_s + rtol * tl.abs(tf) + tl.maximum(REF_FACTOR * tl.maximum(ref_err, ref_rms), TAIL_FACTOR * ref_max)
    out = (err > bound) & mask
    row = OUT + pid.to(tl.int64) * 2
    tl.store(row + 0, tl.sum(out.to(tl.float64), axis=0))
    tl.store(row + 1, tl.max(tl.where(mask, err, 0.0), axis=0).to(tl.float64))


def usable(got: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor, alternates: tuple[torch.Tensor, ...],
           *, interpret: bool = False) -> bool:
    """Whether these tensors take the kernels: one CUDA device for all (or the CPU where `interpret`, the tests'
    Triton interpreter), dtypes of DTYPES, at most MAX_ALTERNATES alternates."""
    ts = (got, ref, truth, *alternates)
    if _broken or len(alternates) > MAX_ALTERNATES or any(t.dtype not in DTYPES for t in ts):
        return False
    device = got.device
    if any(t.device != device for t in ts):
        return False
    return device.type == "cuda" or (interpret and device.type == "cpu")


def _args(got: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor, alternates: tuple[torch.Tensor, ...],
          work: torch.dtype) -> tuple[list[torch.Tensor], dict]:
    flat = [x.detach().contiguous().view(-1) for x in (got, ref, truth, *alternates)]  # the kernels read unit strides
    alts = flat[3:] + [flat[0]] * (MAX_ALTERNATES - len(alternates))  # absent ones never read (N_ALT)
    consts = dict(WORK64=work == torch.float64, CLAMP=truth.dtype == torch.float64 and work != torch.float64,
                  N_ALT=len(alternates), BLOCK=BLOCK)
    return [*flat[:3], *alts[:MAX_ALTERNATES]], consts


def give_up(exc: BaseException) -> None:
    """The kernels failed (a Triton that cannot compile them): the torch passes compare from now on."""
    _broken.append(f"{type(exc).__name__}: {exc}")


def blocks(n: int) -> int:
    return -(-n // BLOCK)


def pass1(got: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor, alternates: tuple[torch.Tensor, ...],
          work: torch.dtype, beyond: float, limit: float) -> torch.Tensor:
    """[blocks, PASS1_TERMS + 1 + len(alternates)] float64 on the device: each block's terms of tolerance's pass 1.
    beyond: the truth's magnitude past which an element is judged by position; limit: the output dtype's largest
    value."""
    tensors, consts = _args(got, ref, truth, alternates, work)
    n = got.numel()
    terms = PASS1_TERMS + 1 + len(alternates)
    p = torch.tensor((beyond, limit), dtype=torch.float64, device=got.device)
    out = torch.empty((blocks(n), terms), dtype=torch.float64, device=got.device)
    with _LAUNCH, torch.cuda.device(got.device) if got.is_cuda else nullcontext():
        _pass1_kernel[(blocks(n),)](*tensors, p, out, n, TERMS=terms, num_warps=4, enable_fp_fusion=False, **consts)
    return out


def pass2(got: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor, alternates: tuple[torch.Tensor, ...],
          work: torch.dtype, params: tuple[float, float, float, float, float], ref_factor: float,
          tail_factor: float) -> torch.Tensor:
    """[blocks, 2] float64 on the device: each block's count of elements outside their bound, and its largest error.
    params: (atol x the truth's scale, rtol, PyTorch's RMS error, its worst element's error, twice the output dtype's
    largest value)."""
    tensors, consts = _args(got, ref, truth, alternates, work)
    n = got.numel()
    p = torch.tensor(params, dtype=torch.float64, device=got.device)
    out = torch.empty((blocks(n), 2), dtype=torch.float64, device=got.device)
    with _LAUNCH, torch.cuda.device(got.device) if got.is_cuda else nullcontext():
        _pass2_kernel[(blocks(n),)](*tensors, p, out, n, REF_FACTOR=ref_factor, TAIL_FACTOR=tail_factor,
                                    num_warps=4, enable_fp_fusion=False, **consts)
    return out

