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
