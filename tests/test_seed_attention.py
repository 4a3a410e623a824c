"""The attention seeds (seeds/attention.py, attention_bwd.py, decode.py, decode_paged.py) through the CPU interpreter
at small shapes, against the tasks' references with the one tolerance module (truth: the reference in float64):
causal and not, GQA/MQA ratios, head dims 64/128 (and 16/32), odd and unequal sequence lengths, fp16/bf16/fp32,
packed variable-length sequences, and the decode kernels with several splits (some empty) and scattered pages.
Small explicit tiles (16) make the loops run several blocks with masked tails at these lengths.

Also: every GPU kernel variant the launchers pick (TMA on, as on the H200) and every variant
benchmarks/bench_attention.py --hopper sweeps compiles for sm_90 with Triton's own ptxas on this machine, within
Hopper's 227 KiB of shared memory, so the next GPU call does not fail on compilation. The TMA descriptor path
runs on the interpreter too (host TensorDescriptor loads), bitwise against the pointer path.
"""
from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sandbox.task import load_task
from sandbox.tolerance import compare
from seeds import attention as A
from seeds import decode as DEC
from tests.sm90 import compile_sm90, compiled_in_child, nvidia_backend_available

TASKS = Path(__file__).resolve().parent.parent / "tasks"
SMALL_FWD = (16, 16, 4, 1)
SMALL_BWD = (16, 16, 16, 16, 4, 1)


def _check(name, got, ref, truth, scale=1.0):
    mismatch = compare(name, got, ref, truth, scale=scale)
    assert mismatch is None, mismatch.describe()


# The training path's delta = rowsum(dO o O) reads the stored bf16/fp16 O (FlashAttention-2's preprocess); its
# rounding enters every dS of a row, which puts ~1 element in 10^4 of dQ/dK just outside the elementwise bound
# against SDPA's CPU backward (fp32 throughout). Those gradients are checked at twice the tolerance; the fused path
# (delta from the fp32 o in the forward's epilogue, what the fwd+bwd task uses) at the harness's own.
TRAINING_PATH_SCALE = 2.0


def _sdpa_grads(q, k, v, do, causal):
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
        return (o.detach(), *torch.autograd.grad(o, (q, k, v), do))


def _draw(shape, dtype, dist, gen):
    x = torch.randn(shape, generator=gen)
    if dist == "outliers":
        flat = x.view(-1)
        idx = torch.randint(0, flat.numel(), (max(1, flat.numel() // 500),), generator=gen)
        flat[idx] = 20.0 * torch.sign(flat[idx])
    elif dist == "constant_rows":
        x = x[..., :1].expand(shape).contiguous()
    return x.to(dtype)


FWD_BWD_CASES = [
    # B, Hq, Hkv, Sq, Sk, D, causal, dtype, distribution
    (2, 4, 4, 37, 37, 64, False, torch.bfloat16, "normal"),
    (1, 4, 2, 37, 37, 128, True, torch.bfloat16, "normal"),
    (1, 8, 1, 29, 29, 64, True, torch.float16, "outliers"),       # MQA
    (2, 4, 1, 1, 23, 32, False, torch.bfloat16, "normal"),         # one query row
    (1, 2, 2, 45, 19, 16, True, torch.float32, "normal"),          # Sq > Sk, top-left causal as SDPA
    (1, 2, 2, 17, 50, 64, True, torch.bfloat16, "constant_rows"),  # Sq < Sk
]


def _fwd_bwd_case(b, hq, hkv, sq, sk, d, causal, dtype, dist):
    """(q, k, v, do, SDPA's (o, dq, dk, dv) in the inputs' dtype, the same in float64) for one FWD_BWD_CASES row."""
    gen = torch.Generator().manual_seed(hash((b, hq, hkv, sq, sk, d)) % 1000)
    q = _draw((b, hq, sq, d), dtype, dist, gen)
    k, v = (_draw((b, hkv, sk, d), dtype, dist, gen) for _ in range(2))
    do = _draw((b, hq, sq, d), dtype, "normal", gen)
    return (q, k, v, do, _sdpa_grads(q, k, v, do, causal),
            _sdpa_grads(q.double(), k.double(), v.double(), do.double(), causal))


@pytest.mark.parametrize("b,hq,hkv,sq,sk,d,causal,dtype,dist", FWD_BWD_CASES)
def test_forward_backward_matches_sdpa(b, hq, hkv, sq, sk, d, causal, dtype, dist):
    q, k, v, do, ref, truth = _fwd_bwd_case(b, hq, hkv, sq, sk, d, causal, dtype, dist)
    o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, causal, config=SMALL_FWD)
    grads = A.attention_bwd(do, q, k, v, o, lse, causal, config=SMALL_BWD, delta=delta)
    for name, got, r, t in zip(("o", "dq", "dk", "dv"), (o, *grads), ref, truth):
        _check(name, got, r, t)
    # the training path: delta from the stored o by the preprocess kernel
    o2, lse2 = A.attention_fwd(q, k, v, causal, config=SMALL_FWD)
    assert torch.equal(o2, o) and torch.equal(lse2, lse)
    grads = A.attention_bwd(do, q, k, v, o, lse, causal, config=SMALL_BWD)
    for name, got, r, t in zip(("dq", "dk", "dv"), grads, ref[1:], truth[1:]):
        _check("training " + name, got, r, t, TRAINING_PATH_SCALE)
    # lse2 is the base-2 log-sum-exp of the scaled scores
    s = (q.double() @ k.double().repeat_interleave(hq // hkv, 1).transpose(-1, -2)) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).tril().logical_not(), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1) / math.log(2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b,hq,hkv,sq,sk,d,causal,dtype,dist", [FWD_BWD_CASES[1], FWD_BWD_CASES[2], FWD_BWD_CASES[5]])
def test_precise_backward_matches_sdpa(b, hq, hkv, sq, sk, d, causal, dtype, dist):
    """precise=True / split_ds=True (delta = sum_j P_ij dP_ij from the forward's own dP product; dS as hi + lo in
    the dK and dQ products): the same gradients within the tolerance, and delta equal to the float64 rowsum(dO o O)
    to float32 precision. (The interpreter runs its dots in fp32 and does not round P or dS, so the accuracy this
    buys on the GPU is not visible here; docs/BENCHMARKS.md has the CPU emulation of the GPU's roundings.)"""
    q, k, v, do, ref, truth = _fwd_bwd_case(b, hq, hkv, sq, sk, d, causal, dtype, dist)
    o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, causal, config=SMALL_FWD, precise=True)
    grads = A.attention_bwd(do, q, k, v, o, lse, causal, config=SMALL_BWD, delta=delta, split_ds=True)
    for name, got, r, t in zip(("o", "dq", "dk", "dv"), (o, *grads), ref, truth):
        _check("precise " + name, got, r, t)
    delta64 = (do.double() * truth[0]).sum(-1)
    torch.testing.assert_close(delta.double(), delta64, rtol=1e-4, atol=1e-4 * delta64.abs().max().item())
    _, _, delta_default = A.attention_fwd_with_delta(q, k, v, do, causal, config=SMALL_FWD)
    assert not torch.equal(delta, delta_default)  # another computation (sum of P dP), not the epilogue's o . dO


@pytest.mark.parametrize("split", ["dq", "dk"])
def test_precise_backward_split_in_one_product(split):
    """split_ds="dq" / "dk": dS split in that product only; the gradients stay within the tolerance."""
    b, hq, hkv, sq, sk, d, causal, dtype, dist = FWD_BWD_CASES[1]
    q, k, v, do, ref, truth = _fwd_bwd_case(b, hq, hkv, sq, sk, d, causal, dtype, dist)
    o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, causal, config=SMALL_FWD, precise=True)
    grads = A.attention_bwd(do, q, k, v, o, lse, causal, config=SMALL_BWD, delta=delta, split_ds=split)
    for name, got, r, t in zip(("dq", "dk", "dv"), grads, ref[1:], truth[1:]):
        _check(f"split {split} {name}", got, r, t)


def test_split_ds_names_its_choices():
    q, k, v, do = (torch.randn(1, 2, 8, 64).to(torch.bfloat16) for _ in range(4))
    o, lse = A.attention_fwd(q, k, v, config=SMALL_FWD)
    with pytest.raises(ValueError, match="split_ds must be True, False, 'dq' or 'dk'"):
        A.attention_bwd(do, q, k, v, o, lse, config=SMALL_BWD, split_ds="dv")


def test_autograd_function_matches_sdpa():
    gen = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, 4, 21, 64, generator=gen).to(torch.bfloat16) for _ in range(4))
    ref = _sdpa_grads(q, k, v, do, True)
    truth = _sdpa_grads(q.double(), k.double(), v.double(), do.double(), True)
    with torch.enable_grad():
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        o = A.flash_attention(qq, kk, vv, causal=True)
        grads = torch.autograd.grad(o, (qq, kk, vv), do)
    for name, got, r, t in zip(("o", "dq", "dk", "dv"), (o.detach(), *grads), ref, truth):
        _check(name, got, r, t, 1.0 if name == "o" else TRAINING_PATH_SCALE)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_packed_sequences(causal):
    lens_q = [5, 40, 1, 33]
    lens_k = lens_q if causal else [7, 19, 3, 50]
    hq, hkv, d, dtype = 4, 2, 64, torch.bfloat16
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32)
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(sum(lens_q), hq, d, generator=gen).to(dtype)
    k, v = (torch.randn(sum(lens_k), hkv, d, generator=gen).to(dtype) for _ in range(2))
    do = torch.randn(q.shape, generator=gen).to(dtype)
    o, lse = A.attention_varlen_fwd(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal, config=SMALL_FWD)
    grads = A.attention_varlen_bwd(do, q, k, v, o, lse, cu_q, cu_k, max(lens_q), max(lens_k), causal,
                                   config=SMALL_BWD)
    # References per sequence, packed again: the outputs are compared as the kernels return them, so a sequence
    # whose true gradient is exactly zero (length 1, causal) is judged on the packed tensor's scale, not on its own
    # (fp32 sums in another order leave ~1e-7 there, which no scale-aware bound of an all-zero tensor admits).
    refs: list[list[torch.Tensor]] = [[], [], [], []]
    truths: list[list[torch.Tensor]] = [[], [], [], []]
    for i in range(len(lens_q)):
        rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        per = [t[sl].transpose(0, 1)[None] for t, sl in ((q, rows), (k, keys), (v, keys), (do, rows))]
        for j, (r, t) in enumerate(zip(_sdpa_grads(*per, causal), _sdpa_grads(*(t.double() for t in per), causal))):
            refs[j].append(r[0].transpose(0, 1))
            truths[j].append(t[0].transpose(0, 1))
    for name, g, r, t in zip(("o", "dq", "dk", "dv"), (o, *grads), refs, truths):
        _check(f"packed {name}", g, torch.cat(r), torch.cat(t), 1.0 if name == "o" else TRAINING_PATH_SCALE)


@pytest.mark.parametrize("task_file,seed_module", [
    ("attention_fwd_causal.py", "seeds.attention"), ("attention_fwd_bwd_causal.py", "seeds.attention_bwd"),
    ("decode_attention.py", "seeds.decode"), ("decode_attention_paged.py", "seeds.decode_paged"),
])
def test_task_models(task_file, seed_module):
    """Each seed's ModelNew against its task's Model at the task's CPU shape (and an odd one)."""
    module = __import__(seed_module, fromlist=["ModelNew"])
    base = load_task(TASKS / task_file).scaled_for_cpu()
    for task in (base, base.with_constants(base.shape_variants()[0])):
        model = task.make_reference(0, "cpu")
        inputs = task.make_inputs(11, "outliers")
        ref = model(*inputs)
        truth = copy.deepcopy(model).double()(*[x.double() if x.is_floating_point() else x for x in inputs])
        got = module.ModelNew(*task.init_inputs())(*inputs)
        ref, truth, got = ((x,) if isinstance(x, torch.Tensor) else x for x in (ref, truth, got))
        for i, (g, r, t) in enumerate(zip(got, ref, truth)):
            _check(f"{task_file} output {i}", g, r, t)


DECODE_CASES = [
    # B, Hkv, group, N, D, dtype, splits
    (3, 2, 4, 100, 64, torch.bfloat16, 3),
    (2, 1, 8, 1, 128, torch.float16, None),   # one key
    (2, 2, 1, 77, 32, torch.float32, 5),      # MHA
    (1, 1, 16, 130, 128, torch.bfloat16, 8),  # GQA 16:1, many splits
]


@pytest.mark.parametrize("b,hkv,group,n,d,dtype,splits", DECODE_CASES)
def test_decode_dense_and_paged(b, hkv, group, n, d, dtype, splits):
    gen = torch.Generator().manual_seed(n)
    q = torch.randn(b, hkv * group, 1, d, generator=gen).to(dtype)
    k, v = (torch.randn(b, hkv, n, d, generator=gen).to(dtype) for _ in range(2))
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    truth = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
    _check("dense", DEC.decode_attention(q, k, v, num_splits=splits, config=(16, 4, 1)), ref, truth)
    for balanced in (1, 3):  # 4 or 12 programs over the sequences' tiles laid end to end (ranges cross sequences)
        got = DEC.decode_attention(q, k, v, config=(16, 4, 1), balanced=balanced, tma=dtype != torch.float32)
        _check(f"dense balanced={balanced}", got, ref, truth)
    if dtype != torch.float32:  # whole tiles through TMA descriptors, the partial tail through masked pointers
        _check("dense tma", DEC.decode_attention(q, k, v, num_splits=splits, config=(16, 4, 1), tma=True), ref, truth)
        lens = torch.tensor([max(1, n - 7 * i) for i in range(b)], dtype=torch.int32)
        got = DEC.decode_attention(q, k, v, num_splits=splits, config=(16, 4, 1), tma=True, seq_lens=lens)
        keep = (torch.arange(n)[None, :] < lens[:, None])[:, None, None, :]
        _check("dense tma seq_lens", got, F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True),
               F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=keep, enable_gqa=True))

    page = 16
    pages = -(-n // page)
    # the last sequence is short, so that its later splits are empty
    lens = torch.tensor([max(1, n - (i * 37) % (n // 4 + 1)) for i in range(b - 1)] + [min(n, 3)], dtype=torch.int32)
    table = torch.randperm(b * pages, generator=gen).view(b, pages).to(torch.int32)
    kc, vc = (torch.randn(b * pages, page, hkv, d, generator=gen).to(dtype) for _ in range(2))
    kk, vv = (c[table.long()].reshape(b, pages * page, hkv, d).transpose(1, 2) for c in (kc, vc))
    mask = (torch.arange(pages * page)[None, :] < lens[:, None])[:, None, None, :]
    ref = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, enable_gqa=True)
    truth = F.scaled_dot_product_attention(q.double(), kk.double(), vv.double(), attn_mask=mask, enable_gqa=True)
    got = DEC.paged_decode_attention(q, kc, vc, table, lens, num_splits=splits, config=(16, 4, 1))
    _check("paged", got, ref, truth)


TMA_CASES = [
    # B, Hq, Hkv, S, D, causal, dtype: odd lengths (a masked tail after the TMA blocks), GQA, one whole block
    (2, 4, 2, 45, 64, True, torch.bfloat16),
    (1, 2, 1, 37, 32, False, torch.float16),
    (1, 2, 2, 16, 16, True, torch.bfloat16),
]


def _spy_tma(monkeypatch) -> list[bool]:
    """The TMA flag of every descriptor set the launchers build (True: the kernel reads through descriptors)."""
    flags: list[bool] = []
    real = A._descs

    def spy(pairs, block_rows):
        out = real(pairs, block_rows)
        flags.append(out[2])
        return out

    monkeypatch.setattr(A, "_descs", spy)
    return flags


@pytest.mark.parametrize("b,hq,hkv,s,d,causal,dtype", TMA_CASES)
def test_tma_path_matches_pointer_path(monkeypatch, b, hq, hkv, s, d, causal, dtype):
    """The descriptor path (forward, warp-specialised forward, both backward kernels) on the interpreter: bitwise
    the pointer path's results, and within tolerance of the float64 truth."""
    gen = torch.Generator().manual_seed(s * 7 + d)
    q = torch.randn(b, hq, s, d, generator=gen).to(dtype)
    k, v = (torch.randn(b, hkv, s, d, generator=gen).to(dtype) for _ in range(2))
    do = torch.randn(q.shape, generator=gen).to(dtype)
    ref = _sdpa_grads(q, k, v, do, causal)
    truth = _sdpa_grads(q.double(), k.double(), v.double(), do.double(), causal)
    ptr = A.attention_fwd_with_delta(q, k, v, do, causal, config=SMALL_FWD, tma=False)
    ptr_grads = A.attention_bwd(do, q, k, v, ptr[0], ptr[1], causal, config=SMALL_BWD, delta=ptr[2], tma=False)
    flags = _spy_tma(monkeypatch)
    o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, causal, config=SMALL_FWD, tma=True)
    grads = A.attention_bwd(do, q, k, v, o, lse, causal, config=SMALL_BWD, delta=delta, tma=True)
    o_ws, lse_ws = A.attention_fwd(q, k, v, causal, config=SMALL_FWD, tma=True, warp_specialize=True, reverse=False)
    assert flags == [True, True, True, True], flags  # forward, dK/dV, dQ, warp-specialised forward
    for name, got, want in zip(("o", "lse", "delta", "dq", "dk", "dv", "o ws", "lse ws"),
                               (o, lse, delta, *grads, o_ws, lse_ws), (*ptr, *ptr_grads, ptr[0], ptr[1])):
        assert torch.equal(got, want), f"{name}: the TMA path differs from the pointer path"
    for name, got, r, t in zip(("o", "dq", "dk", "dv"), (o, *grads), ref, truth):
        _check("tma " + name, got, r, t)


def test_tma_falls_back_where_a_descriptor_cannot_read(monkeypatch):
    """Rows of 65 bf16 elements (130 bytes, not a multiple of 16) and packed varlen sequences keep the pointer
    path even when TMA is asked for, and stay correct."""
    gen = torch.Generator().manual_seed(5)
    d, s = 64, 40
    padded = [torch.randn(1, 2, s, d + 1, generator=gen).to(torch.bfloat16) for _ in range(3)]
    q, k, v = (t[..., :d] for t in padded)
    assert A._row_view(k) is None and A._row_view(k.contiguous()) is not None
    flags = _spy_tma(monkeypatch)
    o, _ = A.attention_fwd(q, k, v, True, config=SMALL_FWD, tma=True)
    assert flags == [False]
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    truth = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    _check("unaligned rows", o, ref, truth)
    cu = torch.tensor([0, 17, s], dtype=torch.int32)
    packed = [t[0].transpose(0, 1).contiguous() for t in (q, k, v)]  # [T, H, D]
    o_var, _ = A.attention_varlen_fwd(*packed, cu, cu, 23, 23, True, config=SMALL_FWD)
    assert flags == [False, False]
    for i in range(2):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        per = [t[rows].transpose(0, 1)[None] for t in packed]
        _check(f"varlen seq {i}", o_var[rows], F.scaled_dot_product_attention(*per, is_causal=True)[0].transpose(0, 1),
               F.scaled_dot_product_attention(*(t.double() for t in per), is_causal=True)[0].transpose(0, 1))


# The forward's Hopper variants (benchmarks/sweep_attention_fwd.py) at interpreter-sized tiles, TMA on as on
# the H200: (name, attention_fwd keywords).
FWD_VARIANTS = [
    ("warp_specialize", dict(warp_specialize=True, config=(32, 16, 4, 1))),
    ("warp_specialize 32x32", dict(warp_specialize=True, config=(32, 32, 4, 1))),
    ("subtiles", dict(subtiles=2, config=(64, 16, 8, 1))),
    ("persistent", dict(persistent=True, config=(32, 16, 8, 1))),
    ("persistent warp_specialize", dict(persistent=True, warp_specialize=True, config=(32, 16, 4, 1))),
    ("defer_rescale", dict(defer_rescale=True, config=(32, 16, 8, 1))),
    ("defer_rescale subtiles persistent", dict(defer_rescale=True, subtiles=2, persistent=2, config=(64, 16, 8, 1))),
]
FWD_VARIANT_CASES = [
    # B, Hq, Hkv, S, D, causal, dtype, distribution. S 64: whole blocks (the warp-specialised single loop runs);
    # S 45: a masked tail (it falls back to the two-loop path). "growing": keys of a late block scaled up, so the
    # running max jumps by more than 8 (base 2) there, after blocks where it barely moves (both sides of DEFER).
    (2, 4, 2, 64, 32, False, torch.bfloat16, "growing"),
    (1, 2, 2, 64, 64, True, torch.float16, "growing"),
    (1, 4, 1, 45, 32, True, torch.bfloat16, "normal"),
    (2, 2, 2, 45, 16, False, torch.bfloat16, "outliers"),
]


@pytest.mark.parametrize("b,hq,hkv,s,d,causal,dtype,dist", FWD_VARIANT_CASES)
@pytest.mark.parametrize("name,kw", FWD_VARIANTS, ids=[name for name, _ in FWD_VARIANTS])
def test_forward_variants_match_sdpa(monkeypatch, name, kw, b, hq, hkv, s, d, causal, dtype, dist):
    """Each variant against the float64 truth (the harness's tolerance) and its lse against the default's; the
    warp-specialised variants take their single-loop path exactly where the keys fill whole blocks."""
    gen = torch.Generator().manual_seed(s * 13 + d + hq)
    q = _draw((b, hq, s, d), dtype, dist if dist != "growing" else "normal", gen)
    k, v = (_draw((b, hkv, s, d), dtype, dist if dist != "growing" else "normal", gen) for _ in range(2))
    if dist == "growing":
        k[:, :, 40:48] *= 6
    ws_launches = []
    real = A._set_scratch_allocator
    monkeypatch.setattr(A, "_set_scratch_allocator", lambda dev: ws_launches.append(dev) or real(dev))
    o, lse = A.attention_fwd(q, k, v, causal, tma=True, **kw)
    assert len(ws_launches) == int(kw.get("warp_specialize", False) and s % kw["config"][1] == 0)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
    truth = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                           enable_gqa=hq != hkv)
    _check(f"{name} o", o, ref, truth)
    o0, lse0 = A.attention_fwd(q, k, v, causal, config=SMALL_FWD, tma=True)
    assert (lse - lse0).abs().max() <= 1e-5 * max(1.0, float(lse0.abs().max())), f"{name}: lse differs"


def test_forward_variants_with_delta():
    """The fused forward + backward's delta through the variants equals the default's (no dO product: the
    warp-specialised loop takes no pointer load, so delta comes from the epilogue as in the default)."""
    gen = torch.Generator().manual_seed(11)
    q, k, v, do = (torch.randn(1, 2, 64, 32, generator=gen).to(torch.bfloat16) for _ in range(4))
    want = A.attention_fwd_with_delta(q, k, v, do, True, config=(32, 16, 4, 1), tma=True)
    for kw in (dict(warp_specialize=True), dict(persistent=True), dict(defer_rescale=True)):
        got = A.attention_fwd_with_delta(q, k, v, do, True, config=(32, 16, 4, 1), tma=True, **kw)
        for name, g, w in zip(("o", "lse", "delta"), got, want):
            assert torch.allclose(g.float(), w.float(), atol=1e-5, rtol=1e-5), f"{kw}: {name} differs"
    with pytest.raises(ValueError, match="subtiles"):
        A.attention_fwd_with_delta(q, k, v, do, True, config=(32, 16, 4, 1), subtiles=2, precise=True)
    with pytest.raises(ValueError, match="subtiles"):
        A.attention_fwd(q, k, v, subtiles=3)


def test_bad_inputs_are_one_sentence():
    q = torch.randn(1, 3, 8, 64)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        A.attention_fwd(q, torch.randn(1, 2, 8, 64), torch.randn(1, 2, 8, 64))
    with pytest.raises(ValueError, match="head dim"):
        A.attention_fwd(torch.randn(1, 2, 8, 48), torch.randn(1, 2, 8, 48), torch.randn(1, 2, 8, 48))
    with pytest.raises(ValueError, match="block_table"):
        DEC.paged_decode_attention(torch.randn(2, 4, 1, 64), torch.randn(4, 16, 2, 64), torch.randn(4, 16, 2, 64),
                                   torch.zeros(2, 2, dtype=torch.int64), torch.ones(2, dtype=torch.int32))


# ---- the GPU path compiles for the H200 -------------------------------------------------------------------------
HOPPER_SMEM = 232448  # bytes of shared memory a block may use on sm_90


def _strides(names: str, value: int = 128) -> dict:
    return {n: value for n in names.split()}


def _compile_all(d: int) -> dict:
    """Shared memory of each launched GPU variant at head dim d (run in a process without TRITON_INTERPRET): the
    defaults as the H200 launches them (TMA on) and, at d = 128, every variant benchmarks/bench_attention.py
    --hopper sweeps."""
    import seeds.attention as A  # noqa: N811 - the compiled (not interpreted) kernels
    import seeds.decode as DEC  # noqa: N811
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_attention as BENCH

    out = {}
    dev = torch.device("cuda")
    flags = dict(VARLEN=False, UPCAST=False, IEEE=False, RNE=False)

    def desc(tma: bool, rows: int) -> str:
        return f"tensordesc<bf16[{rows},{d}]>" if tma else "*bf16"

    def fwd(config=None, tma=True, warp_specialize=False, reverse=None, precise=False, subtiles=1, persistent=False,
            defer_rescale=False, causal=True, with_ws=False, **_):
        """Shared memory of one forward variant (with_ws: and whether Triton warp-specialised it)."""
        bm, bn, warps, stages = config or A.fwd_config(d, dev, precise, warp_specialize)
        ws = warp_specialize and tma and not precise and subtiles == 1  # as _fwd decides at B4 H32 S4096
        args = dict(Q="*bf16", K="*bf16", V="*bf16", O="*bf16", LSE="*fp32", DO="*bf16", DELTA="*fp32", CU_Q="*i32",
                    CU_K="*i32", K_DESC=desc(tma and not ws, bn), V_DESC=desc(tma and not ws, bn), K_RB=131072,
                    K_RH=4096, V_RB=131072, V_RH=4096, Q_RB=131072, Q_RH=4096, Q_ROWS=524288, K_ROWS=524288,
                    V_ROWS=524288, qk_scale=0.1, S_Q=4096, S_K=4096, HQ=32, NUM_M=4096 // bm, NUM_BH=128, GROUP=1,
                    HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, STORE_LSE=True, WITH_DELTA=not ws,
                    PRECISE=precise, TMA=tma, WS=ws, SCALE_POS=True, REVERSE=reverse is not False,
                    SUBTILES=subtiles, PERSISTENT=bool(persistent), DEFER=defer_rescale, **flags,
                    **_strides("stride_qb stride_qh stride_qs stride_kb stride_kh stride_ks stride_vb stride_vh "
                               "stride_vs stride_ob stride_oh stride_os stride_dob stride_doh stride_dos stride_lb "
                               "stride_lh"))
        kernel = compile_sm90(A._attn_fwd_kernel, args, warps, stages)
        if with_ws:
            return kernel.metadata.shared, "ttg.warp_specialize" in kernel.asm["ttgir"]
        return kernel.metadata.shared

    def bwd(config, tma=True, split_ds=False, **_):
        m1, n1, m2, n2, warps, stages = config or A.bwd_config(d, dev)
        common = dict(CU_Q="*i32", CU_K="*i32", sm_scale=0.1, qk_scale=0.1, S_Q=4096, S_K=4096, GROUP=4, HEAD_DIM=d,
                      CAUSAL=True, TMA=tma, SPLIT_DS=split_ds, SCHEDULE=0, FLIP=False, **flags)
        ptrs = dict(Q="*bf16", K="*bf16", V="*bf16", DO="*bf16", LSE="*fp32", DELTA="*fp32")
        dkdv = dict(**common, **ptrs, DK="*bf16", DV="*bf16", DQ="*fp32", ATOMIC_DQ=False, SPLIT_DQ=False, HKV=8,
                    NUM_BLK=4096 // n1, NUM_BH=32, BLOCK_M=m1, BLOCK_N=n1, Q_DESC=desc(tma, m1),
                    DO_DESC=desc(tma, m1), Q_RB=131072, Q_RH=4096, DO_RB=131072, DO_RH=4096,
                    **_strides("stride_qb stride_qh stride_qs stride_kb stride_kh stride_ks stride_vb stride_vh "
                               "stride_vs stride_dob stride_doh stride_dos stride_dkb stride_dkh stride_dks stride_dvb "
                               "stride_dvh stride_dvs stride_lb stride_lh"))
        dq = dict(**common, **ptrs, DQ="*bf16", HQ=32, NUM_BLK=4096 // m2, NUM_BH=128, BLOCK_M=m2, BLOCK_N=n2, K_DESC=desc(tma, n2),
                  V_DESC=desc(tma, n2), K_RB=32768, K_RH=4096, V_RB=32768, V_RH=4096,
                  **_strides("stride_qb stride_qh stride_qs stride_kb stride_kh stride_ks stride_vb stride_vh "
                             "stride_vs stride_dob stride_doh stride_dos stride_dqb stride_dqh stride_dqs stride_lb "
                             "stride_lh"))
        return (compile_sm90(A._attn_bwd_dkdv_kernel, dkdv, warps, stages).metadata.shared,
                compile_sm90(A._attn_bwd_dq_kernel, dq, warps, stages).metadata.shared)

    out["fwd"] = fwd(None)
    out["fwd pointers"] = fwd(None, tma=False)
    out["dkdv"], out["dq"] = bwd(None)
    out["fwd precise"] = fwd(None, precise=True)  # the `precise` numerics: one more product in each loop
    out["dkdv precise"], out["dq precise"] = bwd(None, split_ds=True)
    if d == 128:  # each distinct kernel once (the launch order and the defaults repeat others)
        seen = set()
        for name, kw, _ in BENCH.HOPPER_FWD:
            key = (kw.get("config") or A.fwd_config(d, dev), kw.get("tma", True), kw.get("warp_specialize", False))
            if key not in seen:
                seen.add(key)
                out[f"fwd {name}"] = fwd(*key[:2], warp_specialize=key[2])
        for name, _, kw in BENCH.HOPPER_BWD:
            key = (kw.get("config") or A.bwd_config(d, dev), kw.get("tma", True))
            if key not in seen:
                seen.add(key)
                out[f"dkdv {name}"], out[f"dq {name}"] = bwd(*key)
        import sweep_attention_fwd as SWEEP
        for name, kw in SWEEP.VARIANTS:  # benchmarks/sweep_attention_fwd.py, causal and not
            for causal in (False, True):
                shared, ws = fwd(**kw, causal=causal, with_ws=True)
                out[f"sweep {name}{' causal' if causal else ''}"] = shared
                out[f"warp-specialised: sweep {name}{' causal' if causal else ''}"] = ws
        block_n, warps, stages = DEC.decode_config(dev)
        split = dict(Q="*bf16", K="*bf16", V="*bf16", O_PART="*fp32", LSE_PART="*fp32", K_DESC="*bf16",
                     V_DESC="*bf16", KV_RB=0, KV_RH=0, SEQ_LENS="*i32", BLOCK_TABLE="*i32", qk_scale=0.1,
                     stride_bt=512, N_CTX=8192, tokens_per_split=4096, HKV=8, SLOTS=2, TILES_PER_SEQ=128,
                     TILE_RANGE=249, TOTAL_TILES=65536, GROUP=4, BLOCK_H=16, HEAD_DIM=d, BLOCK_N=block_n, PAGE=16,
                     PAGED=True, HAS_LENS=True, TMA=False, BALANCED=False, UPCAST=False,
                     IEEE=False, RNE=False,
                     **_strides("stride_qb stride_qh stride_kb stride_kh stride_kn stride_vb stride_vh stride_vn"))
        out["decode paged"] = compile_sm90(DEC._decode_split_kernel, split, warps, stages).metadata.shared
        # the dense cache as the H200 launches it: whole tiles through TMA descriptors
        dense = dict(split, K_DESC=desc(True, block_n), V_DESC=desc(True, block_n), KV_RB=65536, KV_RH=8192,
                     PAGED=False, HAS_LENS=False, TMA=True)
        out["decode tma"] = compile_sm90(DEC._decode_split_kernel, dense, warps, stages).metadata.shared
        out["decode balanced"] = compile_sm90(DEC._decode_split_kernel, dict(dense, BALANCED=True), warps,
                                              stages).metadata.shared
    return out


@pytest.mark.skipif(not nvidia_backend_available(), reason="Triton's NVIDIA backend (ptxas) is not installed")
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_kernels_compile_for_sm90(d):
    """The interpreter never compiles; a child process without TRITON_INTERPRET compiles every launched variant."""
    shared = compiled_in_child(__file__, str(d))
    assert set(shared) >= {"fwd", "dkdv", "dq", "fwd precise", "dkdv precise", "dq precise"}
    ws = {k.split(": ", 1)[1]: shared.pop(k) for k in list(shared) if k.startswith("warp-specialised: ")}
    for kernel, nbytes in shared.items():
        assert nbytes <= HOPPER_SMEM, f"{kernel} at D={d} needs {nbytes} bytes of shared memory"
    if d == 128:  # Triton's Hopper pass takes every 4-warp warp_specialize variant of the sweep, and only those
        assert ws and all(flag == ("sweep ws " in name) for name, flag in ws.items()), ws


if __name__ == "__main__" and sys.argv[1:2] == ["--compile-sm90"]:
    print(json.dumps(_compile_all(int(sys.argv[2]))))
