"""The attention backward's launch schedules and tiles (attention_bwd(schedule=, config=);
benchmarks/sweep_attention_bwd.py --schedules times them on the H200). Every schedule runs the same per-tile code in
another order, so its gradients must be bitwise the default grid's; the gradients start as NaN here, so a tile that
no program runs fails the comparison. The pairs/persistent tile orders are replayed on the host with the kernel's
arithmetic; the kernels compile for sm_90 (tests/sm90.py) within the shared memory at the sweep's configs."""
from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pytest
import torch

from seeds import attention as A
from tests.sm90 import compile_sm90, compiled_in_child, nvidia_backend_available
from tests.test_seed_attention import HOPPER_SMEM, SMALL_BWD, SMALL_FWD, _check, _fwd_bwd_case

ROOT = Path(__file__).resolve().parent.parent
SCHEDULES = ("heavy_first", "blocks_major", "persistent", "pairs")


def _nan_grads(monkeypatch) -> None:
    """Gradients allocated full of NaN (not torch.empty, which may hand back the previous call's values)."""
    real = A._grad_like
    monkeypatch.setattr(A, "_grad_like", lambda t, bshd: real(t, bshd).fill_(float("nan")))


def _inputs(b, hq, hkv, sq, sk, d, causal, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, sq, d, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(b, hkv, sk, d, generator=gen).to(torch.bfloat16) for _ in range(2))
    do = torch.randn(q.shape, generator=gen).to(torch.bfloat16)
    o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, causal, config=SMALL_FWD, precise=True)
    return do, q, k, v, o, lse, delta


# (B, Hq, Hkv, Sq, Sk, D, causal): GQA with 4 (even) blocks a kernel, 3 blocks (pairs falls back to persistent),
# keys not filling whole blocks, fewer queries than keys (top-left causal), more programs than SMs (sm_count is 4
# on the interpreter: every persistent program loops over several tiles)
CASES = [(1, 4, 2, 64, 64, 16, True), (2, 2, 2, 48, 48, 16, True), (1, 2, 1, 37, 37, 32, True),
         (1, 2, 2, 32, 64, 16, True), (2, 4, 2, 64, 64, 16, False), (1, 2, 2, 37, 50, 32, False)]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[3]}x{c[4]}{'-causal' if c[6] else ''}-b{c[0]}h{c[1]}/{c[2]}"
                                             for c in CASES])
def test_schedules_are_bitwise_the_grid(monkeypatch, case):
    """Each schedule's (dq, dk, dv) bitwise the default's: the same tiles, each computed once, in another order."""
    _nan_grads(monkeypatch)
    do, q, k, v, o, lse, delta = _inputs(*case, seed=sum(case[:6]))
    causal = case[6]
    want = A.attention_bwd(do, q, k, v, o, lse, causal, config=SMALL_BWD, delta=delta, split_ds=True)
    assert all(torch.isfinite(w).all() for w in want)
    for schedule in SCHEDULES:
        got = A.attention_bwd(do, q, k, v, o, lse, causal, config=SMALL_BWD, delta=delta, split_ds=True,
                              schedule=schedule)
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            assert torch.equal(g, w), f"{schedule}: {name} differs from the grid's"


def test_schedules_match_sdpa_on_a_task_case():
    """One FWD_BWD case (GQA, causal, D = 128) against SDPA's float64 truth with the harness's tolerance, pairs and
    the 8-entry config (dQ's own warps and stages) together."""
    b, hq, hkv, sq, sk, d, causal = 1, 4, 2, 64, 64, 128, True
    q, k, v, do, ref, truth = _fwd_bwd_case(b, hq, hkv, sq, sk, d, causal, torch.bfloat16, "normal")
    o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, causal, config=SMALL_FWD, precise=True)
    got = A.attention_bwd(do, q, k, v, o, lse, causal, config=SMALL_BWD + (8, 2), delta=delta, split_ds=True,
                          schedule="pairs")
    for name, g, r, t in zip(("dq", "dk", "dv"), got, ref[1:], truth[1:]):
        _check(f"pairs {name}", g, r, t)


@pytest.mark.parametrize("sq", [64, 48])
def test_precise_forward_pairs_is_the_grids(sq):
    """The --schedules row "fwd pairs not ws": attention_fwd_with_delta(persistent=True, pairs=True) on the precise
    two-loop path gives the grid launch's o, lse and delta bitwise (4 query blocks pair; 3 fall back to the
    longest-first persistent order)."""
    gen = torch.Generator().manual_seed(sq)
    q = torch.randn(2, 4, sq, 32, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(2, 2, sq, 32, generator=gen).to(torch.bfloat16) for _ in range(2))
    do = torch.randn(q.shape, generator=gen).to(torch.bfloat16)
    want = A.attention_fwd_with_delta(q, k, v, do, True, config=SMALL_FWD, precise=True)
    got = A.attention_fwd_with_delta(q, k, v, do, True, config=SMALL_FWD, precise=True, persistent=True, pairs=True)
    for name, g, w in zip(("o", "lse", "delta"), got, want):
        assert torch.equal(g, w), f"pairs: {name} differs"


def _replay(schedule: str, num_blk: int, num_bh: int, programs: int, flip: bool) -> list[list[tuple[int, int]]]:
    """Per program, the (bh, block) tiles it runs in order, in the kernel's arithmetic (_bwd_steps, _bwd_tile)."""
    code = A.BWD_SCHEDULES[schedule]
    half = num_blk // 2
    out = []
    for pid in range(programs):
        if code == 3:
            steps = 2 * max(0, -(-(half * num_bh - pid) // programs))
        else:
            steps = max(0, -(-(num_blk * num_bh - pid) // programs))
        mine = []
        for it in range(steps):
            if code == 3:
                pair = pid + (it // 2) * programs
                bh, blk = pair // half, (pair % half if it % 2 == 0 else num_blk - 1 - pair % half)
            else:
                tile = pid + it * programs
                bh, blk = tile // num_blk, tile % num_blk
            mine.append((bh, num_blk - 1 - blk if flip else blk))
        out.append(mine)
    return out


def test_persistent_orders_visit_every_tile_once():
    """persistent and pairs cover every (head, block) once at the launcher's program counts (min(work, SMs)), with
    and without FLIP; a pairs program's tiles come in pairs of one head and equal total work (blocks j and
    NUM_BLK - 1 - j); the first tiles of 132 programs span only the few heads they fill."""
    for num_blk, num_bh in ((4, 3), (8, 5), (32, 128), (64, 128)):
        everything = sorted((bh, m) for bh in range(num_bh) for m in range(num_blk))
        for schedule in ("persistent", "pairs"):
            for sms in (1, 3, 7, 132):
                programs = min(num_blk * num_bh // (2 if schedule == "pairs" else 1), sms)
                for flip in (False, True):
                    per_program = _replay(schedule, num_blk, num_bh, programs, flip)
                    assert sorted(t for mine in per_program for t in mine) == everything, (schedule, num_blk, sms)
                    if schedule == "pairs":
                        for mine in per_program:
                            assert all(a[0] == b[0] and a[1] + b[1] == num_blk - 1
                                       for a, b in zip(mine[::2], mine[1::2])), (num_blk, sms, flip)
            first = [mine[0] for mine in _replay(schedule, num_blk, num_bh, 132, False) if mine]
            per_tile = 2 if schedule == "pairs" else 1
            assert len({bh for bh, _ in first}) <= -(-len(first) * per_tile // num_blk) + 1, (schedule, num_blk)
        for dq in (False, True):  # the launcher flips the causal dQ kernel only
            assert A._bwd_launch("pairs", True, num_blk, num_bh, dq, torch.device("cpu"))[2] == dq


def test_launch_shapes():
    """The grid of each schedule: (blocks, heads) for grid and heavy_first, swapped for blocks_major, one program an
    SM at most for the persistent ones; pairs falls back to persistent without causality or with odd blocks; only
    the dQ kernel of a causal launch is flipped, and never under "grid" (the default stays as it was)."""
    cpu = torch.device("cpu")  # sm_count: 4
    assert A._bwd_launch("grid", True, 8, 3, True, cpu) == ((8, 3), 0, False)
    assert A._bwd_launch("heavy_first", True, 8, 3, True, cpu) == ((8, 3), 0, True)
    assert A._bwd_launch("heavy_first", True, 8, 3, False, cpu) == ((8, 3), 0, False)
    assert A._bwd_launch("heavy_first", False, 8, 3, True, cpu) == ((8, 3), 0, False)
    assert A._bwd_launch("blocks_major", True, 8, 3, False, cpu) == ((3, 8), 1, False)
    assert A._bwd_launch("persistent", False, 8, 3, False, cpu) == ((4,), 2, False)
    assert A._bwd_launch("pairs", True, 8, 3, False, cpu) == ((4,), 3, False)
    assert A._bwd_launch("pairs", True, 7, 3, False, cpu) == ((4,), 2, False)
    assert A._bwd_launch("pairs", False, 8, 3, False, cpu) == ((4,), 2, False)
    assert A._bwd_launch("pairs", True, 2, 1, True, cpu) == ((1,), 3, True)


def test_bad_schedule_and_config_are_refused():
    do, q, k, v, o, lse, delta = _inputs(1, 2, 2, 16, 16, 16, False, seed=3)
    with pytest.raises(ValueError, match="schedule"):
        A.attention_bwd(do, q, k, v, o, lse, delta=delta, schedule="spiral")
    with pytest.raises(ValueError, match="config"):
        A.attention_bwd(do, q, k, v, o, lse, delta=delta, config=(16, 16, 16, 16, 4))
    assert inspect.signature(A.attention_bwd).parameters["schedule"].default == "grid"


def test_sweep_schedule_variants_are_the_seeds_keywords():
    """Every --schedules row of benchmarks/sweep_attention_bwd.py names keywords and schedules the launchers take,
    the seed's own launch first (ModelNew's forward, the split backward, no schedule)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import sweep_attention_bwd as SWEEP
    fwd_params = set(inspect.signature(A.attention_fwd_with_delta).parameters)
    bwd_params = set(inspect.signature(A.attention_bwd).parameters)
    for name, fwd_kw, bwd_kw, _ in SWEEP.SCHEDULE_VARIANTS:
        assert set(fwd_kw) <= fwd_params and set(bwd_kw) <= bwd_params, name
        assert bwd_kw.get("schedule", "grid") in A.BWD_SCHEDULES, name
    assert SWEEP.SCHEDULE_VARIANTS[0][1:3] == (dict(precise=True, warp_specialize=True), dict(split_ds=True))


# ---- the kernels compile for the H200 --------------------------------------------------------------------------
def _compile_schedules() -> dict:
    """{kernel: [shared memory, spill bytes]} of the sweep's backward kernels at D = 128 (causal), compiled for
    sm_90 (spills from ptxas -v on the PTX, where the ptxas Triton ships reads it)."""
    import seeds.attention as A  # noqa: N811 - the compiled (not interpreted) kernels
    d = 128
    flags = dict(VARLEN=False, UPCAST=False, IEEE=False, RNE=False, CAUSAL=True, TMA=True, HEAD_DIM=d, GROUP=1,
                 sm_scale=0.1, qk_scale=0.1, S_Q=4096, S_K=4096, NUM_BH=128, CU_Q="*i32", CU_K="*i32",
                 Q="*bf16", K="*bf16", V="*bf16", DO="*bf16", LSE="*fp32", DELTA="*fp32", SPLIT_DS=1)
    rows = dict(Q_RB=131072, Q_RH=4096, DO_RB=131072, DO_RH=4096, K_RB=131072, K_RH=4096, V_RB=131072, V_RH=4096)
    strides = {n: 128 for n in ("stride_qb stride_qh stride_qs stride_kb stride_kh stride_ks stride_vb stride_vh "
                                "stride_vs stride_dob stride_doh stride_dos stride_dkb stride_dkh stride_dks "
                                "stride_dvb stride_dvh stride_dvs stride_dqb stride_dqh stride_dqs stride_lb "
                                "stride_lh").split()}
    out = {}
    # (name, (dkdv BLOCK_M, BLOCK_N, dq BLOCK_M, BLOCK_N, warps, stages), SCHEDULE, dQ's FLIP)
    for name, (m1, n1, m2, n2, warps, stages), code, flip in (
            ("grid", (64, 128, 128, 64, 8, 3), 0, False), ("heavy_first", (64, 128, 128, 64, 8, 3), 0, True),
            ("blocks_major", (64, 128, 128, 64, 8, 3), 1, True), ("persistent", (64, 128, 128, 64, 8, 3), 2, True),
            ("pairs", (64, 128, 128, 64, 8, 3), 3, True), ("4 stages", (64, 128, 128, 64, 8, 4), 0, False),
            ("4 warps 64x64 s2", (64, 64, 64, 64, 4, 2), 0, False)):
        args = dict(flags, **rows, **strides, SCHEDULE=code)
        dkdv = {n: args.get(n) for n in A._attn_bwd_dkdv_kernel.arg_names}
        dkdv.update(DK="*bf16", DV="*bf16", DQ="*fp32", HKV=32, NUM_BLK=4096 // n1, BLOCK_M=m1, BLOCK_N=n1,
                    Q_DESC=f"tensordesc<bf16[{m1},{d}]>", DO_DESC=f"tensordesc<bf16[{m1},{d}]>", ATOMIC_DQ=False,
                    SPLIT_DQ=1, FLIP=False)
        dq = {n: args.get(n) for n in A._attn_bwd_dq_kernel.arg_names}
        dq.update(DQ="*bf16", HQ=32, NUM_BLK=4096 // m2, BLOCK_M=m2, BLOCK_N=n2, K_DESC=f"tensordesc<bf16[{n2},{d}]>",
                  V_DESC=f"tensordesc<bf16[{n2},{d}]>", FLIP=flip)
        for kernel_name, fn, values in (("dkdv", A._attn_bwd_dkdv_kernel, dkdv), ("dq", A._attn_bwd_dq_kernel, dq)):
            kernel = compile_sm90(fn, values, warps, stages)
            out[f"{kernel_name} {name}"] = [kernel.metadata.shared, kernel.metadata.num_warps]
    return out


@pytest.mark.skipif(not nvidia_backend_available(), reason="Triton's NVIDIA backend (ptxas) is not installed")
def test_schedules_compile_for_sm90():
    """Every --schedules backward kernel compiles for sm_90 within a block's shared memory; the 4-warp 64 x 64
    kernels fit twice in an SM's 228 KB (two programs an SM, the row's reason)."""
    out = compiled_in_child(__file__)
    assert len(out) == 14, out
    for name, (nbytes, warps) in out.items():
        assert nbytes <= HOPPER_SMEM, f"{name}: {nbytes} bytes of shared memory"
    for name in ("dkdv 4 warps 64x64 s2", "dq 4 warps 64x64 s2"):
        assert 2 * (out[name][0] + 1024) <= 228 * 1024 and out[name][1] == 4, (name, out[name])


if __name__ == "__main__" and sys.argv[1:2] == ["--compile-sm90"]:
    print(json.dumps(_compile_schedules()))
