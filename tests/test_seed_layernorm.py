"""LayerNorm seeds (forward, backward) against the tasks' PyTorch references, on the interpreter."""
import pytest
import torch

from sandbox.tolerance import compare
from seeds import layernorm, layernorm_bwd
from tests.test_seed_rmsnorm import DISTRIBUTIONS, DTYPES, SHAPES, check_seed

# A row of one element normalises to exactly zero; its gradient is pure rounding noise in any fp32 formula.
BWD_SHAPES = [(1, 2)] + SHAPES[1:]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward(shape, dtype, device):
    check_seed("layernorm_fwd.py", layernorm, {"M": shape[0], "N": shape[1]}, dtype, "normal", device)


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_distributions(distribution, dtype, device):
    check_seed("layernorm_fwd.py", layernorm, {"M": 19, "N": 300}, dtype, distribution, device)


@pytest.mark.parametrize("shape", BWD_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward(shape, dtype, device):
    check_seed("layernorm_bwd.py", layernorm_bwd, {"M": shape[0], "N": shape[1]}, dtype, "normal", device)


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_backward_distributions(distribution, device):
    check_seed("layernorm_bwd.py", layernorm_bwd, {"M": 53, "N": 300}, torch.bfloat16, distribution, device)


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("rows,per_sm", [(1, 10), (2, 3), (4, 1)])
def test_backward_grid_variants_agree_with_reference(rows, per_sm, prefetch, device):
    torch.manual_seed(1)
    x = torch.randn(83, 200, device=device)
    dy = torch.randn(83, 200, device=device)
    w, b = torch.randn(2, 200, device=device).unbind(0)
    dx, dw, db = layernorm.layernorm_bwd(x, w, b, dy, 1e-5, rows=rows, programs_per_sm=per_sm, prefetch=prefetch)
    xr, wr, br = (t.double().requires_grad_() for t in (x, w, b))
    truth = torch.autograd.grad(torch.nn.functional.layer_norm(xr, (200,), wr, br, 1e-5), (xr, wr, br), dy.double())
    for name, got, t in zip(("dx", "dw", "db"), (dx, dw, db), truth):
        mismatch = compare(name, got, t.float(), t)
        assert mismatch is None, mismatch.describe()


def test_backward_is_bitwise_reproducible(device):
    torch.manual_seed(2)
    x, dy = torch.randn(2, 61, 96, device=device, dtype=torch.bfloat16).unbind(0)
    w, b = torch.randn(2, 96, device=device, dtype=torch.bfloat16).unbind(0)
    first = layernorm.layernorm_bwd(x, w, b, dy, 1e-5)
    second = layernorm.layernorm_bwd(x, w, b, dy, 1e-5)
    assert all(torch.equal(p, q) for p, q in zip(first, second))


def test_autograd_function_matches_torch_on_3d_input(device):
    torch.manual_seed(3)
    x = torch.randn(2, 5, 64, device=device, requires_grad=True)
    w = torch.randn(64, device=device, requires_grad=True)
    b = torch.randn(64, device=device, requires_grad=True)
    dy = torch.randn(2, 5, 64, device=device)
    y = layernorm.LayerNormFunction.apply(x, w, b, 1e-5)
    grads = torch.autograd.grad(y, (x, w, b), dy)
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    y_t = torch.nn.functional.layer_norm(xr, (64,), wr, br, 1e-5)
    truth = torch.autograd.grad(y_t, (xr, wr, br), dy.double())
    for name, got, t in zip(("y", "dx", "dw", "db"), (y, *grads), (y_t, *truth)):
        mismatch = compare(name, got.detach(), t.detach().float(), t.detach())
        assert mismatch is None, mismatch.describe()


def test_rejects_mismatched_bias(device):
    with pytest.raises(ValueError, match="do not match"):
        layernorm.layernorm_fwd(torch.randn(4, 8, device=device), torch.ones(8, device=device),
                                torch.zeros(7, device=device), 1e-5)
