"""The forward launch variants of the RMSNorm, LayerNorm and RoPE seeds (benchmarks/sweep_fwd_rows.py times them on
the GPU), on the interpreter against float64: every option, masked and unmasked shapes, and the persistent grids
(sm_count is 4 on the CPU, so their programs walk several rows and the prefetch runs past the last row)."""
import pytest
import torch
import torch.nn.functional as F

from sandbox.tolerance import compare
from seeds import layernorm, rmsnorm, rope
from seeds._common import RowVariant
from tasks.rope_fwd import Model as RopeModel, rope_tables

ROW_VARIANTS = [
    RowVariant(),
    RowVariant(num_warps=4, load_policy="evict_first", store_cache=".cs"),
    RowVariant(programs_per_sm=2),
    RowVariant(programs_per_sm=1, prefetch=True, maxnreg=64),
]
# (37, 129): masked, odd; (16, 64): N is the block (no masks), 16 rows over 4 or 8 persistent programs; (1, 1).
SHAPES = [(37, 129), (16, 64), (1, 1)]


def _check(name, got, ref, truth):
    assert got.shape == truth.shape and got.dtype == ref.dtype
    mismatch = compare(name, got, ref, truth)
    assert mismatch is None, mismatch.describe()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", ROW_VARIANTS, ids=repr)
def test_rmsnorm_row_kernel(variant, dtype, shape, device):
    torch.manual_seed(1)
    x = (2 * torch.randn(*shape, device=device)).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[1], device=device)).to(dtype)
    got = rmsnorm.rmsnorm_fwd_rows(x, w, 1e-6, variant)
    _check("y", got, rmsnorm.rmsnorm_fwd(x, w, 1e-6), F.rms_norm(x.double(), (shape[1],), w.double(), 1e-6))


def test_rmsnorm_row_kernel_wide_offsets_and_batched_input(device):
    torch.manual_seed(2)
    x = torch.randn(3, 5, 96, device=device, dtype=torch.float16)
    w = (1 + 0.1 * torch.randn(96, device=device)).to(torch.float16)
    truth = F.rms_norm(x.double(), (96,), w.double(), 1e-6)
    narrow = rmsnorm.rmsnorm_fwd_rows(x, w, 1e-6)
    wide = rmsnorm.rmsnorm_fwd_rows(x, w, 1e-6, RowVariant(programs_per_sm=1, prefetch=True), wide=True)
    for name, got in (("32-bit", narrow), ("64-bit persistent", wide)):
        _check(name, got, rmsnorm.rmsnorm_fwd(x, w, 1e-6), truth)
    assert torch.equal(narrow, wide), "the offset width and the grid changed the arithmetic"


@pytest.mark.parametrize("programs", [3, 8, 100])
@pytest.mark.parametrize("prefetch", [False, True])
def test_explicit_persistent_grids(prefetch, programs, device):
    # An explicit grid: 16 rows over 3 programs (uneven), 8 (even) or 100 (capped at one row each); the arithmetic
    # is the one-row kernel's, so the results are bitwise equal to it.
    torch.manual_seed(9)
    x = torch.randn(16, 64, device=device, dtype=torch.bfloat16)
    w = (1 + 0.1 * torch.randn(64, device=device)).to(torch.bfloat16)
    b = (0.1 * torch.randn(64, device=device)).to(torch.bfloat16)
    v = RowVariant(programs_per_sm=1, prefetch=prefetch) if prefetch else RowVariant()
    got = rmsnorm.rmsnorm_fwd_rows(x, w, 1e-6, v, programs=programs)
    assert torch.equal(got, rmsnorm.rmsnorm_fwd_rows(x, w, 1e-6))
    got = layernorm.layernorm_fwd_rows(x, w, b, 1e-5, v, one_pass=True, programs=programs)
    assert torch.equal(got, layernorm.layernorm_fwd_rows(x, w, b, 1e-5, one_pass=True))
    _check("y", got, layernorm.layernorm_fwd(x, w, b, 1e-5), F.layer_norm(x.double(), (64,), w.double(), b.double(),
                                                                          1e-5))


@pytest.mark.parametrize("stages", [2, 4])
def test_pipelined_persistent_grids(stages, device):
    # tl.range(num_stages=) only changes the compiled schedule on a GPU; here it checks the launch path and that
    # the loop still covers every row once.
    torch.manual_seed(10)
    x = torch.randn(19, 64, device=device, dtype=torch.bfloat16)
    w = (1 + 0.1 * torch.randn(64, device=device)).to(torch.bfloat16)
    b = (0.1 * torch.randn(64, device=device)).to(torch.bfloat16)
    got = rmsnorm.rmsnorm_fwd_rows(x, w, 1e-6, programs=4, stages=stages)
    assert torch.equal(got, rmsnorm.rmsnorm_fwd_rows(x, w, 1e-6))
    got = layernorm.layernorm_fwd_rows(x, w, b, 1e-5, RowVariant(programs_per_sm=1), stages=stages)
    _check("y", got, layernorm.layernorm_fwd(x, w, b, 1e-5), F.layer_norm(x.double(), (64,), w.double(), b.double(),
                                                                          1e-5))


@pytest.mark.parametrize("kwargs,message", [
    ({"stages": 0}, "stages must be 1"),
    ({"stages": 3}, "persistent grid"),
    ({"stages": 3, "programs": 4, "variant": RowVariant(programs_per_sm=1, prefetch=True)}, "pick one"),
])
def test_row_launchers_refuse_bad_stages(kwargs, message, device):
    x, w = torch.randn(3, 32, device=device), torch.ones(32, device=device)
    kwargs = dict(kwargs)
    variant = kwargs.pop("variant", RowVariant())
    with pytest.raises(ValueError, match=message):
        rmsnorm.rmsnorm_fwd_rows(x, w, 1e-6, variant, **kwargs)
    with pytest.raises(ValueError, match=message):
        layernorm.layernorm_fwd_rows(x, w, w, 1e-5, variant, **kwargs)


def test_row_launchers_refuse_empty_grids(device):
    x, w = torch.randn(3, 32, device=device), torch.ones(32, device=device)
    with pytest.raises(ValueError, match="positive grid size"):
        rmsnorm.rmsnorm_fwd_rows(x, w, 1e-6, programs=0)
    with pytest.raises(ValueError, match="positive grid size"):
        layernorm.layernorm_fwd_rows(x, w, w, 1e-5, programs=0)


def test_wide_offsets_only_past_2_to_the_31():
    assert not rmsnorm.needs_wide_offsets(torch.empty((4, 8), device="meta"))
    assert not rmsnorm.needs_wide_offsets(torch.empty((2, 2 ** 30 - 1), device="meta"))
    assert rmsnorm.needs_wide_offsets(torch.empty((2, 2 ** 30), device="meta"))
    assert not rmsnorm.needs_wide_offsets(torch.empty((0, 2 ** 31), device="meta"))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("one_pass", [False, True])
@pytest.mark.parametrize("variant", ROW_VARIANTS, ids=repr)
def test_layernorm_row_kernel(variant, one_pass, shape, device):
    torch.manual_seed(3)
    dtype = torch.bfloat16
    x = (2 * torch.randn(*shape, device=device)).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[1], device=device)).to(dtype)
    b = (0.1 * torch.randn(shape[1], device=device)).to(dtype)
    got = layernorm.layernorm_fwd_rows(x, w, b, 1e-5, variant, one_pass=one_pass)
    truth = F.layer_norm(x.double(), (shape[1],), w.double(), b.double(), 1e-5)
    _check("y", got, layernorm.layernorm_fwd(x, w, b, 1e-5), truth)


def _rows(kind, m, n, device):
    g = torch.Generator(device="cpu").manual_seed(4)
    x = torch.randn(m, n, generator=g)
    if kind == "offset":  # mean far from zero against a unit spread: naive E[x^2] - E[x]^2 cancels in fp32
        x = 1000 + x
    elif kind == "large":
        x = 100 * x
    elif kind == "outlier_first":  # the shift x0 is the row's outlier
        x[:, 0] = 50
    elif kind == "constant":
        x = x[:, :1].expand(m, n).contiguous()
    return x.to(device)


@pytest.mark.parametrize("kind", ["offset", "large", "outlier_first", "constant"])
@pytest.mark.parametrize("n", [64, 300])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_layernorm_one_pass_statistics(dtype, kind, n, device):
    x = _rows(kind, 9, n, device).to(dtype)
    w = (1 + 0.1 * torch.randn(n, device=device)).to(dtype)
    b = (0.1 * torch.randn(n, device=device)).to(dtype)
    truth = F.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    got = layernorm.layernorm_fwd_rows(x, w, b, 1e-5, RowVariant(programs_per_sm=1, prefetch=True), one_pass=True)
    _check("y", got, layernorm.layernorm_fwd(x, w, b, 1e-5), truth)


def test_layernorm_one_pass_keeps_fp32_exact(device):
    # fp32 inputs take the two-pass statistics even when one_pass is asked for (the launcher's docstring says why):
    # a row whose first element is an outlier must still meet fp32's tolerance.
    x = _rows("outlier_first", 9, 300, device)
    w, b = torch.ones(300, device=device), torch.zeros(300, device=device)
    got = layernorm.layernorm_fwd_rows(x, w, b, 1e-5, one_pass=True)
    assert torch.equal(got, layernorm.layernorm_fwd_rows(x, w, b, 1e-5, one_pass=False))
    _check("y", got, F.layer_norm(x, (300,), w, b, 1e-5), F.layer_norm(x.double(), (300,), None, None, 1e-5))


@pytest.mark.parametrize("launcher", ["rmsnorm", "layernorm"])
def test_row_kernels_refuse_chunks(launcher, device):
    x, w = torch.randn(3, 32, device=device), torch.ones(32, device=device)
    with pytest.raises(ValueError, match="chunk must be 0"):
        if launcher == "rmsnorm":
            rmsnorm.rmsnorm_fwd_rows(x, w, 1e-6, RowVariant(chunk=16))
        else:
            layernorm.layernorm_fwd_rows(x, w, w, 1e-5, RowVariant(chunk=16))


# RoPE's token blocks: (B, T, Hq, Hk, D). The first has power-of-two heads and D/2 (no masks when the tokens per
# program divide B*T = 8); the second odd heads, D/2 = 3 and B*T = 10 (masks everywhere).
ROPE_SHAPES = [(2, 4, 4, 2, 16), (2, 5, 3, 1, 6)]


@pytest.mark.parametrize("shape", ROPE_SHAPES)
@pytest.mark.parametrize("tokens,store_cache", [(1, ""), (2, ".cs"), (4, ""), (8, "")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_token_blocks(dtype, tokens, store_cache, shape, device):
    B, T, hq, hk, D = shape
    torch.manual_seed(5)
    q = torch.randn(B, T, hq, D, device=device).to(dtype)
    k = torch.randn(B, T, hk, D, device=device).to(dtype)
    cos, sin = (c.to(device) for c in rope_tables(T, D, dtype))
    truth = RopeModel()(q.double(), k.double(), cos.double(), sin.double())
    ref = rope.rope(q, k, cos, sin)
    got = rope.rope(q, k, cos, sin, tokens=tokens, store_cache=store_cache)
    for name, g, r, t in zip(("q", "k"), got, ref, truth):
        _check(name, g, r, t)
        assert torch.equal(g, r), f"{name}: the token-block kernel's arithmetic differs from the one-token kernel's"


@pytest.mark.parametrize("tokens", [1, 4])
def test_rope_token_blocks_backward_matches_the_default(tokens, device):
    torch.manual_seed(6)
    B, T, hq, hk, D = 2, 3, 4, 2, 8
    dq, dk = torch.randn(B, T, hq, D, device=device), torch.randn(B, T, hk, D, device=device)
    cos, sin = (c.to(device) for c in rope_tables(T, D, torch.float32))
    want = rope.rope(dq, dk, cos, sin, backward=True)
    got = rope.rope(dq, dk, cos, sin, backward=True, tokens=tokens)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("programs,stages", [(3, 1), (4, 3), (64, 2)])
def test_rope_persistent_token_blocks(programs, stages, device):
    # B*T = 10 tokens in blocks of 2 over 3, 4 or (capped) 5 programs; equal to the one-token kernel bit for bit.
    torch.manual_seed(11)
    B, T, hq, hk, D = 2, 5, 3, 1, 6
    q, k = torch.randn(B, T, hq, D, device=device), torch.randn(B, T, hk, D, device=device)
    cos, sin = (c.to(device) for c in rope_tables(T, D, torch.float32))
    want = rope.rope(q, k, cos, sin)
    got = rope.rope(q, k, cos, sin, tokens=2, programs=programs, stages=stages)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_rope_rejects_bad_token_options(device):
    q, cos = torch.randn(1, 2, 2, 4, device=device), torch.randn(2, 4, device=device)
    with pytest.raises(ValueError, match="power of two"):
        rope.rope(q, q, cos, cos, tokens=3)
    with pytest.raises(ValueError, match="token-block kernel"):
        rope.rope(q, q, cos, cos, store_cache=".cs")
    with pytest.raises(ValueError, match="store_cache must be"):
        rope.rope(q, q, cos, cos, tokens=2, store_cache=".cg")
    with pytest.raises(ValueError, match="token-block kernel"):
        rope.rope(q, q, cos, cos, programs=4)
    with pytest.raises(ValueError, match="positive grid size"):
        rope.rope(q, q, cos, cos, tokens=1, programs=0)
    with pytest.raises(ValueError, match="persistent grid"):
        rope.rope(q, q, cos, cos, tokens=1, stages=3)
