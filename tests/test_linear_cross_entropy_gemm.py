"""The GEMM options of the linear + cross-entropy seed (seeds/linear_cross_entropy.py) through the Triton
interpreter: the subtiled epilogue (Gemm.subtile: stores, stats and gradients in two column halves), the grouped
tile order (group_m), and dx_in_dweight's reuse of the last workspace piece's gradient. The TMA kernels run here
through the interpreter's tensor descriptors; warp specialisation and the shared-memory budgets the subtiled tiles
are for exist only on the GPU (benchmarks/sweep_lce.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from seeds.linear_cross_entropy import Gemm, dx_tail_rows, linear_cross_entropy_fwd_bwd, matmul, vocab_chunks
import seeds.linear_cross_entropy as lce
from tests.test_seed_linear_cross_entropy import _case, _check, launches  # noqa: F401 (a fixture)


# (BT, H, V, workspace bytes, stored chunks). The interpreter's tiles are 64 wide (halves of 32): V 150 ends on a
# tile of 22 columns whose second half holds none (its max is -inf: merged, it must add nothing), 301 with a small
# workspace gives tail, stored and workspace chunks, H 13 takes the pointer kernels.
SUBTILE_CASES = [(33, 40, 150, None, 3), (33, 40, 301, 33 * 2 * 16, 1), (19, 13, 83, 19 * 2 * 5, 0),
                 (7, 24, 37, None, 3)]


@pytest.mark.parametrize("bt,h,v,workspace,stored", SUBTILE_CASES)
@pytest.mark.parametrize("gemm", ["tma", "ptr"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_subtiled_epilogue(bt, h, v, workspace, stored, gemm, dtype, device):
    """Stats of each half merged, gradients and stores by halves: the reference's loss and gradients within the
    tolerance, and in fp32 the undivided epilogue's to rounding (only the order of the lse's terms differs)."""
    model, x, target = _case(bt, h, v, dtype, "outliers", 0.1, "mean", seed=7, device=device)
    w = model.weight.detach()
    kw = dict(workspace=workspace, store_chunks=stored, gemm=gemm)
    got = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "mean", epilogue_subtile=True, **kw)
    _check(got, model, x, target)
    if dtype == torch.float32:
        whole = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "mean", **kw)
        for a, b in zip(got, whole):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("warp_specialize,tma_store", [(False, False), (True, False), (True, True)])
def test_subtiled_epilogue_with_dx_in_dweight(warp_specialize, tma_store, device):
    """The options together, as the sweep runs them (warp specialisation is scheduling only, and the TMA store
    writes the same values: same bits)."""
    assert 0 < dx_tail_rows(33, 40, 301, 2) < 301
    model, x, target = _case(33, 40, 301, torch.bfloat16, "normal", 0.0, "sum", seed=8, device=device)
    w = model.weight.detach()
    kw = dict(workspace=33 * 2 * 16, dx_in_dweight=True, epilogue_subtile=True)
    got = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.0, "sum", warp_specialize=warp_specialize,
                                       tma_store=tma_store, dx_split=tma_store, **kw)
    _check(got, model, x, target)
    if warp_specialize and not tma_store:
        plain = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.0, "sum", **kw)
        for a, b in zip(got, plain):
            assert torch.equal(a, b)
    if tma_store:
        plain = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.0, "sum", dx_split=True, **kw)
        for a, b in zip(got, plain):
            assert torch.equal(a, b)


@pytest.mark.parametrize("m,n,k", [(70, 40, 96), (33, 24, 50), (9, 13, 21), (65, 72, 64)])
@pytest.mark.parametrize("layout", ["nn", "tn", "nt"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("subtile,tma_store", [(True, False), (False, True), (True, True)])
def test_matmul_subtiled_and_tma_stores(m, n, k, layout, out_dtype, subtile, tma_store, device):
    """out (+)= a @ b with the store in two column halves and/or through a TMA descriptor of out (loaded, added,
    stored: bf16 outputs only, n 13 falls back to pointers), every layout the vocab form uses, into fp32 (dx's
    accumulator) and bf16 (dweight) outputs; n 40 and 72 leave the last tile's second half partly or wholly
    outside the output."""
    g = torch.Generator().manual_seed(m * n + k)
    a = torch.randn(k, m, generator=g).t() if layout[0] == "t" else torch.randn(m, k, generator=g)
    b = torch.randn(n, k, generator=g).t() if layout[1] == "t" else torch.randn(k, n, generator=g)
    a, b = a.to(device, torch.bfloat16), b.to(device, torch.bfloat16)
    out = torch.randn(m, n, generator=g).to(device, out_dtype)
    expect = out.double() + a.double() @ b.double()
    matmul(a, b, out, accumulate=True, gemm=Gemm(programs=3, subtile=subtile, tma_store=tma_store))
    tol = 1e-5 if out_dtype == torch.float32 else 8e-3
    torch.testing.assert_close(out.double(), expect, rtol=tol, atol=tol)


@pytest.mark.parametrize("group_m", [1, 3])
def test_group_order_changes_no_bit(group_m, device):
    """Another grouping of the row tiles visits the same tiles in another order: the same bits."""
    model, x, target = _case(200, 16, 150, torch.bfloat16, "normal", 0.1, "mean", seed=9, device=device)
    w = model.weight.detach()
    ref = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "mean", workspace=200 * 2 * 64)
    got = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "mean", workspace=200 * 2 * 64, group_m=group_m)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    _check(got, model, x, target)


def test_dx_in_dweight_reuses_the_last_pieces_gradient(launches, device):  # noqa: F811 (the fixture)
    """The tail's pieces: each gradient computed for its dx term, then recomputed for its dweight rows except the
    last piece's, still in the workspace; the result stays the reference's. (Tail 33 rows in pieces of 8: the
    last piece of one column takes the pointer kernels.)"""
    bt, h, v, ws_cols = 16, 32, 129, 8
    tail = dx_tail_rows(bt, h, v, 2)
    pieces = -(-tail // ws_cols)
    chunks, _ = vocab_chunks(bt, h, v - tail, ws_cols, 0)
    assert pieces >= 2 and chunks
    model, x, target = _case(bt, h, v, torch.bfloat16, "outliers", 0.1, "mean", seed=6, device=device)
    w = model.weight.detach()
    got = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "mean", workspace=bt * 2 * ws_cols,
                                       store_chunks=0, dx_in_dweight=True)
    _check(got, model, x, target)
    logits = [name for name in launches if name in ("_tma_logits_kernel", "_vocab_logits_kernel")]
    # one stats pass, one gradient per main chunk, two per tail piece but the last
    assert len(logits) == 1 + len(chunks) + 2 * pieces - 1, (len(logits), len(chunks), pieces)
    plain = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "mean", workspace=bt * 2 * ws_cols,
                                         store_chunks=0)
    torch.testing.assert_close(got[2].float(), plain[2].float(), rtol=2e-2, atol=2e-3)


# (16, 32, 129, 17 columns): one tail piece filling the workspace, so rounding dx needs that room and the piece's
# gradient is recomputed for its dweight rows.
@pytest.mark.parametrize("bt,h,v,workspace,stored", [(16, 32, 129, 16 * 2 * 8, 0), (16, 32, 129, 16 * 2 * 17, 0),
                                                     (33, 40, 301, 33 * 2 * 16, 1),
                                                     (7, 24, 37, None, 3), (19, 14, 83, 19 * 2 * 5, 0),
                                                     (19, 13, 83, 19 * 2 * 5, 0)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dx_split_between_dx_and_dweight(bt, h, v, workspace, stored, dtype, device):
    """The fp32 dx sum with its first H/2 columns in dx's own storage and the rest in dweight's last BT rows (half
    as many as the whole accumulator, so the chunks differ): the reference within the tolerance and the whole
    accumulator's result to rounding; H 13 (odd) keeps the whole accumulator (the same bits)."""
    model, x, target = _case(bt, h, v, dtype, "outliers", 0.1, "mean", seed=10, device=device)
    w = model.weight.detach()
    kw = dict(workspace=workspace, store_chunks=stored, dx_in_dweight=True)
    got = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "mean", dx_split=True, **kw)
    _check(got, model, x, target)
    whole = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "mean", **kw)
    for a, b in zip(got, whole):
        if h % 2:
            assert torch.equal(a, b)
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-3)


def test_dx_split_tail_rows():
    """Half the accumulator in dweight: BT rows at the task's shape (8192; the whole one takes 16384)."""
    assert dx_tail_rows(8192, 4096, 128256, 2, split=True) == 8192
    assert dx_tail_rows(8192, 4096, 128256, 2) == 16384


@pytest.mark.parametrize("scratch_floats", [0, 9, 40, 1000])
def test_round_split_dx_in_place(scratch_floats):
    """dx's rows overwrite the fp32 sums of its own first half: through scratch blocks of any size (none: one row
    apart) the result is both halves rounded."""
    bt, h = 11, 8
    g = torch.Generator().manual_seed(11)
    lo_vals, hi_vals = torch.randn(bt, h // 2, generator=g), torch.randn(bt, h // 2, generator=g)
    dx = torch.empty(bt, h, dtype=torch.bfloat16)
    lo = dx.view(-1).view(torch.float32).view(bt, h // 2)
    lo.copy_(lo_vals)
    lce._round_split_dx(dx, lo, hi_vals.clone(), torch.empty(scratch_floats, dtype=torch.float32))
    assert torch.equal(dx, torch.cat([lo_vals, hi_vals], dim=1).to(torch.bfloat16))


# ---------------------------------------------------------------------------------------------------------------
# Shared memory on Hopper: the kernels compiled ahead of time for sm_90 (no GPU needed: Triton's own ptxas) in a
# child without the interpreter. This is the Triton installed here (3.9), not the H200's 3.6: a check that the
# tiles each option's defaults pick are not wildly over the 227 KiB, not a proof for 3.6.
H200_SMEM = 232448
TILES_S4, TILES_S3, TILES_DX = (128, 256, 64, 8, 4), (128, 256, 64, 8, 3), (128, 256, 32, 8, 3)


def _compile_sm90(kernel: str, tiles, subtile: bool, ws: bool, **kw) -> int:
    """Shared memory (bytes) of one persistent TMA kernel compiled for sm_90: "logits" (MODE, STORE in kw) or
    "matmul" (out "bf16" with A transposed: dweight's; "fp32" accumulated: dx's; tma_store)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    bm, bn, bk, warps, stages = tiles
    common = dict(IEEE=False, UPCAST=False, RNE=False, BM=bm, BN=bn, BK=bk, GROUP_M=8, FLATTEN=not ws,
                  WARP_SPECIALIZE=ws, SUBTILE=subtile)
    if kernel == "logits":
        sig = {"x_desc": f"tensordesc<bf16[{bm},{bk}]>", "w_desc": f"tensordesc<bf16[{bn},{bk}]>",
               "TARGET": "*i64", "STATS": "*fp32", "TGT_LOGIT": "*fp32", "LSE": "*fp32", "ROW_SCALE": "*fp32",
               "DL": "*bf16", "stride_dl": "i32", "M": "i32", "N": "i32", "K": "i32", "v0": "i32", "V": "i32",
               "tile_base": "i32", "n_tiles": "i32", "smoothing": "fp32", "n_programs": "i32"}
        const = dict(common, MODE=kw["mode"], SMOOTH=True, STORE=kw["store"])
        fn = lce._tma_logits_kernel
    else:
        a_t, out, tma_store = kw["out"] == "bf16", kw["out"], kw.get("tma_store", False)
        sig = {"a_desc": f"tensordesc<bf16[{bk},{bm}]>" if a_t else f"tensordesc<bf16[{bm},{bk}]>",
               "b_desc": f"tensordesc<bf16[{bk},{bn}]>", "C": f"*{out}",
               "c_desc": f"tensordesc<{out}[{bm},{bn // 2 if subtile else bn}]>" if tma_store else f"*{out}",
               "M": "i32", "N": "i32", "K": "i32", "stride_cm": "i32", "stride_cn": "i32", "n_programs": "i32"}
        const = dict(common, ACCUMULATE=not a_t, A_T=a_t, B_T=False, TMA_STORE=tma_store)
        fn = lce._tma_matmul_kernel
    sig.update({k: "constexpr" for k in const})
    compiled = triton.compile(ASTSource(fn, sig, const), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=warps, num_stages=stages))
    return compiled.metadata.shared


def _smem_report() -> None:
    """In the child: one line per (label, bytes) for the default's tiles and each option's."""
    cases = [("default logits stats", "logits", TILES_S3, False, False, dict(mode=0, store=True)),
             ("default dx", "matmul", TILES_DX, False, False, dict(out="fp32")),
             ("subtile logits stats", "logits", TILES_S4, True, False, dict(mode=0, store=True)),
             ("subtile logits grad", "logits", TILES_S4, True, False, dict(mode=1, store=False)),
             ("subtile dweight", "matmul", TILES_S4, True, False, dict(out="bf16")),
             ("subtile dx", "matmul", TILES_S3, True, False, dict(out="fp32")),
             ("subtile+ws logits stats", "logits", TILES_S4, True, True, dict(mode=0, store=True)),
             ("subtile+ws dx s4", "matmul", TILES_S4, True, True, dict(out="fp32")),
             ("subtile tma_store dweight", "matmul", TILES_S4, True, False, dict(out="bf16", tma_store=True)),
             ("subtile+ws tma_store dweight", "matmul", TILES_S4, True, True, dict(out="bf16", tma_store=True))]
    for label, kernel, tiles, subtile, ws, kw in cases:
        print(f"{label}\t{_compile_sm90(kernel, tiles, subtile, ws, **kw)}", flush=True)


@pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                                                    "ptxas")), reason="no ptxas in this Triton")
def test_option_tiles_fit_hopper_shared_memory():
    """Each option's default tiles compile for sm_90 within the H200's shared memory; the subtiled epilogue takes
    a 4th stage of BK 64 for the bf16 outputs (the default's 3 stages leave 176 KiB) and BK 64 for dx."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", "import tests.test_linear_cross_entropy_gemm as t; t._smem_report()"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    smem = dict(line.split("\t") for line in out.stdout.strip().splitlines())
    assert len(smem) == 10, smem
    for label, size in smem.items():
        assert 0 < int(size) <= H200_SMEM, (label, size)
    assert int(smem["subtile logits stats"]) > int(smem["default logits stats"])  # the 4th stage is there
