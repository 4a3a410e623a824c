"""The attention forward's Hopper variants (seeds/attention.py; benchmarks/sweep_attention_fwd.py times
them on the H200): `overlap` (the warp-specialised key loop rotated so that each step issues the next QK^T before
the previous P V) and `pairs` (a persistent causal schedule of a heavy and a light query block per program), on the
CPU interpreter at small shapes against the float64 softmax; and, compiled for sm_90 in a child process, that
Triton's Hopper pass still warp-specialises them within the shared memory and without register spills."""
from __future__ import annotations

import json
import math
import sys

import pytest
import torch
import torch.nn.functional as F

from sandbox.tolerance import compare
from seeds import attention as A
from tests.sm90 import compile_sm90, compiled_in_child, nvidia_backend_available

HOPPER_SMEM = 232448  # bytes of shared memory a block may use on sm_90


def _draw(shape, dtype, dist, gen):
    x = torch.randn(shape, generator=gen)
    if dist == "outliers":  # a few scores far above the rest: the running max jumps mid-row
        flat = x.view(-1)
        idx = torch.randint(0, flat.numel(), (max(1, flat.numel() // 300),), generator=gen)
        flat[idx] = 20.0 * torch.sign(flat[idx])
    return x.to(dtype)


def _truth(q, k, v, causal):
    """(o, natural lse) in float64."""
    qd, kd, vd = (t.double() for t in (q, k, v))
    if kd.shape[1] != qd.shape[1]:
        kd, vd = (t.repeat_interleave(qd.shape[1] // t.shape[1], dim=1) for t in (kd, vd))
    s = qd @ kd.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ vd, torch.logsumexp(s, dim=-1)


# (name, attention_fwd keywords) at interpreter-sized tiles, TMA on as on the H200.
VARIANTS = [
    ("overlap", dict(warp_specialize=True, overlap=True, config=(32, 16, 4, 1))),
    ("overlap 32x32", dict(warp_specialize=True, overlap=True, config=(32, 32, 4, 1))),
    ("overlap persistent", dict(warp_specialize=True, overlap=True, persistent=True, config=(32, 16, 4, 1))),
    ("pairs", dict(persistent=True, pairs=True, config=(16, 16, 8, 1))),
    ("pairs warp_specialize", dict(warp_specialize=True, persistent=True, pairs=True, config=(16, 16, 4, 1))),
    ("pairs overlap", dict(warp_specialize=True, overlap=True, persistent=True, pairs=True, config=(16, 16, 4, 1))),
]
CASES = [
    # B, Hq, Hkv, S, D, causal, dtype, distribution. S 64: whole blocks (the warp-specialised loop runs; 4 query
    # blocks of 16, or 2 of 32: an even count, so pairs applies); S 48 at 16-row blocks: 3 query blocks (pairs
    # falls back to the longest-first order); S 45: a masked tail (the two-loop path).
    (2, 4, 2, 64, 32, True, torch.bfloat16, "outliers"),
    (1, 2, 2, 64, 64, False, torch.float16, "normal"),
    (1, 2, 1, 64, 16, True, torch.float16, "normal"),
    (1, 3, 3, 48, 32, True, torch.bfloat16, "normal"),
    (2, 2, 2, 45, 16, True, torch.bfloat16, "outliers"),
]


@pytest.mark.parametrize("b,hq,hkv,s,d,causal,dtype,dist", CASES)
@pytest.mark.parametrize("name,kw", VARIANTS, ids=[name for name, _ in VARIANTS])
def test_variants_match_float64(monkeypatch, name, kw, b, hq, hkv, s, d, causal, dtype, dist):
    """o within the harness's tolerance of SDPA against float64, lse within 1e-4 of the float64 one (base 2 in the
    seed); the kernel takes the overlap / pairs code exactly where the launcher says it applies."""
    gen = torch.Generator().manual_seed(s * 7 + d + hq)
    q = _draw((b, hq, s, d), dtype, dist, gen)
    k, v = (_draw((b, hkv, s, d), dtype, dist, gen) for _ in range(2))
    launches = []
    real = A._attn_fwd_kernel

    class Spy:  # records the constexprs of each launch, then launches the real kernel
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((kwargs["WS"], kwargs["PERSISTENT"], grid))
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(A, "_attn_fwd_kernel", Spy())
    o, lse2 = A.attention_fwd(q, k, v, causal, tma=True, **kw)
    ws, persistent, grid = launches[0]
    bm, bn = kw["config"][:2]
    whole = s % bn == 0
    assert ws == (2 if kw.get("overlap") and whole else (kw.get("warp_specialize", False) and whole)), launches
    num_m = -(-s // bm)
    want_pairs = kw.get("pairs") and causal and num_m % 2 == 0
    assert persistent == (2 if want_pairs else bool(kw.get("persistent"))), launches
    if want_pairs:  # one program per pair at most
        assert grid[0] <= num_m * b * hq // 2
    o_true, lse_true = _truth(q, k, v, causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
    mismatch = compare(f"{name} o", o, ref, o_true)
    assert mismatch is None, mismatch.describe()
    err = float((lse2.double() * math.log(2.0) - lse_true).abs().max())
    assert err <= 1e-4, f"{name}: lse off by {err}"


@pytest.mark.parametrize("sq,sk", [(32, 64), (96, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_variants_with_unequal_lengths(sq, sk, causal):
    """Fewer or more queries than keys (the causal mask top-left aligned, as SDPA's): the overlap loop's bounds and
    the pairs schedule's query-block count come from Sq, the keys' from Sk."""
    gen = torch.Generator().manual_seed(sq + sk)
    q = torch.randn(1, 2, sq, 32, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(1, 2, sk, 32, generator=gen).to(torch.bfloat16) for _ in range(2))
    o_true, lse_true = _truth(q, k, v, causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    for kw in (dict(warp_specialize=True, overlap=True, config=(32, 16, 4, 1)),
               dict(warp_specialize=True, overlap=True, persistent=True, pairs=True, config=(16, 16, 4, 1))):
        o, lse2 = A.attention_fwd(q, k, v, causal, tma=True, **kw)
        mismatch = compare(f"o {kw}", o, ref, o_true)
        assert mismatch is None, mismatch.describe()
        assert float((lse2.double() * math.log(2.0) - lse_true).abs().max()) <= 1e-4, kw


def test_pairs_visit_every_tile_once():
    """The pairs schedule's tile order, replayed on the host with the kernel's arithmetic, covers every (query
    block, head) once at several program counts, and each program's pairs cost the same (NUM_M + 1 blocks)."""
    for num_m, num_bh in ((4, 3), (8, 5), (32, 128)):
        half = num_m // 2
        for programs in (1, 3, 7, 132):
            seen = []
            for pid in range(programs):
                steps = 2 * (-(-(half * num_bh - pid) // programs)) if half * num_bh > pid else 0
                for it in range(steps):
                    pair = pid + (it // 2) * programs
                    start_m = num_m - 1 - pair % half if it % 2 == 0 else pair % half
                    seen.append((pair // half, start_m))
            assert sorted(seen) == [(bh, m) for bh in range(num_bh) for m in range(num_m)], (num_m, programs)


def test_variants_refuse_what_they_do_not_cover():
    q = k = v = torch.randn(1, 2, 32, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="overlap"):
        A.attention_fwd(q, k, v, True, overlap=True)
    with pytest.raises(ValueError, match="overlap"):
        A.attention_fwd(q, k, v, True, warp_specialize=True, overlap=True, defer_rescale=True)
    with pytest.raises(ValueError, match="pairs"):
        A.attention_fwd(q, k, v, True, pairs=True)


def test_sweep_variants_are_the_seeds_keywords():
    """Every row of benchmarks/sweep_attention_fwd.py names keywords attention_fwd takes, the seed's launch (what
    ModelNew runs) first, each mode at most ~12 compiles together."""
    import inspect
    from benchmarks import sweep_attention_fwd as SWEEP
    params = set(inspect.signature(A.attention_fwd).parameters)
    assert set(SWEEP.ONLY) <= {name for name, _ in SWEEP.VARIANTS}
    for name, kw in SWEEP.VARIANTS:
        assert set(kw) <= params | {"SEED_LAUNCH"}, name
    assert SWEEP.VARIANTS[0][0].startswith("seed")
    assert len(SWEEP.rows_for(False)) + len(SWEEP.rows_for(True)) <= 14


# ---- compiled for the H200 ----------------------------------------------------------------------------------------
def _compile() -> dict:
    """(shared bytes, warp-specialised?, spilled bytes) of each new kernel at the sweep's D = 128 configs."""
    import re
    import subprocess
    from pathlib import Path

    import triton

    import seeds.attention as A  # noqa: N811 - the compiled (not interpreted) kernels
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    strides = {n: 128 for n in ("stride_qb stride_qh stride_qs stride_kb stride_kh stride_ks stride_vb stride_vh "
                                "stride_vs stride_ob stride_oh stride_os stride_dob stride_doh stride_dos stride_lb "
                                "stride_lh").split()}
    out = {}
    for name, causal, ws, persistent in (("overlap", False, 2, False), ("overlap persistent", False, 2, True),
                                         ("overlap", True, 2, False), ("pairs ws", True, True, 2),
                                         ("pairs overlap", True, 2, 2)):
        args = dict(Q="*bf16", K="*bf16", V="*bf16", O="*bf16", LSE="*fp32", DO="*bf16", DELTA="*fp32",
                    CU_Q="*i32", CU_K="*i32", K_DESC="*bf16", V_DESC="*bf16", K_RB=131072, K_RH=4096, V_RB=131072,
                    V_RH=4096, Q_RB=131072, Q_RH=4096, Q_ROWS=524288, K_ROWS=524288, V_ROWS=524288, qk_scale=0.1,
                    S_Q=4096, S_K=4096, HQ=32, NUM_M=32, NUM_BH=128, GROUP=1, HEAD_DIM=128, BLOCK_M=128,
                    BLOCK_N=128, CAUSAL=causal, VARLEN=False, STORE_LSE=True, WITH_DELTA=False, PRECISE=False,
                    TMA=True, WS=ws, SCALE_POS=True, REVERSE=causal, SUBTILES=1, PERSISTENT=persistent, DEFER=False,
                    UPCAST=False, IEEE=False, RNE=False, **strides)
        kernel = compile_sm90(A._attn_fwd_kernel, args, 4, 2)
        cubin = Path(f"/tmp/attn_fwd_variant_{len(out)}.cubin")
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run([str(cuobjdump), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
        cubin.unlink()
        local = re.search(r"LOCAL:(\d+)", usage)
        out[f"{name}{' causal' if causal else ''}"] = [kernel.metadata.shared,
                                                      "ttg.warp_specialize" in kernel.asm["ttgir"],
                                                      int(local[1]) if local else -1]
    return out


@pytest.mark.skipif(not nvidia_backend_available(), reason="Triton's NVIDIA backend (ptxas) is not installed")
def test_variants_compile_for_sm90():
    out = compiled_in_child(__file__)
    assert len(out) == 5, out
    for name, (nbytes, ws, local) in out.items():
        assert nbytes <= HOPPER_SMEM, f"{name}: {nbytes} bytes of shared memory"
        assert ws, f"{name}: Triton's Hopper pass did not warp-specialise it"
        assert local == 0, f"{name}: {local} bytes of local memory (register spills)"


if __name__ == "__main__" and sys.argv[1:2] == ["--compile-sm90"]:
    print(json.dumps(_compile()))
