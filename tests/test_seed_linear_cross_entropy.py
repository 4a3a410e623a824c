"""The vocab-outer form of the fused linear + cross-entropy seed (seeds/linear_cross_entropy.py) against the task's
reference through the Triton interpreter: chunks in dweight's tail and in the workspace, stored chunks (0 to 4),
the TMA + persistent GEMMs and the pointer ones (and the fall-back from one to the other where TMA's alignment
rules fail), ignore_index, label smoothing, mean/sum. (tests/test_seed_cross_entropy.py covers ModelNew and the
token form.)"""
import copy
from pathlib import Path

import pytest
import torch

import seeds.linear_cross_entropy as lce
from sandbox.task import load_task
from sandbox.tolerance import compare
from seeds.linear_cross_entropy import (Gemm, dx_tail_rows, linear_cross_entropy_fwd_bwd, matmul, stored_ends,
                                        vocab_chunks)

TASK = Path(__file__).resolve().parent.parent / "tasks" / "linear_cross_entropy.py"
TMA_KERNELS = ("_tma_logits_kernel", "_tma_matmul_kernel")
PTR_KERNELS = ("_vocab_logits_kernel", "_matmul_kernel")


def _check(got, model, x, target):
    ref = model(x, target)
    truth = copy.deepcopy(model).double()(x.double(), target)
    for name, g, r, t in zip(("loss", "dx", "dweight"), got, ref, truth):
        assert g.dtype == r.dtype and g.shape == r.shape, (name, g.dtype, r.dtype, g.shape, r.shape)
        bad = compare(name, g, r, t)
        assert bad is None, bad.describe()


def _case(bt, h, v, dtype, dist, smoothing=0.0, reduction="mean", seed=3, device="cpu"):
    task = load_task(TASK).with_constants({"BT": bt, "H": h, "V": v})
    model = task.module.Model(h, v, -100, smoothing, reduction).to(device=device, dtype=dtype)
    x, target = task.make_inputs(seed, dist, device)
    target[::5] = -100
    return model, x.to(dtype), target


@pytest.fixture
def launches(monkeypatch):
    """Names of the GEMM kernels launched (TMA and pointer), in order."""
    names = []

    class Spy:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kw):
                names.append(self.name)
                return self.kernel[grid](*args, **kw)
            return launch

    for name in TMA_KERNELS + PTR_KERNELS:
        monkeypatch.setattr(lce, name, Spy(name, getattr(lce, name)))
    return names


# (BT, H, V, workspace bytes): None = the default (everything in one workspace chunk at these sizes, or stored
# chunks where they fit); small workspaces force chunks in dweight's tail (the first ones holding pass 1's logits)
# and then workspace chunks. H 40 (80-byte bf16 rows) and 24 (48) pass TMA's 16-byte rule; 13 (H odd) does not.
CASES = [(1, 16, 1, None), (7, 24, 37, None), (33, 40, 301, 33 * 2 * 16), (64, 16, 97, 1), (70, 32, 129, 70 * 2 * 9),
         (19, 13, 83, 19 * 2 * 5)]


@pytest.mark.parametrize("bt,h,v,workspace", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_vocab_form(bt, h, v, workspace, dtype, device):
    model, x, target = _case(bt, h, v, dtype, "normal", device=device)
    got = linear_cross_entropy_fwd_bwd(x, model.weight.detach(), target, -100, 0.0, "mean", workspace=workspace)
    _check(got, model, x, target)


@pytest.mark.parametrize("bt,h,v,workspace,store_chunks", [(7, 24, 37, None, 3), (33, 40, 301, 33 * 2 * 16, 1),
                                                          (19, 13, 83, 19 * 2 * 5, 0), (16, 32, 129, 16 * 2 * 8, 2)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_vocab_form_dx_in_dweight(bt, h, v, workspace, store_chunks, dtype, device):
    """The fp32 dx accumulator in dweight's last rows (written last, their gradient recomputed): the same loss and
    gradients as the separate accumulator, within the tolerance, and a tail that really is there."""
    assert 0 < dx_tail_rows(bt, h, v, 2) < v
    model, x, target = _case(bt, h, v, dtype, "outliers", 0.1, "mean", seed=6, device=device)
    w = model.weight.detach()
    got = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "mean", workspace=workspace,
                                       store_chunks=store_chunks, dx_in_dweight=True)
    _check(got, model, x, target)
    apart = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "mean", workspace=workspace,
                                         store_chunks=store_chunks)
    for a, b in zip(got, apart):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-3)


def test_dx_tail_rows_at_the_task_shape():
    """8192 tokens x 4096 of fp32 dx take 16384 bf16 rows of 4096: the main vocabulary ends at 111872, a multiple
    of 8; too small a vocabulary for the accumulator gives no tail."""
    assert dx_tail_rows(8192, 4096, 128256, 2) == 16384
    assert dx_tail_rows(8192, 4096, 16000, 2) == 0


@pytest.mark.parametrize("dist", ["uniform", "large", "outliers", "constant_rows"])
@pytest.mark.parametrize("smoothing,reduction", [(0.0, "sum"), (0.1, "mean"), (0.2, "sum")])
def test_vocab_form_options(dist, smoothing, reduction, device):
    model, x, target = _case(29, 24, 211, torch.bfloat16, dist, smoothing, reduction, seed=4, device=device)
    got = linear_cross_entropy_fwd_bwd(x, model.weight.detach(), target, -100, smoothing, reduction,
                                       workspace=29 * 2 * 12)
    _check(got, model, x, target)


@pytest.mark.parametrize("gemm,store_chunks", [("tma", 0), ("tma", 1), ("tma", 3), ("ptr", 0), ("ptr", 2)])
def test_vocab_form_agrees_with_token_form(gemm, store_chunks, device):
    """Both GEMM paths, with 0-3 chunks of pass 1's logits kept, give the token form's loss and gradients in fp32."""
    model, x, target = _case(45, 32, 173, torch.float32, "outliers", 0.1, "mean", seed=5, device=device)
    w = model.weight.detach()
    vocab = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "mean", workspace=45 * 4 * 8,
                                         store_chunks=store_chunks, gemm=gemm)
    token = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "mean", form="token", chunk=16)
    for a, b in zip(vocab, token):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    _check(vocab, model, x, target)


def test_tma_path_runs_and_falls_back_per_product(launches, device):
    """gemm "tma": aligned products go through the TMA kernels (stats, gradient, dweight, dx); the last workspace
    chunk of 5 columns (a 10-byte dl row) takes the pointer kernels; gemm "ptr" never launches a TMA kernel."""
    model, x, target = _case(24, 16, 101, torch.bfloat16, "normal", device=device)
    w = model.weight.detach()
    chunks, n_stored = vocab_chunks(24, 16, 101, 16, 1)
    assert chunks[-1][1] - chunks[-1][0] == 5 and n_stored == 1
    got = linear_cross_entropy_fwd_bwd(x, w, target, workspace=24 * 2 * 16, store_chunks=1)
    _check(got, model, x, target)
    # 2 stats launches (the stored chunk, the rest), then every recomputed chunk (x and weight rows stay aligned)
    assert launches.count("_tma_logits_kernel") == 2 + len(chunks) - n_stored
    assert launches[-2:] == ["_matmul_kernel", "_matmul_kernel"]  # the 5-column chunk
    assert launches.count("_matmul_kernel") == 2 and "_vocab_logits_kernel" not in launches
    launches.clear()
    linear_cross_entropy_fwd_bwd(x, w, target, workspace=24 * 2 * 16, store_chunks=1, gemm="ptr")
    assert not set(launches) & set(TMA_KERNELS) and launches


def test_odd_hidden_size_takes_the_pointer_path(launches, device):
    model, x, target = _case(19, 13, 83, torch.bfloat16, "normal", device=device)
    got = linear_cross_entropy_fwd_bwd(x, model.weight.detach(), target, workspace=19 * 2 * 5)
    _check(got, model, x, target)
    assert launches and not set(launches) & set(TMA_KERNELS)


@pytest.mark.parametrize("programs,warp_specialize", [(1, False), (2, False), (5, True)])
def test_persistent_grid_sizes_agree(programs, warp_specialize, device):
    """Any persistent grid (1 program taking every tile, a few, one per tile) gives the same bits; the warp
    specialisation switch (flatten off) changes scheduling only."""
    model, x, target = _case(40, 24, 150, torch.bfloat16, "outliers", 0.1, "sum", seed=6, device=device)
    w = model.weight.detach()
    ref = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "sum", workspace=40 * 2 * 16, programs=1000)
    got = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "sum", workspace=40 * 2 * 16, programs=programs,
                                       warp_specialize=warp_specialize)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    _check(got, model, x, target)


@pytest.mark.parametrize("m,n,k", [(70, 40, 96), (33, 24, 50), (9, 13, 21)])
@pytest.mark.parametrize("layout", ["nn", "tn", "nt"])
def test_matmul_layouts(m, n, k, layout, device):
    """out (+)= a @ b for each operand layout the vocab form uses (a^T rows: dweight; b^T rows: logits), through
    TMA where aligned and the pointer kernel where not (n = 13, k = 21), with accumulation."""
    g = torch.Generator().manual_seed(m * n + k)
    a = torch.randn(k, m, generator=g).t() if layout[0] == "t" else torch.randn(m, k, generator=g)
    b = torch.randn(n, k, generator=g).t() if layout[1] == "t" else torch.randn(k, n, generator=g)
    a, b = a.to(device), b.to(device)
    out = torch.randn(m, n, generator=g).to(device)
    expect = (out.double() + a.double() @ b.double()).float()
    matmul(a, b, out, accumulate=True, gemm=Gemm(programs=3))
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-5)


def test_vocab_form_all_ignored_rows_give_zero_gradients(device):
    model, x, target = _case(9, 16, 50, torch.float32, "normal", 0.0, "sum", device=device)
    target[:] = -100
    target[4] = 7
    loss, dx, dw = linear_cross_entropy_fwd_bwd(x, model.weight.detach(), target, -100, 0.0, "sum", workspace=9 * 4)
    assert torch.count_nonzero(dx[:4]) == 0 and torch.count_nonzero(dx[5:]) == 0
    _check((loss, dx, dw), model, x, target)


@pytest.mark.parametrize("bt,h,v,ws_cols", [(8192, 4096, 128256, 3072), (37, 24, 300, 16), (5, 3, 1000, 1),
                                            (1, 16, 1, 1), (4096, 4096, 128256, 3072), (8192, 1000, 3001, 64)])
@pytest.mark.parametrize("stored", [0, 1, 2, 3, 4])
def test_vocab_chunks_plan(bt, h, v, ws_cols, stored):
    """Chunks tile [0, V) in order; a chunk's gradient buffer in dweight's tail never overlaps dweight rows written
    while it is alive (up to its own chunk's end) nor another buffer alive with it; stored buffers are 16-byte
    aligned and each a multiple of 8 columns wide (TMA-ready rows)."""
    chunks, n_stored = vocab_chunks(bt, h, v, ws_cols, stored)
    assert n_stored <= stored and chunks[0][0] == 0 and chunks[-1][1] == v
    for (a0, a1, start), (b0, _, _) in zip(chunks, chunks[1:] + [(v, v, -1)]):
        assert a1 == b0 and a1 > a0
        if start >= 0:
            assert a1 * h <= start and start + (a1 - a0) * bt <= v * h and start % 8 == 0
        else:
            assert a1 - a0 <= max(1, ws_cols)
    kept = [(start, start + (v1 - v0) * bt) for v0, v1, start in chunks[:n_stored]]
    assert all(start >= 0 for start, _ in kept) and all(e0 <= s1 for (_, e0), (s1, _) in zip(kept, kept[1:]))
    assert all((v1 - v0) % 8 == 0 for v0, v1, _ in chunks[:n_stored])
    if (bt, h, v) == (8192, 4096, 128256):  # the task's shape: V/3, 3V/7, 7V/15, 15V/31 stored (256-aligned)
        assert [0, 42752, 54784, 59648, 61952][stored] == (chunks[n_stored - 1][1] if n_stored else 0)
        assert n_stored == stored and len(chunks) <= 13


def test_stored_ends_grow_with_more_buffers():
    totals = [(stored_ends(8192, 4096, 128256, k) or [0])[-1] for k in range(6)]
    assert totals == sorted(totals) and totals[-1] < 128256 // 2


def test_rejects_bad_options():
    args = (torch.randn(2, 4), torch.randn(3, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="form"):
        linear_cross_entropy_fwd_bwd(*args, form="vocabulary")
    with pytest.raises(ValueError, match="gemm"):
        linear_cross_entropy_fwd_bwd(*args, gemm="cublas")
    with pytest.raises(ValueError, match="store_chunks"):
        linear_cross_entropy_fwd_bwd(*args, store_chunks=-1)


def test_dx_accumulated_in_fp32_is_closer_than_rounded_per_chunk(device):
    # many small vocabulary chunks (a one-column workspace): dx is the sum of one product per chunk
    model, x, target = _case(64, 16, 97, torch.bfloat16, "outliers", device=device)
    w = model.weight.detach()
    truth = copy.deepcopy(model).double()(x.double(), target)[1]
    err = {}
    for fp32 in (True, False):
        dx = linear_cross_entropy_fwd_bwd(x, w, target, workspace=1, dx_fp32=fp32)[1]
        assert dx.dtype == torch.bfloat16
        err[fp32] = float((dx.double() - truth).norm() / truth.norm())
    assert err[True] < 0.8 * err[False], err
