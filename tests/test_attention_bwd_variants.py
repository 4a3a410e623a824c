"""The attention fwd+bwd seed's variants (benchmarks/sweep_attention_bwd.py times them on the H200):
the `precise` forward warp-specialised (dO through an in-kernel descriptor) and the backward's dQ through fp32
atomics in the dK/dV kernel (dq_atomic). On the CPU interpreter, which runs the warp-specialised loop as a plain
loop; whether Triton's Hopper pass takes it, and the shared memory of both, is checked by compiling for sm_90 in a
child process (tests/sm90.py)."""
from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn.functional as F

from seeds import attention as A
from tests.sm90 import compile_sm90, compiled_in_child, nvidia_backend_available
from tests.test_seed_attention import (FWD_BWD_CASES, HOPPER_SMEM, SMALL_BWD, SMALL_FWD, _check, _fwd_bwd_case,
                                       _sdpa_grads)

NAMES = ("dq", "dk", "dv")


class _Refused:
    """Stands in for the dQ kernel: launching it (kernel[grid](...)) fails the test."""

    def __getitem__(self, grid):
        raise AssertionError("the dQ kernel was launched")


def _no_dq_kernel(monkeypatch) -> None:
    monkeypatch.setattr(A, "_attn_bwd_dq_kernel", _Refused())


# GQA, causal with Sk > Sq and keys not filling whole blocks, MQA with outliers, fp16 and bf16
@pytest.mark.parametrize("case", [FWD_BWD_CASES[0], FWD_BWD_CASES[1], FWD_BWD_CASES[2], FWD_BWD_CASES[5]],
                         ids=["gqa1", "gqa-causal", "mqa-outliers", "causal-sq<sk"])
@pytest.mark.parametrize("split", [True, False, "dq"])
def test_dq_atomic_matches_sdpa(monkeypatch, case, split):
    """dq_atomic: dQ from the dK/dV kernel's atomics (the dQ kernel not launched) within the harness's tolerance of
    the float64 truth, close to the dQ kernel's, and dK / dV bitwise the default's (same loop, same order)."""
    b, hq, hkv, sq, sk, d, causal, dtype, dist = case
    q, k, v, do, ref, truth = _fwd_bwd_case(*case)
    o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, causal, config=SMALL_FWD, precise=True)
    want = A.attention_bwd(do, q, k, v, o, lse, causal, config=SMALL_BWD, delta=delta, split_ds=split)
    _no_dq_kernel(monkeypatch)
    got = A.attention_bwd(do, q, k, v, o, lse, causal, config=SMALL_BWD, delta=delta, split_ds=split,
                          dq_atomic=True)
    for name, g, r, t in zip(NAMES, got, ref[1:], truth[1:]):
        _check(f"dq_atomic split={split} {name}", g, r, t)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    scale = float(want[0].abs().max())
    assert float((got[0].float() - want[0].float()).abs().max()) <= 2e-2 * scale


@pytest.mark.parametrize("causal", [False, True])
def test_dq_atomic_masks_keys_past_the_end(monkeypatch, causal):
    """Every score very negative (lse2 ~ -370) makes p = exp2(0 - lse2) of the zero key rows past Sk overflow to
    inf; the unmasked steps of dq_atomic's last key block must drop them, or dQ is NaN. Sk = 37: not whole blocks."""
    d, s = 16, 37
    q = torch.full((1, 2, s, d), -8.0).to(torch.bfloat16)
    k = torch.full((1, 2, s, d), 8.0).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    q, k = q + torch.rand(q.shape, generator=gen).to(q.dtype), k + torch.rand(k.shape, generator=gen).to(k.dtype)
    v, do = (torch.randn(1, 2, s, d, generator=gen).to(torch.bfloat16) for _ in range(2))
    o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, causal, config=SMALL_FWD, precise=True)
    assert float(lse.max()) < -300
    _no_dq_kernel(monkeypatch)
    got = A.attention_bwd(do, q, k, v, o, lse, causal, config=SMALL_BWD, delta=delta, split_ds=True, dq_atomic=True)
    ref, truth = _sdpa_grads(q, k, v, do, causal), _sdpa_grads(q.double(), k.double(), v.double(), do.double(), causal)
    for name, g, r, t in zip(NAMES, got, ref[1:], truth[1:]):
        _check(f"very negative scores {name}", g, r, t)


def test_dq_atomic_with_strided_q_and_bshd_grads(monkeypatch):
    """A q that is a strided view (every other head of a bigger tensor) and gradients in [B, S, H, D] storage: the
    accumulator follows a contiguous copy of q, and dq lands in the requested layout."""
    gen = torch.Generator().manual_seed(7)
    big = torch.randn(1, 4, 40, 32, generator=gen).to(torch.bfloat16)
    q = big[:, ::2]
    k, v, do = (torch.randn(1, 2, 40, 32, generator=gen).to(torch.bfloat16) for _ in range(3))
    o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, True, config=SMALL_FWD, precise=True)
    want = A.attention_bwd(do, q, k, v, o, lse, True, config=SMALL_BWD, delta=delta, split_ds=True, bshd_grads=True)
    _no_dq_kernel(monkeypatch)
    got = A.attention_bwd(do, q, k, v, o, lse, True, config=SMALL_BWD, delta=delta, split_ds=True, bshd_grads=True,
                          dq_atomic=True)
    assert got[0].stride() == want[0].stride()
    assert float((got[0].float() - want[0].float()).abs().max()) <= 2e-2 * float(want[0].abs().max())


@pytest.mark.parametrize("case", [FWD_BWD_CASES[1], FWD_BWD_CASES[2]], ids=["gqa-causal", "mqa-outliers"])
@pytest.mark.parametrize("dq_atomic", [False, True])
def test_ds_fp16_matches_sdpa(case, dq_atomic):
    """split_ds="fp16": dQ and dK within the harness's tolerance of the float64 truth, and not the split path's
    (the interpreter emulates the fp16 rounding of dS, so the one-product path is visibly another computation);
    dV, which takes no dS, bitwise the split path's."""
    causal = case[6]
    q, k, v, do, ref, truth = _fwd_bwd_case(*case)
    o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, causal, config=SMALL_FWD, precise=True)
    split = A.attention_bwd(do, q, k, v, o, lse, causal, config=SMALL_BWD, delta=delta, split_ds=True)
    got = A.attention_bwd(do, q, k, v, o, lse, causal, config=SMALL_BWD, delta=delta, split_ds="fp16",
                          dq_atomic=dq_atomic)
    for name, g, r, t in zip(NAMES, got, ref[1:], truth[1:]):
        _check(f"dS fp16 {name}", g, r, t)
    assert not torch.equal(got[0], split[0]) and not torch.equal(got[1], split[1])
    assert torch.equal(got[2], split[2])
    if dq_atomic:  # the same fp16 rounding for dQ through the atomics as in the dQ kernel
        plain = A.attention_bwd(do, q, k, v, o, lse, causal, config=SMALL_BWD, delta=delta, split_ds="fp16")
        assert float((got[0].float() - plain[0].float()).abs().max()) <= 2e-2 * float(plain[0].abs().max())
        assert torch.equal(got[1], plain[1])


def _spy_ws(monkeypatch) -> list:
    """One entry per warp-specialised forward launch (it sets the device scratch allocator)."""
    launches: list = []
    real = A._set_scratch_allocator
    monkeypatch.setattr(A, "_set_scratch_allocator", lambda dev: launches.append(dev) or real(dev))
    return launches


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("persistent", [False, True])
def test_precise_forward_warp_specialised(monkeypatch, causal, persistent):
    """precise + warp_specialize: the single-loop path runs (dO through its descriptor) and gives the two-loop
    precise forward's o, lse and delta; delta is sum_j P dP (not the epilogue's o . dO) and matches the float64
    rowsum(dO o O); a dO whose [rows, D] view is not Q's (gradients in [B, S, H, D] storage) keeps the two-loop path."""
    gen = torch.Generator().manual_seed(17 + causal)
    q = torch.randn(2, 4, 64, 32, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(2, 2, 64, 32, generator=gen).to(torch.bfloat16) for _ in range(2))
    do = torch.randn(q.shape, generator=gen).to(torch.bfloat16)
    cfg = (32, 32, 4, 1)
    want = A.attention_fwd_with_delta(q, k, v, do, causal, config=cfg, tma=True, precise=True)
    launches = _spy_ws(monkeypatch)
    got = A.attention_fwd_with_delta(q, k, v, do, causal, config=cfg, tma=True, precise=True, warp_specialize=True,
                                     persistent=persistent)
    assert len(launches) == 1
    for name, g, w in zip(("o", "lse", "delta"), got, want):
        assert torch.allclose(g.float(), w.float(), atol=1e-5, rtol=1e-5), f"ws precise: {name} differs"
    plain = A.attention_fwd_with_delta(q, k, v, do, causal, config=cfg, tma=True, warp_specialize=True)
    assert not torch.allclose(plain[2], got[2], atol=0, rtol=0)  # another computation: sum of P dP
    truth = _sdpa_grads(q.double(), k.double(), v.double(), do.double(), causal)
    delta64 = (do.double() * truth[0]).sum(-1)
    torch.testing.assert_close(got[2].double(), delta64, rtol=1e-4, atol=1e-4 * delta64.abs().max().item())
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    _check("ws precise o", got[0], ref, truth[0])
    do_bshd = do.transpose(1, 2).contiguous().transpose(1, 2)  # the same values, another row view
    before = len(launches)
    again = A.attention_fwd_with_delta(q, k, v, do_bshd, causal, config=cfg, tma=True, precise=True,
                                       warp_specialize=True)
    assert len(launches) == before  # not warp-specialised
    assert torch.allclose(again[2], want[2], atol=1e-5, rtol=1e-5)


def test_sweep_variants_are_the_seeds_keywords():
    """Every variant of benchmarks/sweep_attention_bwd.py names keywords the launchers take."""
    import inspect
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    from benchmarks import sweep_attention_bwd as SWEEP
    fwd_params = set(inspect.signature(A.attention_fwd_with_delta).parameters)
    bwd_params = set(inspect.signature(A.attention_bwd).parameters)
    for name, fwd_kw, bwd_kw, _ in SWEEP.VARIANTS:
        assert set(fwd_kw) <= fwd_params and set(bwd_kw) <= bwd_params, name
    assert SWEEP.VARIANTS[0][1:3] == (dict(precise=True), dict(split_ds=True))  # the seed's default first


# ---- the GPU-only parts compile for the H200 --------------------------------------------------------------------
def _compile_variants() -> dict:
    """(shared memory, warp-specialised?) of the sweep's new kernels at D = 128, compiled for sm_90."""
    import seeds.attention as A  # noqa: N811 - the compiled (not interpreted) kernels
    d = 128
    strides = {n: 128 for n in (
        "stride_qb stride_qh stride_qs stride_kb stride_kh stride_ks stride_vb stride_vh stride_vs stride_ob "
        "stride_oh stride_os stride_dob stride_doh stride_dos stride_lb stride_lh").split()}
    flags = dict(VARLEN=False, UPCAST=False, IEEE=False, RNE=False)
    out = {}
    for causal in (False, True):
        bm, bn, warps, stages = 128, 128, 4, 2
        fwd = dict(Q="*bf16", K="*bf16", V="*bf16", O="*bf16", LSE="*fp32", DO="*bf16", DELTA="*fp32", CU_Q="*i32",
                   CU_K="*i32", K_DESC="*bf16", V_DESC="*bf16", K_RB=131072, K_RH=4096, V_RB=131072, V_RH=4096,
                   Q_RB=131072, Q_RH=4096, Q_ROWS=524288, K_ROWS=524288, V_ROWS=524288, qk_scale=0.1, S_Q=4096,
                   S_K=4096, HQ=32, NUM_M=4096 // bm, NUM_BH=128, GROUP=1, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn,
                   CAUSAL=causal, STORE_LSE=True, WITH_DELTA=True, PRECISE=True, TMA=True, WS=True,
                   SCALE_POS=True, REVERSE=causal, SUBTILES=1, PERSISTENT=False, DEFER=False, **flags, **strides)
        kernel = compile_sm90(A._attn_fwd_kernel, fwd, warps, stages)
        out[f"fwd precise ws causal={causal}"] = [kernel.metadata.shared,
                                                  "ttg.warp_specialize" in kernel.asm["ttgir"]]
        for split in (1, 2):  # the sweep's dq_atomic rows: dS split (hi + lo) and dS fp16
            m1, n1, m2, n2, warps, stages = A.bwd_config(d, torch.device("cuda"))
            desc = f"tensordesc<bf16[{m1},{d}]>"
            dkdv = dict(Q="*bf16", K="*bf16", V="*bf16", DO="*bf16", DK="*bf16", DV="*bf16", LSE="*fp32",
                        DELTA="*fp32", DQ="*fp32", CU_Q="*i32", CU_K="*i32", Q_DESC=desc, DO_DESC=desc, Q_RB=131072,
                        Q_RH=4096, DO_RB=131072, DO_RH=4096, sm_scale=0.1, qk_scale=0.1, S_Q=4096, S_K=4096,
                        HKV=32, GROUP=1, HEAD_DIM=d, BLOCK_M=m1, BLOCK_N=n1, CAUSAL=causal, TMA=True,
                        SPLIT_DS=split, ATOMIC_DQ=True, SPLIT_DQ=split, NUM_BLK=4096 // n1, NUM_BH=128,
                        SCHEDULE=0, FLIP=False, **flags,
                        **{n: 128 for n in ("stride_qb stride_qh stride_qs stride_kb stride_kh stride_ks stride_vb "
                                            "stride_vh stride_vs stride_dob stride_doh stride_dos stride_dkb "
                                            "stride_dkh stride_dks stride_dvb stride_dvh stride_dvs stride_lb "
                                            "stride_lh").split()})
            kernel = compile_sm90(A._attn_bwd_dkdv_kernel, dkdv, warps, stages)
            out[f"dkdv dq_atomic split={split} causal={causal}"] = [kernel.metadata.shared,
                                                                    "red.global" in kernel.asm["ptx"]]
        dq = dict(Q="*bf16", K="*bf16", V="*bf16", DO="*bf16", DQ="*bf16", LSE="*fp32", DELTA="*fp32", CU_Q="*i32",
                  CU_K="*i32", K_DESC=f"tensordesc<bf16[{n2},{d}]>", V_DESC=f"tensordesc<bf16[{n2},{d}]>",
                  K_RB=131072, K_RH=4096, V_RB=131072, V_RH=4096, sm_scale=0.1, qk_scale=0.1, S_Q=4096, S_K=4096,
                  HQ=32, GROUP=1, HEAD_DIM=d, BLOCK_M=m2, BLOCK_N=n2, CAUSAL=causal, TMA=True, SPLIT_DS=2,
                  NUM_BLK=4096 // m2, NUM_BH=128, SCHEDULE=0, FLIP=False, **flags,
                  **{n: 128 for n in ("stride_qb stride_qh stride_qs stride_kb stride_kh stride_ks stride_vb "
                                      "stride_vh stride_vs stride_dob stride_doh stride_dos stride_dqb stride_dqh "
                                      "stride_dqs stride_lb stride_lh").split()})
        kernel = compile_sm90(A._attn_bwd_dq_kernel, dq, warps, stages)
        out[f"dq dS fp16 causal={causal}"] = [kernel.metadata.shared, "f16.f16" in kernel.asm["ptx"]]
    return out


@pytest.mark.skipif(not nvidia_backend_available(), reason="Triton's NVIDIA backend (ptxas) is not installed")
def test_variants_compile_for_sm90():
    """The precise forward under warp_specialize compiles into the producer/consumer split (the pass takes it:
    the dO product fits), the atomic dK/dV kernel fits the shared memory and emits reductions, and dS fp16 runs
    fp16 wgmma, at the sweep's configs. (Persistent, the precise ws forward needs 279,016 bytes: not swept.)"""
    out = compiled_in_child(__file__)
    assert len(out) == 8, out
    for name, (nbytes, flag) in out.items():
        assert nbytes <= HOPPER_SMEM, f"{name}: {nbytes} bytes of shared memory"
        assert flag, f"{name}: not warp-specialised / no atomics / no fp16 product"


if __name__ == "__main__" and sys.argv[1:2] == ["--compile-sm90"]:
    print(json.dumps(_compile_variants()))
