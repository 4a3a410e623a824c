"""Fused AdamW step on bf16 params with bf16 moments (a bf16 model's optimizer state), in one launch over all
tensors, in place or into new tensors.

Per element, in fp32 from the bf16 values, each result rounded to bf16 once (what torch's AdamW(fused=True) does
for bf16, fp32 "opmath"), with g the bf16 gradient and t the step (read on the device, never synchronising with the
host):
    p <- p (1 - lr wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
which is torch.optim.AdamW's update (decoupled weight decay, no amsgrad). Bytes per parameter: read p, g, m, v and
write p, m, v, 2 bytes each: 14 B. torch's default (foreach) step on bf16 runs several multi-tensor passes over
the state and rounds to bf16 after each op; fused=True is one pass.

The launch: a small int64 table on the device holds, per tensor, its first chunk (a prefix sum), its size, the
element offset of each of its seven arrays from the lowest-addressed array of the same role (so the kernel needs
seven base pointers and no pointer casts; seeds/adamw.py's table form) and the offset of its step tensor (each
param of an optimizer keeps its own, as torch's does). A program binary-searches the prefix sums for its chunk's
tensor and updates BLOCK elements of it: unmasked 16-byte vectors (8 bf16) for a whole chunk, masked only for a
tensor's last, partial chunk. The table is built per call (the grads move between steps) and copied from pinned
memory without waiting for the stream on a GPU. Outputs may alias inputs: each element is read before it is
written, by the same program, so `adamw_bf16_step_` runs the same kernel in place.

Every load is converted to fp32 explicitly and every result is converted explicitly to the output's dtype, rounded
to nearest even (on the GPU Triton's cast does it; the CPU interpreter's truncates, so there `store_rounded` rounds
by hand), so no result depends on Triton's promotion rules for bf16 operands. Bias corrections come from seeds/adamw.py
(`_bias_terms`: fp64 once per program).

On the H200 (benchmarks/bench_model_optimizer.py, benchmarks/data/adamw_model.csv), Llama 1B's 1.50B params in 147
tensors, in place, through patching.optimizer.AdamW: 5.18 ms a step (4,050 GB/s at 14 B/param), against torch's
AdamW(fused=True) 7.75 ms and its default foreach 17.41 ms.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from seeds.adamw import ModelNew as AdamWModel
from seeds.adamw import (MAX_ALIGN, _bias_terms, _carve, _find_tensor, _hyper, _offsets, _settings,
                         _table_arrays, split_state)
from seeds.cross_entropy import needs_rne, store_rounded

CRUCIBLE_SEED = {"name": "adamw_bf16", "tasks": ["adamw_bf16.py"], "ops": ["AdamW step (bf16 params and moments)"]}

VEC = 8  # bf16 elements in one 16-byte vector
ROWS = 10  # table rows: first chunk, size, 7 array offsets, step offset


@triton.jit
def _adamw_bf16_chunk(
    P, G, M, V, P_OUT, M_OUT, V_OUT,        # one tensor's arrays (outputs may alias inputs: each element is read first)
    start, numel,                           # first element of the chunk, elements in the tensor
    decay, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, step_size, inv_sqrt_bias2,
    BLOCK: tl.constexpr, VEC: tl.constexpr,
    MASKED: tl.constexpr,                   # False: the whole chunk lies inside the tensor (unmasked 16-byte vectors)
    RNE: tl.constexpr,                      # round to nearest even by hand (the CPU interpreter's cast truncates)
):
    offs = tl.max_contiguous(start + tl.arange(0, BLOCK), VEC)
    if MASKED:
        mask = offs < numel
        p = tl.load(P + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
        m = tl.load(M + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(V + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        mask = None
        p = tl.load(P + offs).to(tl.float32)
        g = tl.load(G + offs).to(tl.float32)
        m = tl.load(M + offs).to(tl.float32)
        v = tl.load(V + offs).to(tl.float32)
    p = p * decay
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * (g * g)
    p = p - step_size * (m / (tl.sqrt(v) * inv_sqrt_bias2 + eps))
    store_rounded(P_OUT + offs, p, mask, RNE)
    store_rounded(M_OUT + offs, m, mask, RNE)
    store_rounded(V_OUT + offs, v, mask, RNE)


@triton.jit(do_not_specialize=["n_tensors", "search_steps"])  # one compile for any list of tensors
def _adamw_bf16_kernel(
    P, G, M, V, P_OUT, M_OUT, V_OUT,        # the lowest-addressed array of each role; the table offsets are from these
    STEP,                                   # the lowest-addressed step tensor (fp32, the step after this update)
    TABLE,                                  # int64 [ROWS, n_tensors + 1]: first chunk, size, 7 offsets / ALIGN, step
    n_tensors,
    search_steps,                           # ceil(log2(n_tensors)): binary-search steps over the prefix sums
    lr, decay, beta1, beta2, one_minus_beta1, one_minus_beta2, ln_beta1, ln_beta2, eps,
    ALIGN: tl.constexpr,                    # every array offset in the table is a multiple of this (tells Triton so)
    BLOCK: tl.constexpr, VEC: tl.constexpr, RNE: tl.constexpr,
):
    c = tl.program_id(0)
    stride = n_tensors + 1
    row = TABLE + _find_tensor(TABLE, c, n_tensors, search_steps)
    start = (c - tl.load(row)).to(tl.int64) * BLOCK
    numel = tl.load(row + stride)
    step_size, inv_sqrt_bias2 = _bias_terms(STEP + tl.load(row + 9 * stride), lr, ln_beta1, ln_beta2)
    p_, g_, m_, v_, po, mo, vo = _table_arrays(row, stride, P, G, M, V, P_OUT, M_OUT, V_OUT, ALIGN)
    if start + BLOCK <= numel:
        _adamw_bf16_chunk(p_, g_, m_, v_, po, mo, vo, start, numel, decay, beta1, beta2, one_minus_beta1,
                          one_minus_beta2, eps, step_size, inv_sqrt_bias2, BLOCK, VEC, False, RNE)
    else:
        _adamw_bf16_chunk(p_, g_, m_, v_, po, mo, vo, start, numel, decay, beta1, beta2, one_minus_beta1,
                          one_minus_beta2, eps, step_size, inv_sqrt_bias2, BLOCK, VEC, True, RNE)


# ---- launcher -------------------------------------------------------------------------------------------------------

def _check(params, grads, exp_avgs, exp_avg_sqs, steps, inplace: bool):
    """The lists checked (one device, bf16 state, matching shapes); grads made contiguous where they are not."""
    n = len(params)
    if not (len(grads) == len(exp_avgs) == len(exp_avg_sqs) == len(steps) == n) or not n:
        raise ValueError(f"adamw_bf16: {n} params, {len(grads)} grads, {len(exp_avgs)} exp_avgs, "
                         f"{len(exp_avg_sqs)} exp_avg_sqs and {len(steps)} steps; need as many of each, at least one")
    state = params + exp_avgs + exp_avg_sqs
    if {t.dtype for t in state + grads} != {torch.bfloat16}:
        raise ValueError("adamw_bf16: params, grads and moments must all be bfloat16, got "
                         f"{sorted({str(t.dtype) for t in state + grads})}")
    shapes = [p.shape for p in params]
    if shapes != [g.shape for g in grads] or shapes != [m.shape for m in exp_avgs] or \
            shapes != [v.shape for v in exp_avg_sqs]:
        raise ValueError("adamw_bf16: every param needs a grad and moments of its shape")
    if any(s.numel() != 1 or s.dtype != torch.float32 for s in steps):
        raise ValueError("adamw_bf16: each step must be a one-element float32 tensor")
    if len({t.device for t in state + grads + steps}) > 1:
        raise ValueError("adamw_bf16: all params, grads, moments and steps must be on one device")
    if False in [t.is_contiguous() for t in state]:
        if inplace:
            raise ValueError("adamw_bf16: in-place updates need contiguous params and moments")
        params, exp_avgs, exp_avg_sqs = ([t.contiguous() for t in lst] for lst in (params, exp_avgs, exp_avg_sqs))
    grads = [g if g.is_contiguous() else g.contiguous() for g in grads]
    return params, grads, exp_avgs, exp_avg_sqs


def _launch(inputs: list[list[torch.Tensor]], outputs: list[list[torch.Tensor]], steps: list[torch.Tensor],
            hyper: dict, block: int | None, num_warps: int | None) -> None:
    """One launch over the non-empty tensors: the table (built here, copied to the device) and the grid."""
    keep = [i for i, p in enumerate(inputs[0]) if p.numel()]
    if not keep:
        return
    roles = [[lst[i] for i in keep] for lst in inputs + outputs]
    sizes = [roles[0][j].numel() for j in range(len(keep))]
    blk, warps, _ = _settings(sum(sizes), block, num_warps, 1)
    rows = [0]  # row 0: each tensor's first chunk (a prefix sum, n + 1 entries); then padded rows of n + 1
    for s in sizes:
        rows.append(rows[-1] - (-s // blk))
    n_chunks = rows[-1]
    rows += sizes + [0]
    bases, offsets, align = [], [], MAX_ALIGN
    for role in roles:
        base, offs, a = _offsets(role)
        bases.append(base)
        offsets.append(offs)
        align = min(align, a)
    for offs in offsets:
        rows += [o // align for o in offs] + [0]
    step_base, step_offs, _ = _offsets([steps[i] for i in keep])
    rows += step_offs + [0]
    device = bases[0].device
    table = torch.tensor(rows, dtype=torch.int64, pin_memory=device.type == "cuda").to(device, non_blocking=True)
    n = len(keep)
    _adamw_bf16_kernel[(n_chunks,)](*bases, step_base, table, n, (n - 1).bit_length(), **hyper, ALIGN=align,
                                    BLOCK=blk, VEC=VEC, RNE=needs_rne(bases[4]), num_warps=warps)


def _steps(step, n: int, device: torch.device) -> list[torch.Tensor]:
    """One fp32 step tensor per param: the list given, or the one tensor (or number) given for all of them."""
    if isinstance(step, (list, tuple)):
        return list(step)
    if not isinstance(step, torch.Tensor):
        step = torch.full((), float(step), dtype=torch.float32, device=device)
    return [step] * n


def adamw_bf16_step_(params, grads, exp_avgs, exp_avg_sqs, step, lr: float = 1e-3,
                     betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                     *, block: int | None = None, num_warps: int | None = None) -> None:
    """One AdamW step in place over lists of bf16 tensors, in one launch. `step`: the step number after this update,
    one float32 tensor (or number) for all params or a list of one per param (an optimizer's state); it is read on
    the device. block / num_warps: elements per chunk and warps (default 1024 at 4 warps, smaller for small steps)."""
    params, grads, exp_avgs, exp_avg_sqs = list(params), list(grads), list(exp_avgs), list(exp_avg_sqs)
    steps = _steps(step, len(params), params[0].device if params else "cpu")
    params, grads, exp_avgs, exp_avg_sqs = _check(params, grads, exp_avgs, exp_avg_sqs, steps, True)
    _launch([params, grads, exp_avgs, exp_avg_sqs], [params, exp_avgs, exp_avg_sqs], steps,
            _hyper(lr, betas, eps, weight_decay), block, num_warps)


def adamw_bf16_step(params, grads, exp_avgs, exp_avg_sqs, step, lr: float = 1e-3,
                    betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                    *, block: int | None = None, num_warps: int | None = None):
    """The same step into new tensors (the inputs are untouched): (params, exp_avgs, exp_avg_sqs), each list carved
    out of one allocation, every tensor starting on a multiple of MAX_ALIGN elements."""
    params, grads, exp_avgs, exp_avg_sqs = list(params), list(grads), list(exp_avgs), list(exp_avg_sqs)
    steps = _steps(step, len(params), params[0].device if params else "cpu")
    params, grads, exp_avgs, exp_avg_sqs = _check(params, grads, exp_avgs, exp_avg_sqs, steps, False)
    sizes = [p.numel() for p in params]
    padded = [-(-s // MAX_ALIGN) * MAX_ALIGN for s in sizes]
    flat = torch.empty(3 * sum(padded), dtype=torch.bfloat16, device=params[0].device)
    outputs = _carve(flat, [p.shape for p in params], sizes, padded, 3)
    _launch([params, grads, exp_avgs, exp_avg_sqs], outputs, steps, _hyper(lr, betas, eps, weight_decay), block,
            num_warps)
    return tuple(outputs)


class ModelNew(AdamWModel):
    """tasks/adamw_bf16.py: forward(*params, *grads, *exp_avgs, *exp_avg_sqs, step) returns new tensors:
    (*params, *exp_avgs, *exp_avg_sqs), all bf16 (the hyperparameters as seeds/adamw.py's ModelNew keeps them)."""

    def forward(self, *state: torch.Tensor):
        p, g, m, v, step = split_state(state)
        outs = adamw_bf16_step(p, g, m, v, step, self.lr, self.betas, self.eps, self.weight_decay)
        return tuple(t for lst in outs for t in lst)
