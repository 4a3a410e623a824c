"""RMSNorm seeds (forward, backward, fused residual) against the tasks' PyTorch references, on the interpreter."""
import copy
from pathlib import Path

import pytest
import torch

from sandbox.task import load_task
from sandbox.tolerance import compare
from seeds import rmsnorm, rmsnorm_bwd, rmsnorm_residual
from seeds._common import RowVariant

TASKS = Path(__file__).resolve().parent.parent / "tasks"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(1, 1), (3, 7), (37, 129), (20, 1000)]
# A row of one element has a gradient of order eps that is pure cancellation in any fp32 formula (PyTorch's too).
BWD_SHAPES = [(1, 2)] + SHAPES[1:]
DISTRIBUTIONS = ["uniform", "large", "outliers", "constant_rows"]


def check_seed(task_file, seed_module, consts, dtype, distribution, device, seed=0):
    """Run the task's Model and the seed's ModelNew on the same inputs; every output must pass compare()."""
    task = load_task(TASKS / task_file).with_constants(consts)
    model = task.make_reference(seed, device).to(dtype)
    inputs = [t.to(dtype) for t in task.make_inputs(seed, distribution, device)]
    ref = model(*inputs)
    truth = copy.deepcopy(model).double()(*[t.double() for t in inputs])
    new = seed_module.ModelNew(*task.init_inputs()).to(device=device, dtype=dtype)
    new.load_state_dict(model.state_dict())
    got = new(*inputs)
    ref, truth, got = [o if isinstance(o, (tuple, list)) else (o,) for o in (ref, truth, got)]
    assert len(got) == len(ref)
    for i, (g, r, t) in enumerate(zip(got, ref, truth)):
        assert g.shape == r.shape and g.dtype == r.dtype, f"out[{i}]: {g.shape} {g.dtype} vs {r.shape} {r.dtype}"
        mismatch = compare(f"out[{i}]", g, r, t)
        assert mismatch is None, mismatch.describe()
    return got


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward(shape, dtype, device):
    check_seed("rmsnorm_fwd.py", rmsnorm, {"M": shape[0], "N": shape[1]}, dtype, "normal", device)


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_forward_distributions(distribution, device):
    check_seed("rmsnorm_fwd.py", rmsnorm, {"M": 19, "N": 300}, torch.bfloat16, distribution, device)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_residual(shape, dtype, device):
    check_seed("rmsnorm_residual_fwd.py", rmsnorm_residual, {"M": shape[0], "N": shape[1]}, dtype, "normal", device)


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_residual_distributions(distribution, device):
    check_seed("rmsnorm_residual_fwd.py", rmsnorm_residual, {"M": 19, "N": 300}, torch.bfloat16, distribution,
               device)


@pytest.mark.parametrize("shape", BWD_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward(shape, dtype, device):
    check_seed("rmsnorm_bwd.py", rmsnorm_bwd, {"M": shape[0], "N": shape[1]}, dtype, "normal", device)


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_backward_distributions(distribution, device):
    check_seed("rmsnorm_bwd.py", rmsnorm_bwd, {"M": 53, "N": 300}, torch.bfloat16, distribution, device)


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("rows,per_sm", [(1, 10), (2, 3), (4, 1)])
def test_backward_grid_variants_agree_with_reference(rows, per_sm, prefetch, device):
    # 40 programs exceed one 32-row step of the partial-sum kernel; rows > 1 leaves a ragged last step.
    torch.manual_seed(1)
    x = torch.randn(83, 200, device=device)
    dy = torch.randn(83, 200, device=device)
    w = torch.randn(200, device=device)
    dx, dw = rmsnorm.rmsnorm_bwd(x, w, dy, 1e-6, rows=rows, programs_per_sm=per_sm, prefetch=prefetch)
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    dx_t, dw_t = torch.autograd.grad(torch.nn.functional.rms_norm(xr, (200,), wr, 1e-6), (xr, wr), dy.double())
    for name, got, t in (("dx", dx, dx_t), ("dw", dw, dw_t)):
        mismatch = compare(name, got, t.float(), t)
        assert mismatch is None, mismatch.describe()


def test_backward_is_bitwise_reproducible(device):
    torch.manual_seed(2)
    x, dy = torch.randn(2, 61, 96, device=device, dtype=torch.bfloat16).unbind(0)
    w = torch.randn(96, device=device, dtype=torch.bfloat16)
    a = rmsnorm.rmsnorm_bwd(x, w, dy, 1e-6)
    b = rmsnorm.rmsnorm_bwd(x, w, dy, 1e-6)
    assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_autograd_function_matches_torch_on_3d_input(device):
    torch.manual_seed(3)
    x = torch.randn(2, 5, 64, device=device, dtype=torch.float32, requires_grad=True)
    w = torch.randn(64, device=device, dtype=torch.float32, requires_grad=True)
    dy = torch.randn(2, 5, 64, device=device)
    y = rmsnorm.RMSNormFunction.apply(x, w, 1e-6)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y_t = torch.nn.functional.rms_norm(xr, (64,), wr, 1e-6)
    dx_t, dw_t = torch.autograd.grad(y_t, (xr, wr), dy.double())
    for name, got, t in (("y", y, y_t), ("dx", dx, dx_t), ("dw", dw, dw_t)):
        mismatch = compare(name, got.detach(), t.float(), t)
        assert mismatch is None, mismatch.describe()


def test_rejects_mismatched_weight(device):
    with pytest.raises(ValueError, match="does not match the last dimension"):
        rmsnorm.rmsnorm_fwd(torch.randn(4, 8, device=device), torch.ones(7, device=device), 1e-6)


def test_sum_partials_over_several_steps(device):
    from seeds._common import sum_partials
    torch.manual_seed(4)
    part, part2 = torch.randn(2, 300, 45, device=device).unbind(0)  # 300 partial rows: three steps of 128
    out = torch.empty(45, dtype=torch.bfloat16, device=device)
    out2 = torch.empty(45, device=device)
    sum_partials(part, out, part2, out2)
    for name, got, t in (("out", out, part.double().sum(0)), ("out2", out2, part2.double().sum(0))):
        mismatch = compare(name, got, t.to(got.dtype), t)
        assert mismatch is None, mismatch.describe()


# The fused residual's one-row kernel under each option of softmax_bwd.RowVariant (chunk excepted): on the CPU,
# sm_count is 4, so the persistent grids (8 and 4 programs) walk several rows each.
RESIDUAL_VARIANTS = [
    RowVariant(),
    RowVariant(num_warps=4, load_policy="evict_first", store_cache=".cs"),
    RowVariant(programs_per_sm=2),
    RowVariant(programs_per_sm=1, prefetch=True, maxnreg=64),
]


@pytest.mark.parametrize("shape", [(37, 129), (16, 64), (5, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", RESIDUAL_VARIANTS, ids=repr)
def test_residual_row_kernel_variants(variant, dtype, shape, device):
    torch.manual_seed(7)
    x, r = (2 * torch.randn(2, *shape, device=device)).to(dtype).unbind(0)
    w = (1 + 0.1 * torch.randn(shape[1], device=device)).to(dtype)
    y, h = rmsnorm_residual.rmsnorm_residual_rows(x, r, w, 1e-6, variant)
    # (The interpreter rounds fp32 to bf16 by truncation, so h is compared within tolerance here; on the GPU
    # benchmarks/sweep_norms.py requires it to equal x + residual bit for bit.)
    h_t = x.double() + r.double()
    y_t = torch.nn.functional.rms_norm(h.double(), (shape[1],), w.double(), 1e-6)
    y_ref, h_ref = rmsnorm.rmsnorm_residual_fwd(x, r, w, 1e-6)
    for name, got, ref, t in (("h", h, h_ref, h_t), ("y", y, y_ref, y_t)):
        mismatch = compare(name, got, ref, t)
        assert mismatch is None, mismatch.describe()


def test_residual_model_new_runs_the_variant(device):
    torch.manual_seed(8)
    x, r = torch.randn(2, 11, 48, device=device, dtype=torch.bfloat16).unbind(0)
    outs = [rmsnorm_residual.ModelNew(48, 1e-6, variant)(x, r) for variant in (None, RowVariant(programs_per_sm=1))]
    h_t = x.double() + r.double()
    for y, h in outs:
        y_t = torch.nn.functional.rms_norm(h.double(), (48,), None, 1e-6)
        for name, got, t in (("h", h, h_t), ("y", y, y_t)):
            mismatch = compare(name, got, t.to(got.dtype), t)
            assert mismatch is None, mismatch.describe()


def test_residual_row_kernel_refuses_chunks(device):
    x = torch.randn(3, 32, device=device)
    with pytest.raises(ValueError, match="chunk must be 0"):
        rmsnorm_residual.rmsnorm_residual_rows(x, x, torch.ones(32, device=device), 1e-6, RowVariant(chunk=16))
