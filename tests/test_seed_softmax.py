"""Softmax seeds (forward, backward) against the tasks' PyTorch references, on the interpreter."""
import pytest
import torch

from sandbox.tolerance import compare
from seeds import softmax, softmax_bwd
from tests.test_seed_rmsnorm import DISTRIBUTIONS, DTYPES, SHAPES, check_seed


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward(shape, dtype, device):
    check_seed("softmax_fwd.py", softmax, {"M": shape[0], "N": shape[1]}, dtype, "normal", device)


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_distributions(distribution, dtype, device):
    check_seed("softmax_fwd.py", softmax, {"M": 19, "N": 300}, dtype, distribution, device)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward(shape, dtype, device):
    check_seed("softmax_bwd.py", softmax_bwd, {"M": shape[0], "N": shape[1]}, dtype, "normal", device)


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_backward_distributions(distribution, device):
    check_seed("softmax_bwd.py", softmax_bwd, {"M": 53, "N": 300}, torch.bfloat16, distribution, device)


@pytest.mark.parametrize("rows", [2, 4])
def test_rows_per_program_variants(rows, device):
    torch.manual_seed(1)
    x, dy = torch.randn(2, 37, 129, device=device).unbind(0)
    xr = x.double().requires_grad_()
    y_t = torch.softmax(xr, -1)
    (dx_t,) = torch.autograd.grad(y_t, xr, dy.double())
    y = softmax.softmax_fwd(x, rows=rows)
    for name, got, t in (("y", y, y_t.detach()),
                         ("dx from y", softmax.softmax_bwd(y, dy, from_input=False, rows=rows), dx_t),
                         ("dx from x", softmax.softmax_bwd(x, dy, from_input=True, rows=rows), dx_t)):
        mismatch = compare(name, got, t.float(), t)
        assert mismatch is None, mismatch.describe()


def test_autograd_function_matches_torch_on_3d_input(device):
    torch.manual_seed(3)
    x = torch.randn(2, 5, 64, device=device, requires_grad=True)
    dy = torch.randn(2, 5, 64, device=device)
    y = softmax.SoftmaxFunction.apply(x)
    (dx,) = torch.autograd.grad(y, x, dy)
    xr = x.detach().double().requires_grad_()
    y_t = torch.softmax(xr, -1)
    (dx_t,) = torch.autograd.grad(y_t, xr, dy.double())
    for name, got, t in (("y", y, y_t), ("dx", dx, dx_t)):
        mismatch = compare(name, got.detach(), t.detach().float(), t.detach())
        assert mismatch is None, mismatch.describe()


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_rows_of_minus_infinity_give_nan_like_torch(device):
    x = torch.randn(3, 10, device=device)
    x[1] = float("-inf")
    y = softmax.softmax_fwd(x)
    assert torch.isnan(y[1]).all() and torch.isnan(torch.softmax(x, -1)[1]).all()
    assert torch.allclose(y[[0, 2]], torch.softmax(x, -1)[[0, 2]], rtol=1e-5, atol=1e-7)


# Every option of the one-row kernels (softmax_bwd.RowVariant) on its own and in the combinations the sweep times.
# On the CPU sm_count is 4, so programs_per_sm=2 gives 8 programs that each walk several of the rows.
ROW_VARIANTS = [
    softmax_bwd.RowVariant(),
    softmax_bwd.RowVariant(num_warps=4, load_policy="evict_first", store_cache=".cs"),
    softmax_bwd.RowVariant(programs_per_sm=2),
    softmax_bwd.RowVariant(programs_per_sm=1, prefetch=True),
    softmax_bwd.RowVariant(programs_per_sm=3, prefetch=True, store_cache=".cs", maxnreg=64),
]
TWO_PASS_VARIANTS = [softmax_bwd.RowVariant(chunk=32), softmax_bwd.RowVariant(chunk=16, store_cache=".cs")]


def _softmax_grad_truth(x, dy):
    xr = x.double().requires_grad_()
    y = torch.softmax(xr, -1)
    (dx,) = torch.autograd.grad(y, xr, dy.double())
    return y.detach(), dx


# (37, 129): a masked block and a ragged last program; (16, 64): N is the block (the unmasked path); (5, 300).
@pytest.mark.parametrize("shape", [(37, 129), (16, 64), (5, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", ROW_VARIANTS + TWO_PASS_VARIANTS, ids=repr)
def test_row_kernel_variants(variant, dtype, shape, device):
    torch.manual_seed(5)
    x, dy = (3 * torch.randn(2, *shape, device=device)).to(dtype).unbind(0)
    y_t, dx_t = _softmax_grad_truth(x, dy)
    y = y_t.to(dtype)
    cases = [("dx from y", y)] + ([] if variant.chunk else [("dx from x", x)])
    for name, saved in cases:
        got = softmax_bwd.softmax_bwd_rows(saved, dy, from_input=saved is x, variant=variant)
        assert got.dtype == dtype and got.shape == x.shape
        # The reference PyTorch would give from the same (rounded) inputs, and the float64 truth.
        ref = softmax.softmax_bwd(saved, dy, from_input=saved is x)
        mismatch = compare(name, got, ref, dx_t)
        assert mismatch is None, mismatch.describe()


def test_row_kernel_model_new_runs_the_variant(device):
    torch.manual_seed(6)
    x, dy = torch.randn(2, 9, 40, device=device).unbind(0)
    _, dx_t = _softmax_grad_truth(x, dy)
    for variant in (None, softmax_bwd.RowVariant(programs_per_sm=1, prefetch=True)):
        got = softmax_bwd.ModelNew(variant)(x, dy)
        mismatch = compare(f"dx {variant}", got, dx_t.float(), dx_t)
        assert mismatch is None, mismatch.describe()


@pytest.mark.parametrize("kwargs, message", [
    ({"load_policy": "evict_last"}, "load_policy"),
    ({"store_cache": ".wt"}, "store_cache"),
    ({"num_warps": 6}, "num_warps"),
    ({"prefetch": True}, "persistent grid"),
    ({"chunk": 48}, "power of two"),
    ({"chunk": 64, "programs_per_sm": 2}, "one program per row"),
    ({"maxnreg": 8}, "maxnreg"),
])
def test_row_variant_rejects_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        softmax_bwd.RowVariant(**kwargs)


def test_two_pass_variant_refuses_the_input_form(device):
    x = torch.randn(3, 32, device=device)
    with pytest.raises(ValueError, match="reads the saved y"):
        softmax_bwd.softmax_bwd_rows(x, x, from_input=True, variant=softmax_bwd.RowVariant(chunk=16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_wider_than_registers_take_the_chunked_forward(dtype, device):
    """Past 65,536 columns (KernelBench's softmax has 393,216): two passes over chunks, the running max growing
    mid-row, a last chunk that is partly masked, a row with a large outlier and a row of -inf (NaN, as torch)."""
    torch.manual_seed(2)
    n = softmax.MAX_ROW_BLOCK + 3 * softmax.WIDE_BLOCK + 77
    x = torch.randn(4, n, device=device)
    x[1] += torch.linspace(-20, 20, n, device=device)  # the max keeps growing along the row
    x[2, n - 5] = 60.0
    x[3] = float("-inf")
    x = x.to(dtype)
    y = softmax.softmax_fwd(x)
    ref = torch.softmax(x.double(), -1)
    assert torch.isnan(y[3]).all()
    mismatch = compare("softmax", y[:3], ref[:3].to(dtype), ref[:3])
    assert mismatch is None, mismatch
