"""RoPE seeds (forward and backward, q and k with different head counts) against the task references, through the
Triton interpreter."""
import copy
import importlib
from pathlib import Path

import pytest
import torch

from sandbox.task import load_task
from sandbox.tolerance import compare

TASKS = Path(__file__).resolve().parent.parent / "tasks"
CASES = [("rope_fwd.py", "seeds.rope"), ("rope_bwd.py", "seeds.rope_bwd")]
SHAPES = [  # B, T, HQ, HK, D
    (1, 1, 1, 1, 2), (2, 7, 4, 1, 8), (1, 13, 5, 3, 6), (2, 17, 32, 8, 128), (1, 5, 3, 3, 20),
]


def _check(task_file, seed_mod, shape, dtype, dist, device):
    B, T, HQ, HK, D = shape
    task = load_task(TASKS / task_file).with_constants({"B": B, "T": T, "HQ": HQ, "HK": HK, "D": D})
    model = task.make_reference(0, device)
    new = importlib.import_module(seed_mod).ModelNew().to(device)
    inputs = [x.to(dtype) for x in task.make_inputs(3, dist, device)]
    got, ref = new(*inputs), model(*inputs)
    truth = copy.deepcopy(model).double()(*[x.double() for x in inputs])
    for i, (g, r, t) in enumerate(zip(got, ref, truth)):
        assert g.dtype == r.dtype and g.shape == r.shape
        bad = compare(f"out[{i}]", g, r, t)
        assert bad is None, bad.describe()


@pytest.mark.parametrize("task_file,seed_mod", CASES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rope_shapes_dtypes(task_file, seed_mod, shape, dtype, device):
    _check(task_file, seed_mod, shape, dtype, "normal", device)


@pytest.mark.parametrize("task_file,seed_mod", CASES)
@pytest.mark.parametrize("dist", ["uniform", "large", "outliers", "constant_rows"])
def test_rope_distributions(task_file, seed_mod, dist, device):
    _check(task_file, seed_mod, (2, 9, 6, 2, 16), torch.bfloat16, dist, device)


def test_rope_backward_is_the_adjoint(device):
    """<rope(x), y> == <x, rope_bwd(y)> for arbitrary (not Hugging Face-shaped) cos/sin tables."""
    from seeds.rope import rope
    g = torch.Generator().manual_seed(0)
    q, k, dq, dk = (torch.randn(2, 5, h, 12, generator=g, dtype=torch.float64).float().to(device) for h in (3, 2, 3, 2))
    cos, sin = (torch.randn(5, 12, generator=g).to(device) for _ in range(2))
    qo, ko = rope(q, k, cos, sin)
    gq, gk = rope(dq, dk, cos, sin, backward=True)
    lhs = (qo.double() * dq.double()).sum() + (ko.double() * dk.double()).sum()
    rhs = (q.double() * gq.double()).sum() + (k.double() * gk.double()).sum()
    assert abs(float(lhs - rhs)) <= 1e-4 * max(1.0, abs(float(lhs)))


def test_rope_rejects_bad_shapes():
    from seeds.rope import rope
    q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 1, 8)
    with pytest.raises(ValueError, match="cos and sin"):
        rope(q, k, torch.randn(4, 6), torch.randn(4, 6))
    with pytest.raises(ValueError, match="even"):
        rope(torch.randn(1, 4, 2, 7), torch.randn(1, 4, 1, 7), torch.randn(4, 7), torch.randn(4, 7))
