"""Fused AdamW step: fp32 master weights and moments updated in one pass, a bf16 copy of the weights written out.

Per parameter, with g the gradient (fp32, or bf16/fp16), t the step (a 0-d tensor read on the device, so the step
never synchronises with the host):
    p <- p (1 - lr wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps);  p16 <- bf16(p)
which is torch.optim.AdamW's update (decoupled weight decay, no amsgrad).
Bytes per parameter: read p, g, m, v (16 B with fp32 g) and write p, m, v, p16 (14 B): 30 B, 28 with bf16 grads.
torch's fused=True moves 28 B/param with fp32 grads and writes no bf16 copy.

Three forms, the same per-element code (bitwise the same outputs):
- multi-tensor with a device table (`table="pageable"`, or `"pinned"`): ONE launch over all
  tensors. A small int64 table on the device holds, per tensor, its first chunk (a prefix sum), its size and the element offset of each of its eight arrays from the lowest-addressed array
  of the same role (so the kernel needs eight base pointers and no pointer casts). A program binary-searches the
  prefix sums for its chunk's tensor, then streams ITERS blocks of BLOCK elements; a persistent grid (`programs=`)
  walks chunks with a stride instead. `plan_adamw` builds the table once for tensors that stay put (a trainer);
  `adamw_step` builds it per call (one small host-to-device copy: from pageable memory, the measured path, or from
  pinned memory, unmeasured). The per-call host path ("lean", the default):
  the checks are whole-list comparisons, the table is one Python list of sizes and address offsets (one gcd per
  role gives the alignment) turned into one tensor, and new outputs of a dtype are carved out of ONE allocation by
  ONE split (a view only for a shape that is not 1-D): 5 torch ops whatever the number of 1-D tensors (the task's
  4; 64 of 2,048: 5), against 37 and 517 on the first path ("loops",
  kept as `host="loops"`: per-tensor slices and views). The harness hands new addresses every call, so nothing
  is cached across calls.
- multi-tensor with the tensors as launch arguments (`table="args"`, or `"auto"`: args up to 8 non-empty
  tensors, the default): ONE launch, every tensor's eight pointers and its size passed as tuple arguments, no table
  and so no host-to-device copy; 4 torch ops a call (the outputs' two allocations and two splits). A program
  compares its chunk with the tensors' first chunks (unrolled: one copy of the chunk code per tensor).
  Why by count: a copy from pageable memory makes the host wait for all work queued before the call, and the
  device then waits for the launch: under crucible's timer (0.5 ms of flush queued ahead of each call) the task
  read 0.570 ms against torch.compile's 0.175, against 0.317 under do_bench. Arguments cost host time on
  every launch instead (10 per tensor, each specialised by Triton's launcher) and code size (a chunk body per
  tensor), so beyond 8 tensors the table stays: 1B params in 64 tensors is the measured 7.13 ms, 1.13x fused=True.
  On the H200 (bench_adamw.py, the task's shape): 0.203 ms back to back against the pageable table's 0.329.
- per-tensor (`multi_tensor=False`): one launch per tensor, on the lean host path (no table either) or the first.
Bias corrections are computed once per program in fp64 from the step (1 - b^t in fp32 loses digits at small t);
per element: fp32, sqrt(v) times 1/sqrt(1 - b2^t), one fast division (div.full, 2 ulp).

Why the first seed reached only 65% of the copy bandwidth (10.8 ms at 1B params in 64 tensors of 15,625,000): every
load and store was masked by `offs < n`, and n is not a multiple of 16, so Triton could not prove a mask constant
over a 16-byte vector and emitted 4-byte accesses (PTX: 33 scalar ld.global, no v4; at n a multiple of 16, v4
loads). Here only a tensor's last, partial chunk is masked; full chunks load and store unmasked, 16-byte vectors
(the offsets are multiples of 16 elements when the arrays are 64-byte aligned, which the table records as ALIGN).
And one register layout: left to itself, Triton gives the loads and the bf16 store 8 elements per thread at
1024/4 warps but caps the fp32 stores at 4 (128 bits), converting p, m, v through shared memory before each store;
`tl.max_contiguous(offs, VEC=4)` keeps every access at 4 per thread (repeated), so nothing goes through shared
memory (tests/test_seed_adamw.py compiles both for sm_90 and checks the PTX).

Measured on the H200 (torch 2.11, triton 3.6; benchmarks/bench_adamw.py, docs/bench-adamw.md), 1B fp32
params in 64 tensors of 15,625,000, in place, fp32 grads, 30 B/param; every variant checked against float64:
- default, 1024 elements / 4 warps / 1 block per chunk (8 per thread): 7.134 ms = 4,205 GB/s, 99% of the 4,212 GB/s
  copy of the same run, 1.13x torch AdamW(fused=True) (8.051 ms, 28 B/param, no bf16 copy). The previous default
  (4 blocks per chunk) took 7.685 ms (1.05x); 512/4w x8 and 4096/8w x1 7.31 ms; persistent grids 7.59-7.60 ms.
- Llama-1B-like mix (146 tensors), previous default: 9.518 ms vs fused=True 10.002 ms (1.05x).
- The task's own shape (22.5M params, new outputs, previous default): 0.259 ms vs torch.compile(Model) 0.174 ms
  (0.67x, slower) and eager 0.848 ms. At this size the per-call host work (checks, three flat output allocations,
  building the table and copying it to the device) and the launch are a large share of 0.26 ms; compile's one
  fused kernel has none of it. A plan built once (plan_adamw / run_plan) removes the host part where the tensors
  stay put; the task's forward gets new tensors every call, so it cannot. `crucible bench` (its own timer) gave
  0.38x torch.compile, host-bound in 29 of 30 calls. The lean host path (default since) halves the host work: on
  the H200 the plan takes 206 us of host time against 476 for host="loops", a whole
  call 309 against 597 us, and back to back 0.309 ms per call against torch.compile's 0.270: do_bench 0.317 ms
  against compile's 0.300, 0.95x (the first path: 0.46x). `crucible bench` reads 0.570 ms against
  compile's 0.175, 0.33x: its timer queues 0.5 ms of flush passes ahead of each call, and the table's copy from
  pageable memory waits for them, after which the device waits for the host's launch (see plan_adamw). (Those
  were the lean pageable table, `table="pageable"`; the task's default is now the launch-argument form.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

CRUCIBLE_SEED = {"name": "adamw", "tasks": ["adamw.py"], "ops": ["AdamW step (fp32 master, bf16 copy)"]}

MAX_ALIGN = 16  # elements: offsets that are multiples of this keep every array's accesses 16-byte vectors


@triton.jit
def _bias_terms(STEP, lr, ln_beta1, ln_beta2):
    """lr / (1 - b1^t) and 1 / sqrt(1 - b2^t), in fp64 once per program (b^t = exp(t ln b); ln b comes from the host
    in double, rounded to fp32: at t = 1 and b2 = 0.999 an fp32 1 - b2^t would be off by ~1e-4 relative)."""
    step = tl.load(STEP).to(tl.float64)
    bias1 = 1.0 - tl.exp(step * ln_beta1)  # fp64: the fp32 arguments are promoted
    bias2 = 1.0 - tl.exp(step * ln_beta2)
    step_size = (lr / bias1).to(tl.float32)
    inv_sqrt_bias2 = (1.0 / tl.sqrt(bias2)).to(tl.float32)
    return step_size, inv_sqrt_bias2


@triton.jit
def _find_tensor(TABLE, c, n_tensors, search_steps):
    """The tensor of chunk c: the largest t with TABLE[t] <= c, TABLE's first row being each tensor's first chunk
    (a prefix sum, TABLE[n_tensors] = the number of chunks); search_steps = ceil(log2(n_tensors))."""
    lo = 0
    hi = n_tensors
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        right = tl.load(TABLE + mid) <= c
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    return lo


@triton.jit
def _table_arrays(row, stride, P, G, M, V, P_OUT, M_OUT, V_OUT, ALIGN: tl.constexpr):
    """A tensor's seven arrays from its table row (rows 2-8: each array's offset from its role's base, stored divided
    by ALIGN, so the multiply shows Triton their divisibility: 16-byte vectors)."""
    return (P + tl.load(row + 2 * stride) * ALIGN, G + tl.load(row + 3 * stride) * ALIGN,
            M + tl.load(row + 4 * stride) * ALIGN, V + tl.load(row + 5 * stride) * ALIGN,
            P_OUT + tl.load(row + 6 * stride) * ALIGN, M_OUT + tl.load(row + 7 * stride) * ALIGN,
            V_OUT + tl.load(row + 8 * stride) * ALIGN)


@triton.jit
def _adamw_chunk(
    P, G, M, V, P_OUT, M_OUT, V_OUT, P16,   # one tensor's arrays (outputs may alias inputs: each element is read first)
    start, numel,                           # first element of the chunk, elements in the tensor
    decay, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, step_size, inv_sqrt_bias2,
    BLOCK: tl.constexpr, ITERS: tl.constexpr,
    VEC: tl.constexpr,                      # elements per contiguous run of a thread (4: one 16-byte fp32 vector)
    MASKED: tl.constexpr,                   # False: the whole chunk lies inside the tensor (unmasked 16-byte vectors)
    STREAMING: tl.constexpr,                # evict-first loads, streaming stores: nothing here is read again soon
):
    for i in tl.static_range(ITERS):
        offs = tl.max_contiguous(start + i * BLOCK + tl.arange(0, BLOCK), VEC)
        if MASKED:
            mask = offs < numel
            p = tl.load(P + offs, mask=mask, other=0.0)
            g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
            m = tl.load(M + offs, mask=mask, other=0.0)
            v = tl.load(V + offs, mask=mask, other=0.0)
        elif STREAMING:
            p = tl.load(P + offs, eviction_policy="evict_first")
            g = tl.load(G + offs, eviction_policy="evict_first").to(tl.float32)
            m = tl.load(M + offs, eviction_policy="evict_first")
            v = tl.load(V + offs, eviction_policy="evict_first")
        else:
            p = tl.load(P + offs)
            g = tl.load(G + offs).to(tl.float32)
            m = tl.load(M + offs)
            v = tl.load(V + offs)
        p = p * decay
        m = beta1 * m + one_minus_beta1 * g
        v = beta2 * v + one_minus_beta2 * (g * g)
        p = p - step_size * (m / (tl.sqrt(v) * inv_sqrt_bias2 + eps))
        p16 = p.to(P16.dtype.element_ty)
        if MASKED:
            tl.store(P_OUT + offs, p, mask=mask)
            tl.store(M_OUT + offs, m, mask=mask)
            tl.store(V_OUT + offs, v, mask=mask)
            tl.store(P16 + offs, p16, mask=mask)
        elif STREAMING:
            tl.store(P_OUT + offs, p, cache_modifier=".cs")
            tl.store(M_OUT + offs, m, cache_modifier=".cs")
            tl.store(V_OUT + offs, v, cache_modifier=".cs")
            tl.store(P16 + offs, p16, cache_modifier=".cs")
        else:
            tl.store(P_OUT + offs, p)
            tl.store(M_OUT + offs, m)
            tl.store(V_OUT + offs, v)
            tl.store(P16 + offs, p16)


@triton.jit
def _adamw_span(P, G, M, V, P_OUT, M_OUT, V_OUT, P16, start, numel, decay, beta1, beta2, one_minus_beta1,
                one_minus_beta2, eps, step_size, inv_sqrt_bias2, BLOCK: tl.constexpr, ITERS: tl.constexpr,
                VEC: tl.constexpr, SPLIT_TAIL: tl.constexpr, STREAMING: tl.constexpr):
    """One chunk from `start`: unmasked (16-byte vectors) when SPLIT_TAIL and the chunk lies wholly inside the
    tensor, masked otherwise."""
    if SPLIT_TAIL:
        if start + BLOCK * ITERS <= numel:
            _adamw_chunk(P, G, M, V, P_OUT, M_OUT, V_OUT, P16, start, numel, decay, beta1, beta2, one_minus_beta1,
                         one_minus_beta2, eps, step_size, inv_sqrt_bias2, BLOCK, ITERS, VEC, False, STREAMING)
        else:
            _adamw_chunk(P, G, M, V, P_OUT, M_OUT, V_OUT, P16, start, numel, decay, beta1, beta2, one_minus_beta1,
                         one_minus_beta2, eps, step_size, inv_sqrt_bias2, BLOCK, ITERS, VEC, True, STREAMING)
    else:
        _adamw_chunk(P, G, M, V, P_OUT, M_OUT, V_OUT, P16, start, numel, decay, beta1, beta2, one_minus_beta1,
                     one_minus_beta2, eps, step_size, inv_sqrt_bias2, BLOCK, ITERS, VEC, True, STREAMING)


@triton.jit(do_not_specialize=["n_tensors", "n_chunks", "search_steps"])  # one compile for any list of tensors
def _adamw_multi_kernel(
    P, G, M, V, P_OUT, M_OUT, V_OUT, P16,   # the lowest-addressed array of each role; the table offsets are from these
    STEP,                                   # 0-d tensor: the step number after this update (1 on the first step)
    TABLE,                                  # int64 [10, n_tensors + 1]: first chunk (prefix sum), size, 8 offsets
    n_tensors, n_chunks,
    search_steps,                           # ceil(log2(n_tensors)): binary-search steps over the prefix sums
    lr, decay, beta1, beta2, one_minus_beta1, one_minus_beta2, ln_beta1, ln_beta2, eps,
    ALIGN: tl.constexpr,                    # every offset in the table is a multiple of this (tells Triton so)
    BLOCK: tl.constexpr, ITERS: tl.constexpr, VEC: tl.constexpr,
    PERSISTENT: tl.constexpr,               # programs walk chunks pid, pid + grid, ...; else one chunk per program
    SPLIT_TAIL: tl.constexpr,               # unmasked full chunks; False masks every chunk (the first seed's form)
    STREAMING: tl.constexpr,
):
    CHUNK: tl.constexpr = BLOCK * ITERS
    step_size, inv_sqrt_bias2 = _bias_terms(STEP, lr, ln_beta1, ln_beta2)
    stride = n_tensors + 1
    pid = tl.program_id(0)
    last = pid + 1
    if PERSISTENT:
        last = n_chunks
    for c in tl.range(pid, last, tl.num_programs(0)):
        row = TABLE + _find_tensor(TABLE, c, n_tensors, search_steps)
        start = (c - tl.load(row)).to(tl.int64) * CHUNK
        numel = tl.load(row + stride)
        p_, g_, m_, v_, po, mo, vo = _table_arrays(row, stride, P, G, M, V, P_OUT, M_OUT, V_OUT, ALIGN)
        p16 = P16 + tl.load(row + 9 * stride) * ALIGN
        _adamw_span(p_, g_, m_, v_, po, mo, vo, p16, start, numel, decay, beta1, beta2, one_minus_beta1,
                    one_minus_beta2, eps, step_size, inv_sqrt_bias2, BLOCK, ITERS, VEC, SPLIT_TAIL, STREAMING)


@triton.jit(do_not_specialize=["numel"])
def _adamw_tensor_kernel(
    P, G, M, V, P_OUT, M_OUT, V_OUT, P16, STEP, numel,
    lr, decay, beta1, beta2, one_minus_beta1, one_minus_beta2, ln_beta1, ln_beta2, eps,
    BLOCK: tl.constexpr, ITERS: tl.constexpr, VEC: tl.constexpr, SPLIT_TAIL: tl.constexpr, STREAMING: tl.constexpr,
):
    CHUNK: tl.constexpr = BLOCK * ITERS
    step_size, inv_sqrt_bias2 = _bias_terms(STEP, lr, ln_beta1, ln_beta2)
    start = tl.program_id(0).to(tl.int64) * CHUNK
    _adamw_span(P, G, M, V, P_OUT, M_OUT, V_OUT, P16, start, numel, decay, beta1, beta2, one_minus_beta1,
                one_minus_beta2, eps, step_size, inv_sqrt_bias2, BLOCK, ITERS, VEC, SPLIT_TAIL, STREAMING)



@triton.jit
def _adamw_args_kernel(
    P, G, M, V, P_OUT, M_OUT, V_OUT, P16,   # tuples of N_TENSORS pointers, one per tensor: no table on the device
    STEP,
    FIRST,                                  # tuple of N_TENSORS + 1 ints: each tensor's first chunk, then the total
    NUMEL,                                  # tuple of N_TENSORS ints: elements per tensor
    lr, decay, beta1, beta2, one_minus_beta1, one_minus_beta2, ln_beta1, ln_beta2, eps,
    N_TENSORS: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr, VEC: tl.constexpr,
    SPLIT_TAIL: tl.constexpr, STREAMING: tl.constexpr,
):
    """One launch over a few tensors whose pointers and sizes are plain launch arguments (the launcher specialises
    each pointer on 16-byte alignment, as for the per-tensor kernel, so no ALIGN is needed). A program finds its
    tensor by comparing its chunk with the first chunks; the comparison is unrolled over the tensors, one copy of
    the chunk code per tensor."""
    CHUNK: tl.constexpr = BLOCK * ITERS
    step_size, inv_sqrt_bias2 = _bias_terms(STEP, lr, ln_beta1, ln_beta2)
    c = tl.program_id(0)
    for t in tl.static_range(N_TENSORS):
        if (c >= FIRST[t]) & (c < FIRST[t + 1]):
            start = (c - FIRST[t]).to(tl.int64) * CHUNK
            _adamw_span(P[t], G[t], M[t], V[t], P_OUT[t], M_OUT[t], V_OUT[t], P16[t], start, NUMEL[t], decay, beta1,
                        beta2, one_minus_beta1, one_minus_beta2, eps, step_size, inv_sqrt_bias2, BLOCK, ITERS, VEC,
                        SPLIT_TAIL, STREAMING)

# ---- launchers ------------------------------------------------------------------------------------------------------

def _settings(total: int, block: int | None, num_warps: int | None, iters: int | None) -> tuple[int, int, int]:
    """BLOCK, warps, ITERS: 1024 elements at 4 warps (two 16-byte vectors per thread and fp32 array), one block per
    chunk (the H200's fastest: 99% of copy, docs/bench-adamw.md); smaller blocks (where not given) for small steps,
    so that ~1,000 chunks still spread over the SMs. Given iters are kept as they are."""
    b, it = block or 1024, iters or 1
    while block is None and b > 256 and -(-total // (b * it)) < 1024:
        b //= 2
    return b, num_warps or max(1, min(4, b // 128)), it  # at least 4 elements (one vector) per thread


def _hyper(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> dict:
    beta1, beta2 = betas
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
        raise ValueError(f"adamw_step: betas must lie in [0, 1), got {betas}")
    ln_beta1, ln_beta2 = (math.log(b) if b > 0 else -math.inf for b in betas)  # b = 0: b^t = exp(-inf) = 0
    return dict(lr=float(lr), decay=1.0 - lr * weight_decay, beta1=float(beta1), beta2=float(beta2),
                one_minus_beta1=1.0 - beta1, one_minus_beta2=1.0 - beta2, ln_beta1=ln_beta1, ln_beta2=ln_beta2,
                eps=float(eps))


def _state(params, grads, exp_avgs, exp_avg_sqs, inplace: bool):
    """The four lists, checked; contiguous (copies of the inputs that are not updated in place, where needed)."""
    params, grads, exp_avgs, exp_avg_sqs = list(params), list(grads), list(exp_avgs), list(exp_avg_sqs)
    n = len(params)
    if not (len(grads) == len(exp_avgs) == len(exp_avg_sqs) == n):
        raise ValueError(f"adamw_step: {n} params but {len(grads)} grads, {len(exp_avgs)} exp_avgs and "
                         f"{len(exp_avg_sqs)} exp_avg_sqs")
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        if p.dtype != torch.float32 or m.dtype != torch.float32 or v.dtype != torch.float32:
            raise ValueError(f"adamw_step: params and moments must be float32 (master weights), got {p.dtype}, "
                             f"{m.dtype}, {v.dtype}")
        if not (p.shape == g.shape == m.shape == v.shape) or not g.is_floating_point():
            raise ValueError(f"adamw_step: a param {tuple(p.shape)} needs a float grad and moments of its shape, "
                             f"got {tuple(g.shape)}, {tuple(m.shape)}, {tuple(v.shape)}")
        if not (p.device == g.device == m.device == v.device == params[0].device):
            raise ValueError("adamw_step: all params, grads and moments must be on one device")
        if inplace and not (p.is_contiguous() and m.is_contiguous() and v.is_contiguous()):
            raise ValueError("adamw_step: in-place updates need contiguous params and moments")
        if g.dtype != grads[0].dtype:
            raise ValueError(f"adamw_step: all grads must share one dtype, got {grads[0].dtype} and {g.dtype}")
    return tuple([t.contiguous() for t in lst] for lst in (params, grads, exp_avgs, exp_avg_sqs))


def _flat_outputs(like: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """One allocation for a whole list of outputs, each a view starting on a multiple of MAX_ALIGN elements."""
    sizes = [triton.cdiv(t.numel(), MAX_ALIGN) * MAX_ALIGN for t in like]
    flat = torch.empty(max(1, sum(sizes)), dtype=dtype, device=like[0].device)
    outs, at = [], 0
    for t, size in zip(like, sizes):
        outs.append(flat[at:at + t.numel()].view(t.shape))
        at += size
    return outs


def _step_tensor(step, device: torch.device) -> torch.Tensor:
    if isinstance(step, torch.Tensor):
        if step.numel() != 1:
            raise ValueError(f"adamw_step: step must be a one-element tensor, got shape {tuple(step.shape)}")
        return step if step.device == device else step.to(device)
    return torch.full((), float(step), dtype=torch.float32, device=device)


@dataclass(frozen=True)
class AdamWPlan:
    """A multi-tensor launch: its arrays, outputs and, for the table forms, the device table. Valid while the
    tensors stay where they are."""
    arrays: tuple[list[torch.Tensor], ...]  # p, g, m, v, p_out, m_out, v_out, p16 (the non-empty tensors)
    outputs: tuple[list[torch.Tensor], ...]  # params, exp_avgs, exp_avg_sqs, low-precision params (all tensors)
    bases: tuple[torch.Tensor, ...]          # the lowest-addressed tensor of each role (table forms)
    table: torch.Tensor | None               # None for the "args" form
    n_chunks: int
    align: int
    block: int
    num_warps: int
    iters: int
    vec: int
    programs: int | None
    split_tail: bool
    streaming: bool
    form: str = "pageable"                   # "args", "pageable" or "pinned" (see TABLES)
    firsts: tuple[int, ...] = ()             # "args": each tensor's first chunk, then the total
    numels: tuple[int, ...] = ()             # "args": each tensor's size


HOSTS = ("lean", "loops")  # how the per-call table and outputs are built (the kernel is the same)
# How the multi-tensor launch learns where the tensors are: "args" passes every tensor's pointers and size as launch
# arguments (no table, no host-to-device copy; at most ARGS_MAX_TENSORS tensors); "pageable" builds an int64 table
# on the host and copies it to the device from pageable memory (the measured path: 7.13 ms at 1B params in 64
# tensors, 1.13x torch fused=True); "pinned" builds it in pinned host memory, so the copy is queued instead of
# waiting for the stream's earlier work (not measured yet). "auto": "args" up to ARGS_MAX_TENSORS non-empty tensors
# (with the lean host path and no persistent grid), else "pageable": the default since it was measured on the
# H200 (bench_adamw.py, the task's shape, checked against float64): 0.203 ms back to back against the pageable
# table's 0.329, 0.170 ms under crucible's timer imitated against 0.172, 214 against 275 us of host time a call.
TABLES = ("auto", "args", "pageable", "pinned")
# Why 8: a pageable copy makes the host wait for every kernel queued before the call (0.57 ms a call under
# crucible's timer at the task's 4 tensors, against 0.32 under do_bench), and a table is worth its copy only where
# the launch would otherwise carry too many arguments: each tensor adds 10 (8 pointers, a size, a first chunk),
# whose specialisation the launcher checks on every call, and one copy of the chunk code to the kernel. 8 tensors
# (~90 arguments) stays a small launch; the 64-tensor and 146-tensor configurations keep the measured table.
ARGS_MAX_TENSORS = 8


def plan_adamw(params, grads, exp_avgs, exp_avg_sqs, *, inplace: bool = True, out16: list | None = None,
               low_precision_dtype: torch.dtype = torch.bfloat16, block: int | None = None,
               num_warps: int | None = None, iters: int | None = None, vec: int = 4, programs: int | None = None,
               split_tail: bool = True, streaming: bool = False, host: str = "lean",
               table: str = "auto") -> AdamWPlan:
    """Check the state, allocate the outputs (new tensors unless inplace; the low-precision copy into out16 when
    given) and say where the tensors are: launch arguments or a device table (`table`, see TABLES).
    programs: a persistent grid of that many programs (None: one per chunk; table forms only).
    host: "lean" (default) builds the table from one list of addresses and carves all outputs of a dtype out of one
    allocation with one split; "loops" is the first form (per-tensor slices, views and checks; measured 0.38x
    torch.compile on the task's 22.5M params, where the host work decides; table forms only)."""
    if host not in HOSTS:
        raise ValueError(f"adamw_step: host must be one of {', '.join(HOSTS)}, got {host!r}")
    if table not in TABLES:
        raise ValueError(f"adamw_step: table must be one of {', '.join(TABLES)}, got {table!r}")
    if table == "args" and (host != "lean" or programs is not None):
        raise ValueError("adamw_step: table='args' needs host='lean' and no persistent grid (programs=None)")
    knobs = dict(block=block, num_warps=num_warps, iters=iters, vec=vec, programs=programs, split_tail=split_tail,
                 streaming=streaming)
    if host == "loops":
        return _loops_plan(params, grads, exp_avgs, exp_avg_sqs, inplace, out16, low_precision_dtype, knobs,
                           "pageable" if table == "auto" else table)
    lean = _lean_outputs(params, grads, exp_avgs, exp_avg_sqs, inplace, out16, low_precision_dtype)
    if table == "auto":
        table = "args" if programs is None and len(lean.keep) <= ARGS_MAX_TENSORS else "pageable"
    if table == "args":
        return _args_plan(lean, knobs)
    return _lean_plan(lean, knobs, table)


def _make_plan(arrays, outputs, bases, rows: list, n_chunks: int, align: int, settings, knobs: dict,
               device, form: str) -> AdamWPlan:
    blk, warps, it = settings
    # From pageable memory CUDA first waits for the stream's earlier work, so the host stalls and the device then
    # waits for the launch (0.57 ms a call under crucible's timer, against do_bench's 0.32). From pinned
    # memory the copy is queued and the host goes on ("pinned": not measured on the GPU yet, so not the default).
    pin = form == "pinned" and device.type == "cuda"
    table = torch.tensor(rows, dtype=torch.int64, pin_memory=pin).to(device, non_blocking=True)
    return AdamWPlan(arrays, outputs, bases, table, n_chunks, align, blk, warps, it, knobs["vec"], knobs["programs"],
                     knobs["split_tail"], knobs["streaming"], form)


def _lean_check(params, grads, exp_avgs, exp_avg_sqs, inplace: bool):
    """_state's checks with whole-list comparisons; .contiguous() only on the tensors that are not."""
    n = len(params)
    if not (len(grads) == len(exp_avgs) == len(exp_avg_sqs) == n):
        raise ValueError(f"adamw_step: {n} params but {len(grads)} grads, {len(exp_avgs)} exp_avgs and "
                         f"{len(exp_avg_sqs)} exp_avg_sqs")
    if not n:
        raise ValueError("adamw_step: no parameters")
    states = params + exp_avgs + exp_avg_sqs
    if {t.dtype for t in states} != {torch.float32}:
        bad = [t.dtype for t in states if t.dtype != torch.float32][0]
        raise ValueError(f"adamw_step: params and moments must be float32 (master weights), got {bad}")
    shapes = [p.shape for p in params]
    if shapes != [g.shape for g in grads] or shapes != [m.shape for m in exp_avgs] or \
            shapes != [v.shape for v in exp_avg_sqs] or not grads[0].is_floating_point():
        raise ValueError("adamw_step: every param needs a float grad and moments of its shape")
    grad_dtypes = {g.dtype for g in grads}
    if len(grad_dtypes) > 1:
        raise ValueError(f"adamw_step: all grads must share one dtype, got {', '.join(map(str, grad_dtypes))}")
    if len({t.device for t in states + grads}) > 1:
        raise ValueError("adamw_step: all params, grads and moments must be on one device")
    lists = [params, grads, exp_avgs, exp_avg_sqs]
    if False in [t.is_contiguous() for t in states + grads]:
        if inplace and False in [t.is_contiguous() for t in states]:
            raise ValueError("adamw_step: in-place updates need contiguous params and moments")
        lists = [[t if t.is_contiguous() else t.contiguous() for t in lst] for lst in lists]
    return lists, shapes, params[0].device


def _offsets(role: list[torch.Tensor]) -> tuple[torch.Tensor, list[int], int]:
    """The lowest-addressed tensor of a role, each tensor's element offset from it, and the largest power of two
    up to MAX_ALIGN dividing them all (one gcd over the byte offsets)."""
    ptrs = [t.data_ptr() for t in role]
    low = min(ptrs)
    base = role[ptrs.index(low)]
    size = base.element_size()
    byte_offs = [q - low for q in ptrs]
    common = math.gcd(*byte_offs)
    if common % size:
        raise ValueError("adamw_step: an array's address is not a whole number of elements from its peers'")
    return base, [b // size for b in byte_offs], math.gcd(MAX_ALIGN, common // size)


def _carve(flat: torch.Tensor, shapes: list, sizes: list[int], padded: list[int], copies: int) -> list[list]:
    """`copies` lists of outputs (one per shape, each starting on a multiple of MAX_ALIGN elements) out of one
    flat buffer with ONE split: a piece per tensor, and a padding piece after a size that is no multiple of
    MAX_ALIGN; a view only where a shape is not 1-D (transformer tensors are mostly 1-D or 2-D)."""
    split, take = [], []
    for _ in range(copies):
        for s, q in zip(sizes, padded):
            take.append(len(split))
            split.append(s)
            if q != s:
                split.append(q - s)
    pieces = flat.split(split)
    n = len(shapes)
    outs = [pieces[k] if len(shapes[i % n]) == 1 else pieces[k].view(shapes[i % n]) for i, k in enumerate(take)]
    return [outs[c * n:(c + 1) * n] for c in range(copies)]


@dataclass(frozen=True)
class _Lean:
    """The lean host path's checked inputs and new outputs, shared by the table, argument and per-tensor forms."""
    inputs: tuple[list[torch.Tensor], ...]   # params, grads, exp_avgs, exp_avg_sqs (contiguous)
    outputs: tuple[list[torch.Tensor], ...]  # params, exp_avgs, exp_avg_sqs, low-precision params after the step
    sizes: list[int]
    keep: list[int] | range                  # the non-empty tensors
    starts: list[int]                        # where each tensor's outputs begin in flat / flat16
    total_padded: int
    flat: torch.Tensor | None                # the fp32 outputs' one allocation (None in place)
    flat16: torch.Tensor | None              # the low-precision outputs' one allocation (None when out16 is given)
    device: torch.device


def _lean_outputs(params, grads, exp_avgs, exp_avg_sqs, inplace: bool, out16, low_precision_dtype) -> _Lean:
    """Whole-list checks, then the outputs: in place, or new fp32 outputs carved out of one allocation by one
    split; the low-precision copy into out16, or carved out of one more allocation. Two torch ops per output dtype,
    whatever the number of 1-D tensors."""
    (params, grads, exp_avgs, exp_avg_sqs), shapes, device = _lean_check(list(params), list(grads), list(exp_avgs),
                                                                          list(exp_avg_sqs), inplace)
    n = len(params)
    sizes = [p.numel() for p in params]
    keep = range(n) if all(sizes) else [i for i in range(n) if sizes[i]]
    if out16 is not None and (len(out16) != n or [h.shape for h in out16] != shapes or
                              not all(h.is_contiguous() for h in out16)):
        raise ValueError("adamw_step: out16 must hold one contiguous tensor of each param's shape")
    padded = [-(-s // MAX_ALIGN) * MAX_ALIGN for s in sizes]
    starts, at = [], 0  # where each tensor's outputs begin in a flat output buffer
    for q in padded:
        starts.append(at)
        at += q
    flat = flat16 = None
    if inplace:
        p_out, m_out, v_out = params, exp_avgs, exp_avg_sqs
    else:
        flat = torch.empty(3 * at, dtype=torch.float32, device=device)
        p_out, m_out, v_out = _carve(flat, shapes, sizes, padded, 3)
    if out16 is None:
        flat16 = torch.empty(at, dtype=low_precision_dtype, device=device)
        (out16,) = _carve(flat16, shapes, sizes, padded, 1)
    return _Lean((params, grads, exp_avgs, exp_avg_sqs), (p_out, m_out, v_out, out16), sizes, keep, starts, at,
                 flat, flat16, device)


def _lean_plan(lean: _Lean, knobs: dict, form: str) -> AdamWPlan:
    """The table forms on the lean path: the table from one list of addresses per role (one gcd per role gives the
    alignment) turned into one tensor, and its copy to the device."""
    keep, total_padded = lean.keep, lean.total_padded
    inputs = [[lst[i] for i in keep] for lst in lean.inputs]
    in_offsets = [_offsets(role) if keep else (None, [], MAX_ALIGN) for role in inputs]
    bases = [b for b, _, _ in in_offsets]
    offsets = [o for _, o, _ in in_offsets]
    align = min(a for _, _, a in in_offsets)
    if lean.flat is None:  # in place
        bases += [bases[0], bases[2], bases[3]]
        offsets += [offsets[0], offsets[2], offsets[3]]
    else:
        kept_starts = [lean.starts[i] for i in keep]
        bases += [lean.flat, lean.flat, lean.flat]
        offsets += [kept_starts, [o + total_padded for o in kept_starts], [o + 2 * total_padded for o in kept_starts]]
    out16 = lean.outputs[3]
    if lean.flat16 is not None:
        bases.append(lean.flat16)
        offsets.append([lean.starts[i] for i in keep])
    else:
        base16, offs16, align16 = _offsets([out16[i] for i in keep]) if keep else (None, [], MAX_ALIGN)
        bases.append(base16)
        offsets.append(offs16)
        align = min(align, align16)
    kept_sizes = [lean.sizes[i] for i in keep]
    settings = _settings(sum(kept_sizes), knobs["block"], knobs["num_warps"], knobs["iters"])
    chunk = settings[0] * settings[2]
    rows = [0]  # row 0: first chunk of each tensor (prefix sums, n + 1 entries); then sizes and offsets, padded
    for s in kept_sizes:
        rows.append(rows[-1] - (-s // chunk))
    n_chunks = rows[-1]
    rows += kept_sizes + [0]
    for offs in offsets:
        rows += [o // align for o in offs] if align > 1 else offs
        rows.append(0)
    arrays = tuple(inputs) + tuple([lst[i] for i in keep] for lst in lean.outputs)
    return _make_plan(arrays, lean.outputs, tuple(bases), rows, n_chunks, align, settings, knobs, lean.device, form)


def _args_plan(lean: _Lean, knobs: dict) -> AdamWPlan:
    """The "args" form: no table, no torch op beyond the outputs; each tensor's first chunk from its size."""
    keep = lean.keep
    kept_sizes = [lean.sizes[i] for i in keep]
    if len(kept_sizes) > ARGS_MAX_TENSORS:
        raise ValueError(f"adamw_step: table='args' takes at most {ARGS_MAX_TENSORS} non-empty tensors, "
                         f"got {len(kept_sizes)}")
    blk, warps, it = _settings(sum(kept_sizes), knobs["block"], knobs["num_warps"], knobs["iters"])
    chunk = blk * it
    firsts = [0]
    for s in kept_sizes:
        firsts.append(firsts[-1] - (-s // chunk))
    arrays = tuple([lst[i] for i in keep] for lst in lean.inputs + lean.outputs)
    bases = tuple(role[0] if role else None for role in arrays)  # for the device only
    return AdamWPlan(arrays, lean.outputs, bases, None, firsts[-1], 1, blk, warps, it, knobs["vec"], None,
                     knobs["split_tail"], knobs["streaming"], "args", tuple(firsts), tuple(kept_sizes))


def _loops_plan(params, grads, exp_avgs, exp_avg_sqs, inplace: bool, out16, low_precision_dtype, knobs,
                form: str) -> AdamWPlan:
    """The first host path, kept for comparison: per-tensor checks, slices and views, a table built in loops."""
    params, grads, exp_avgs, exp_avg_sqs = _state(params, grads, exp_avgs, exp_avg_sqs, inplace)
    if not params:
        raise ValueError("adamw_step: no parameters")
    if inplace:
        p_out, m_out, v_out = params, exp_avgs, exp_avg_sqs
    else:
        p_out, m_out, v_out = (_flat_outputs(params, torch.float32) for _ in range(3))
    if out16 is None:
        out16 = _flat_outputs(params, low_precision_dtype)
    elif len(out16) != len(params) or any(h.shape != p.shape or not h.is_contiguous() for h, p in zip(out16, params)):
        raise ValueError("adamw_step: out16 must hold one contiguous tensor of each param's shape")
    roles = (params, grads, exp_avgs, exp_avg_sqs, p_out, m_out, v_out, out16)
    keep = [i for i, p in enumerate(params) if p.numel()]
    arrays = tuple([role[i] for i in keep] for role in roles)
    bases = tuple(min(role, key=lambda t: t.data_ptr()) if role else None for role in arrays)
    total = sum(params[i].numel() for i in keep)
    settings = _settings(total, knobs["block"], knobs["num_warps"], knobs["iters"])
    blk, _, it = settings
    chunks = [triton.cdiv(params[i].numel(), blk * it) for i in keep]
    first = [0]
    for c in chunks:
        first.append(first[-1] + c)
    offsets = []
    for role, base in zip(arrays, bases):
        size = base.element_size() if base is not None else 1
        byte_offs = [t.data_ptr() - base.data_ptr() for t in role]
        if any(b % size for b in byte_offs):
            raise ValueError("adamw_step: an array's address is not a whole number of elements from its peers'")
        offsets.append([b // size for b in byte_offs])
    align = MAX_ALIGN
    while align > 1 and any(o % align for row in offsets for o in row):
        align //= 2
    pad = [0]  # row 0 has n + 1 entries (the last prefix sum); the others get one unused pad
    rows = [first, [params[i].numel() for i in keep] + pad] + [[o // align for o in row] + pad for row in offsets]
    return _make_plan(arrays, (p_out, m_out, v_out, out16), bases, rows, first[-1], align, settings, knobs,
                      params[0].device, form)


def run_plan(plan: AdamWPlan, step, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
             eps: float = 1e-8, weight_decay: float = 1e-2):
    """One step through a plan (a single launch); returns (params, exp_avgs, exp_avg_sqs, low-precision params)."""
    hyper = _hyper(lr, betas, eps, weight_decay)
    n = len(plan.arrays[0])
    if n:
        step = _step_tensor(step, plan.bases[0].device)
        if plan.form == "args":
            _adamw_args_kernel[(plan.n_chunks,)](
                *[tuple(role) for role in plan.arrays], step, plan.firsts, plan.numels, **hyper, N_TENSORS=n,
                BLOCK=plan.block, ITERS=plan.iters, VEC=plan.vec, SPLIT_TAIL=plan.split_tail,
                STREAMING=plan.streaming, num_warps=plan.num_warps)
            return plan.outputs
        grid = min(plan.programs, plan.n_chunks) if plan.programs else plan.n_chunks
        _adamw_multi_kernel[(grid,)](
            *plan.bases, step, plan.table, n, plan.n_chunks, (n - 1).bit_length(), **hyper,
            ALIGN=plan.align, BLOCK=plan.block, ITERS=plan.iters, VEC=plan.vec, PERSISTENT=plan.programs is not None,
            SPLIT_TAIL=plan.split_tail, STREAMING=plan.streaming, num_warps=plan.num_warps)
    return plan.outputs


def adamw_step(params, grads, exp_avgs, exp_avg_sqs, step, lr: float = 1e-3,
               betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
               inplace: bool = True, low_precision_dtype: torch.dtype = torch.bfloat16, out16: list | None = None,
               multi_tensor: bool = True, block: int | None = None, num_warps: int | None = None,
               iters: int | None = None, vec: int = 4, programs: int | None = None, split_tail: bool = True,
               streaming: bool = False, host: str = "lean", table: str = "auto"):
    """One AdamW step over lists of tensors; returns (params, exp_avgs, exp_avg_sqs, low-precision params).
    Knobs for benchmarks: multi_tensor (one launch, else one per tensor), block / num_warps / iters (elements per
    block, warps, blocks per chunk: block / (32 num_warps) elements per thread and array), vec (the contiguous
    run per thread Triton is told of: 4 keeps every array in one register layout; with more, Triton gives the
    loads and the bf16 store 8 per thread but caps fp32 stores at 4, and converts through shared memory), programs
    (a persistent grid, table forms), split_tail (False masks every chunk), streaming (cache hints), host (how
    the outputs, and a table, are built: "lean" or the first form, "loops"; per tensor too), table (how the
    multi-tensor launch finds the tensors: TABLES; "auto" passes up to ARGS_MAX_TENSORS tensors as launch
    arguments, more through the measured pageable table)."""
    if multi_tensor:
        plan = plan_adamw(params, grads, exp_avgs, exp_avg_sqs, inplace=inplace, out16=out16,
                          low_precision_dtype=low_precision_dtype, block=block, num_warps=num_warps, iters=iters,
                          vec=vec, programs=programs, split_tail=split_tail, streaming=streaming, host=host,
                          table=table)
        return run_plan(plan, step, lr, betas, eps, weight_decay)
    if host not in HOSTS:
        raise ValueError(f"adamw_step: host must be one of {', '.join(HOSTS)}, got {host!r}")
    hyper = _hyper(lr, betas, eps, weight_decay)
    if host == "lean":  # the lean path's checks and carved outputs; no table: a launch per non-empty tensor
        lean = _lean_outputs(params, grads, exp_avgs, exp_avg_sqs, inplace, out16, low_precision_dtype)
        (params, grads, exp_avgs, exp_avg_sqs), (p_out, m_out, v_out, out16) = lean.inputs, lean.outputs
    else:
        params, grads, exp_avgs, exp_avg_sqs = _state(params, grads, exp_avgs, exp_avg_sqs, inplace)
        if inplace:
            p_out, m_out, v_out = params, exp_avgs, exp_avg_sqs
        else:
            p_out, m_out, v_out = ([torch.empty_like(p) for p in params] for _ in range(3))
        if out16 is None:
            out16 = [torch.empty(p.shape, dtype=low_precision_dtype, device=p.device) for p in params]
    step = _step_tensor(step, params[0].device) if params else step
    for arrays in zip(params, grads, exp_avgs, exp_avg_sqs, p_out, m_out, v_out, out16):
        numel = arrays[0].numel()
        if numel:
            blk, warps, it = _settings(numel, block, num_warps, iters)
            _adamw_tensor_kernel[(triton.cdiv(numel, blk * it),)](
                *arrays, step, numel, **hyper, BLOCK=blk, ITERS=it, VEC=vec, SPLIT_TAIL=split_tail,
                STREAMING=streaming, num_warps=warps)
    return p_out, m_out, v_out, out16


class ModelNew(torch.nn.Module):
    """tasks/adamw.py: forward(*params, *grads, *exp_avgs, *exp_avg_sqs, step) returns new tensors:
    (*params, *exp_avgs, *exp_avg_sqs, *bf16 params)."""

    def __init__(self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float):
        super().__init__()
        self.lr, self.betas, self.eps, self.weight_decay = lr, (beta1, beta2), eps, weight_decay

    def forward(self, *state: torch.Tensor):
        p, g, m, v, step = split_state(state)
        outs = adamw_step(p, g, m, v, step, self.lr, self.betas, self.eps, self.weight_decay, inplace=False)
        return tuple(t for lst in outs for t in lst)


def split_state(state: tuple) -> tuple:
    """An AdamW task's flat inputs as (params, grads, exp_avgs, exp_avg_sqs, step): four lists of equal length."""
    if len(state) % 4 != 1:
        raise ValueError(f"expected 4 lists of equal length and a step tensor, got {len(state)} tensors")
    n = (len(state) - 1) // 4
    return (*(list(state[i * n:(i + 1) * n]) for i in range(4)), state[-1])
