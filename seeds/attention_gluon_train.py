"""Attention forward + backward on Hopper (sm_90) through the Gluon kernels: (q, k, v, do) -> (o, dq, dk, dv), the
fwd+bwd tasks' op, with the numerics picked from the inputs' range.

Two numerics, both held to the harness's bound (what an FA2-style bf16 backward
fails there):
- "bf16" (the `precise` path of seeds/attention_bwd.py): the forward's delta = sum_j P_ij dP_ij from its own dP
  (seeds/attention_gluon.py, do=), and dS entering the dK / dQ products as two bf16 operands (hi + lo):
  3 forward products and 9 backward ones (seeds/attention_gluon_bwd.py, split_ds=True).
- "fp16" (fp16 working copies): q, k, v and do copied to fp16, which holds every bf16 value of magnitude 2^-14 ..
  2^15 exactly (smaller ones to within 2^-25, its subnormals) and has 3 more mantissa bits, so P and dS rounded
  once to fp16 carry an eighth of bf16's error; dS enters one product (7 backward products). do is scaled by a
  power of two 2^e first, so that dS's worst case (|dS| <= |dP| + |delta| <= 2 D max|dO| max|V|) stays below
  fp16's 65504 with the most headroom; the gradients are scaled back by 2^-e in the kernels' epilogues (exact) and
  written as bf16 (q's dtype). delta comes from the forward's dP (delta="dp") or as rowsum(dO o O) from the
  forward's unrounded fp32 o in its epilogue (delta="o": the forward's 2 products alone).
  Taken only where it loses nothing: every input finite, within 2^15, and e >= 0 (fp16_exponent); else "bf16".
"auto" picks fp16 where fp16_exponent allows it, else bf16. The fp16 path's preparation (prep="fused", the
default with delta "o"): one Triton launch copies q, k, v to fp16 while it takes the four inputs' largest
magnitudes (_copy_amax_kernel, NaN counted as inf: each input read once), _exponent_kernel computes e from them on
the device, and the forward is launched before the host has e: its epilogue reads bf16 dO, writes dO's fp16 copy
times 2^e (read from device memory) and takes delta from it, and writes o as bf16. e reaches the host through
pinned memory behind an event, waited on only after the forward's launch; then the backward (2^-e an argument).
Where e is refused, the forward's results are dropped and the bf16 path runs. prep="two" / "split":
_copy_amax_kernel without the copies (or a launch a tensor), the host sync, _to_fp16_kernel (do times 2^e), o
copied from fp16 to bf16.
Measured on the H200 (B4 H32 S4096 D128; the fwd+bwd tasks accepted every variant
`crucible check` / `crucible bench` saw, except one build's causal dq, below): `crucible bench` fp16 + delta from o
with the fused preparation and the backward's dQ kernel by programmatic dependent launch (causal: programs grouped
by 4 heads) 8.478 ms = 453.9 TFLOP/s non-causal (0.856x cuDNN SDPA), 4.702-4.717 ms = 408-409 causal (0.859-0.864x,
docs/results.md); without pdl and grouping 8.536 / 4.884; the two-kernel preparation 8.874 / 5.148.
do_bench: 8.527 / 4.785 ms against 9.019 / 5.085 with prep="two"; the parts alone: fused preparation
with its host sync 0.42 / 0.36 ms (two: 0.60 / 0.54), forward 1.89 / 1.06, backward 6.48 / 3.52 (7 products: the
dQ kernel recomputes S and dP).
With the host reading e before the forward's launch the GPU sat idle 0.24-0.29 ms a call (profile_attention_prep.py --timeline).
A causal bench on the H200 rejected 2 of dq's 67M elements on a uniform draw (row 1: two keys, dS rounded once); the
dQ kernel's diagonal blocks now take dS as hi + lo (seeds/attention_gluon_bwd.py), accepted since.
Inputs: dense contiguous [B, H, S, D] bf16 q, k, v, do of one shape (no GQA), D 128, S a multiple of 128 (causal:
an even number of 128-row tiles); train_ok says whether a call fits, else the Triton kernels of
seeds/attention.py run (seeds/attention_bwd.py's ModelNew decides).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from seeds.attention_gluon import attention_fwd_gluon
from seeds.attention_gluon_bwd import attention_bwd_gluon

FP16_INPUT_MAX = 32768.0  # 2^15: every bf16 value up to it is an fp16 value
FP16_DS_MAX = 32768.0  # dS's worst case kept below this (fp16's largest finite value is 65504)
MAX_EXPONENT = 24
NUMERICS = ("auto", "bf16", "fp16")
DELTAS = ("dp", "o")
PREPS = ("fused", "two", "split")

# The forward's knobs with do= (delta) and the backward's, per mode: measured on the H200
# (sweep_attention_gluon_delta.py, sweep_attention_gluon_bwd.py, sweep_attention_train.py): the
# persistent forward 8.852 ms fwd+bwd against 9.062 not persistent (fp16, delta from o, non-causal). The backward's
# dQ kernel by programmatic dependent launch (pdl) and, causal, programs heaviest first across groups of 4 heads:
# `crucible bench` 8.478 ms against 8.534 and causal 4.702-4.717 against 4.820, interleaved in one call.
FWD_KNOBS = {False: dict(consumers=2, pingpong=False, persistent=True),
             True: dict(consumers=2, pingpong=True, persistent=True)}
BWD_KNOBS = {False: dict(dq_block_n=128, pdl=True), True: dict(dq_block_n=128, group_heads=4, pdl=True)}


def train_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, causal: bool) -> bool:
    """Whether attention_fwd_bwd_gluon takes these inputs: CUDA sm_90, dense contiguous bf16 [B, H, S, D] of one
    shape, D 128, S a multiple of 128 (causal: an even number of 128-row query tiles, the persistent forward's
    pairs)."""
    ts = (q, k, v, do)
    if not (q.is_cuda and q.dim() == 4 and all(t.shape == q.shape for t in ts) and q.shape[-1] == 128):
        return False
    if any(t.dtype != torch.bfloat16 or not t.is_contiguous() for t in ts) or q.numel() == 0:
        return False
    if torch.cuda.get_device_capability(q.device)[0] != 9 or q.shape[2] % 128:
        return False
    return not (causal and (q.shape[2] // 128) % 2)


def fp16_exponent_of(amax_q: float, amax_k: float, amax_v: float, amax_do: float, head_dim: int) -> int | None:
    """The power-of-two exponent e for do's fp16 copy (do * 2^e) from the inputs' largest magnitudes, or None when
    fp16 working copies could lose something: an input not finite or above 2^15, or dS's worst case 2 D max|dO|
    max|V| above 2^15 even at e = 0. e is the largest (at most 24) keeping both dS's worst case and do * 2^e
    within 2^15."""
    amax = (amax_q, amax_k, amax_v, amax_do)
    if not all(math.isfinite(a) for a in amax) or max(amax) > FP16_INPUT_MAX:
        return None
    if amax_do == 0.0:
        return 0
    e = math.floor(math.log2(FP16_INPUT_MAX / amax_do))
    if amax_v > 0.0:
        e = min(e, math.floor(math.log2(FP16_DS_MAX / (2.0 * head_dim * amax_do * amax_v))))
    e = min(e, MAX_EXPONENT)
    return e if e >= 0 else None


PREP_BLOCK = 4096  # elements a program of the two preparation kernels


@triton.jit
def _to_fp16_kernel(Q, K, V, DO, Q16, K16, V16, DO16, N, do_scale, BLOCK: tl.constexpr):
    """fp16 copies of q, k, v (exact: fp16_exponent_of checked their range) and of do * do_scale (a power of
    two), tensor w of the four on program axis 1."""
    w = tl.program_id(1)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    if w == 0:
        tl.store(Q16 + offs, tl.load(Q + offs, mask=mask).to(tl.float16), mask=mask)
    elif w == 1:
        tl.store(K16 + offs, tl.load(K + offs, mask=mask).to(tl.float16), mask=mask)
    elif w == 2:
        tl.store(V16 + offs, tl.load(V + offs, mask=mask).to(tl.float16), mask=mask)
    else:
        x = tl.load(DO + offs, mask=mask).to(tl.float32) * do_scale
        tl.store(DO16 + offs, x.to(tl.float16), mask=mask)


@triton.jit
def _amax_kernel(X, AMAX, N, BLOCK: tl.constexpr):
    """AMAX[0] = max(AMAX[0], max |x|) over one tensor of N elements, NaN as inf (split=True: a launch a tensor,
    no branch on the tensor's index)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    a = tl.abs(tl.load(X + offs, mask=offs < N, other=0.0).to(tl.float32))
    tl.atomic_max(AMAX, tl.max(tl.where(a == a, a, float("inf")), axis=0))


@triton.jit
def _copy_fp16_kernel(X, Y, N, scale, BLOCK: tl.constexpr):
    """Y = fp16(X * scale), scale a power of two (split=True: a launch a tensor)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    tl.store(Y + offs, (tl.load(X + offs, mask=mask).to(tl.float32) * scale).to(tl.float16), mask=mask)


SPLIT_BLOCK = 8192  # elements a program of the split preparation kernels


@triton.jit
def _copy_amax_kernel(Q, K, V, DO, Q16, K16, V16, AMAX, N, BLOCK: tl.constexpr, COPY: tl.constexpr):
    """AMAX[w] = max |x| over tensor w of (q, k, v, do) (program axis 1), N elements each, NaN counted as inf so
    that a NaN input reads as not finite (fp32 atomic max from zeros); COPY (prep="fused"): also q, k, v's fp16
    copies, each tensor read once (do's copy, scaled by 2^e, known only once AMAX is read, is made by the
    forward). A copy of a value past fp16's range is inf: AMAX flags it, and fp16_exponent_of refuses, before any
    copy is used. Without COPY (prep="two": input_amax) the copies' pointers are not touched."""
    w = tl.program_id(1)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    if w == 0:
        x = tl.load(Q + offs, mask=mask, other=0.0)
        if COPY:
            tl.store(Q16 + offs, x.to(tl.float16), mask=mask)
    elif w == 1:
        x = tl.load(K + offs, mask=mask, other=0.0)
        if COPY:
            tl.store(K16 + offs, x.to(tl.float16), mask=mask)
    elif w == 2:
        x = tl.load(V + offs, mask=mask, other=0.0)
        if COPY:
            tl.store(V16 + offs, x.to(tl.float16), mask=mask)
    else:
        x = tl.load(DO + offs, mask=mask, other=0.0)
    a = tl.abs(x.to(tl.float32))
    a = tl.where(a == a, a, float("inf"))
    tl.atomic_max(AMAX + w, tl.max(a, axis=0))


@triton.jit
def _ceil_log2(x):
    """ceil(log2(x)) of a positive finite fp32 x, exact, from its bits (zero and subnormals: -126)."""
    bits = x.to(tl.int32, bitcast=True)
    exp = ((bits >> 23) & 0xFF) - 127
    return tl.where(exp < -126, -126, exp + ((bits & 0x7FFFFF) != 0).to(tl.int32))


@triton.jit
def _exponent_kernel(AMAX, SCALE, EXP, head_dim, INPUT_MAX_LOG2: tl.constexpr, DS_MAX_LOG2: tl.constexpr,
                     MAX_E: tl.constexpr):
    """fp16_exponent_of on the device, one program: from AMAX [4] (q, k, v, do's largest magnitudes, NaN as inf)
    EXP = [e, 1] where fp16 working copies lose nothing (else [0, 0]) and SCALE = [2^e], for a kernel to read
    while the host has not yet seen e. Exact: with 2^15 limits, floor(log2(2^15 / x)) = 15 - ceil(log2 x), and
    2 D max|dO| max|V| is an exact fp32 product of bf16 values (tests: against fp16_exponent_of)."""
    aq = tl.load(AMAX)
    ak = tl.load(AMAX + 1)
    av = tl.load(AMAX + 2)
    ado = tl.load(AMAX + 3)
    limit = 2.0 ** INPUT_MAX_LOG2
    ok = (aq <= limit) & (ak <= limit) & (av <= limit) & (ado <= limit)
    e = tl.minimum(INPUT_MAX_LOG2 - _ceil_log2(ado), MAX_E)
    e = tl.where(av > 0.0, tl.minimum(e, DS_MAX_LOG2 - _ceil_log2(2.0 * head_dim * ado * av)), e)
    e = tl.where(ado > 0.0, e, 0)
    ok = ok & (e >= 0)
    e = tl.where(ok, e, 0)
    tl.store(EXP, e)
    tl.store(EXP + 1, ok.to(tl.int32))
    tl.store(SCALE, tl.exp2(e.to(tl.float32)))


def fused_prep(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor
               ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor]:
    """prep="fused", no host sync: ((q, k, v) as fp16, scale [2^e] fp32, exp [e, ok] int32), all on the inputs'
    device, in two launches (_copy_amax_kernel, _exponent_kernel). The copies may be used only where ok is 1."""
    copies = tuple(torch.empty(q.shape, dtype=torch.float16, device=q.device) for _ in range(3))
    amax = torch.zeros(4, dtype=torch.float32, device=q.device)
    scale = torch.empty(1, dtype=torch.float32, device=q.device)
    exp = torch.empty(2, dtype=torch.int32, device=q.device)
    n = q.numel()
    _copy_amax_kernel[(triton.cdiv(n, PREP_BLOCK), 4)](q, k, v, do, *copies, amax, n, BLOCK=PREP_BLOCK, COPY=True,
                                                       num_warps=8)
    _exponent_kernel[(1,)](amax, scale, exp, q.shape[-1], INPUT_MAX_LOG2=int(math.log2(FP16_INPUT_MAX)),
                           DS_MAX_LOG2=int(math.log2(FP16_DS_MAX)), MAX_E=MAX_EXPONENT)
    return copies, scale, exp


def fused_copies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor
                 ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], int | None]:
    """fused_prep with the host sync: ((q, k, v) as fp16, e), e None where the copies must not be used."""
    copies, _, exp = fused_prep(q, k, v, do)
    e, ok = exp.tolist()
    return copies, e if ok else None


def input_amax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, split: bool = False
               ) -> list[float]:
    """[max |q|, max |k|, max |v|, max |do|] (inf where a NaN is) of four contiguous tensors of one size, one
    launch (split: one a tensor); reading them back is the host sync."""
    amax = torch.zeros(4, dtype=torch.float32, device=q.device)
    n = q.numel()
    if split:
        for i, t in enumerate((q, k, v, do)):
            _amax_kernel[(triton.cdiv(n, SPLIT_BLOCK),)](t, amax[i:], n, BLOCK=SPLIT_BLOCK, num_warps=8)
    else:
        _copy_amax_kernel[(triton.cdiv(n, PREP_BLOCK), 4)](q, k, v, do, q, k, v, amax, n, BLOCK=PREP_BLOCK,
                                                           COPY=False, num_warps=8)
    return amax.tolist()


def fp16_exponent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, split: bool = False
                  ) -> int | None:
    """fp16_exponent_of the inputs' largest magnitudes (input_amax)."""
    return fp16_exponent_of(*input_amax(q, k, v, do, split), head_dim=q.shape[-1])


def fp16_copies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, e: int, split: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v, do * 2^e) as fp16, one launch (split: one a tensor; e from fp16_exponent: every value fits)."""
    outs = tuple(torch.empty(q.shape, dtype=torch.float16, device=q.device) for _ in range(4))
    n = q.numel()
    if split:
        for t, o, c in zip((q, k, v, do), outs, (1.0, 1.0, 1.0, float(2 ** e))):
            _copy_fp16_kernel[(triton.cdiv(n, SPLIT_BLOCK),)](t, o, n, c, BLOCK=SPLIT_BLOCK, num_warps=8)
    else:
        _to_fp16_kernel[(triton.cdiv(n, PREP_BLOCK), 4)](q, k, v, do, *outs, n, float(2 ** e), BLOCK=PREP_BLOCK,
                                                          num_warps=8)
    return outs


def _fused_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, causal: bool, fwd: dict
                   ) -> tuple:
    """prep="fused" and the forward, one host wait: fused_prep, e copied to pinned host memory behind an event,
    the forward launched (do's copy scaled by the device's 2^e, o in q's dtype where persistent), then the wait
    for e alone (the GPU is running the forward meanwhile). (q16, k16, v16, do16, o, lse2, delta, e); e None
    where the copies must not be used (the forward's results are then garbage, and dropped)."""
    (q16, k16, v16), scale, exp = fused_prep(q, k, v, do)
    host = torch.empty(2, dtype=torch.int32, pin_memory=True)
    host.copy_(exp, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    do16 = torch.empty(q.shape, dtype=torch.float16, device=q.device)
    o_dtype = q.dtype if fwd.get("persistent") else torch.float16
    o, lse2, dlt = attention_fwd_gluon(q16, k16, v16, causal, do=do, delta_from="o", o_dtype=o_dtype, do16_out=do16,
                                       do_scale=scale, **fwd)
    ready.synchronize()
    e, ok = host.tolist()
    return q16, k16, v16, do16, o.to(q.dtype), lse2, dlt, e if ok else None


def attention_fwd_bwd_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                            causal: bool = False, numerics: str = "auto", delta: str = "dp",
                            fwd_knobs: dict | None = None, bwd_knobs: dict | None = None, prep: str | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o, dq, dk, dv), each like q, of o = softmax(q k^T / sqrt(D)) v and its gradients for the upstream do.
    numerics: "auto" | "bf16" | "fp16" (the module docstring; "fp16" raises ValueError where fp16_exponent
    refuses). delta: "dp" | "o" (attention_fwd_gluon's delta_from; fp16 only: bf16 always takes the forward's
    dP). fwd_knobs / bwd_knobs: the Gluon kernels' knobs (FWD_KNOBS / BWD_KNOBS of the mode by default; bwd's
    dq_ordered applies to the fp16 path). prep: the fp16 path's preparation, one of PREPS: "fused" (q, k, v
    copied while the four largest magnitudes are taken, one launch; do's copy made by the forward: delta "o"
    only), "two" (input_amax, then fp16_copies: each input read twice), "split" ("two" as a launch a tensor);
    None: "fused" with delta "o", else "two". ValueError where train_ok refuses."""
    prep = ("fused" if delta == "o" else "two") if prep is None else prep
    if numerics not in NUMERICS or delta not in DELTAS or prep not in PREPS or (prep == "fused" and delta != "o"):
        raise ValueError(f"attention_fwd_bwd_gluon: numerics is one of {NUMERICS}, delta one of {DELTAS} and prep "
                         f"one of {PREPS} ('fused' with delta 'o'), not {numerics!r}, {delta!r}, {prep!r}")
    if not train_ok(q, k, v, do, causal):
        raise ValueError("attention_fwd_bwd_gluon: takes dense contiguous bf16 [B, H, S, 128] q, k, v, do of one "
                         "shape on sm_90, S a multiple of 128 (causal: 256)")
    fwd = FWD_KNOBS[bool(causal)] if fwd_knobs is None else fwd_knobs
    bwd = BWD_KNOBS[bool(causal)] if bwd_knobs is None else bwd_knobs
    e = fused = None
    if numerics != "bf16" and prep == "fused":  # the forward is launched before the host reads e (the
        fused = _fused_forward(q, k, v, do, causal, fwd)  # launch after the sync left the GPU idle 0.24-0.29 ms)
        e = fused[-1]
    elif numerics != "bf16":
        e = fp16_exponent(q, k, v, do, prep == "split")
    if numerics == "fp16" and e is None:
        raise ValueError("attention_fwd_bwd_gluon: these inputs do not fit fp16 working copies (fp16_exponent)")
    if e is None:
        o, lse2, dlt = attention_fwd_gluon(q, k, v, causal, do=do, **fwd)
        split_bwd = {key: val for key, val in bwd.items() if key != "dq_ordered"}  # dq_ordered: dS once only
        dq, dk, dv = attention_bwd_gluon(do, q, k, v, lse2, dlt, causal, split_ds=True, **split_bwd)
        return o, dq, dk, dv
    if fused is not None:
        q16, k16, v16, do16, o, lse2, dlt, _ = fused
    else:
        q16, k16, v16, do16 = fp16_copies(q, k, v, do, e, prep == "split")
        o16, lse2, dlt = attention_fwd_gluon(q16, k16, v16, causal, do=do16, delta_from=delta, **fwd)
        o = o16.to(q.dtype)
    dq, dk, dv = attention_bwd_gluon(do16, q16, k16, v16, lse2, dlt, causal, split_ds=False, out_dtype=q.dtype,
                                     grad_scale=float(2.0 ** -e), **bwd)
    return o, dq, dk, dv
