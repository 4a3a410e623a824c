"""SwiGLU / GeGLU seeds (tanh and erf) against the task references, through the Triton interpreter."""
import copy
import importlib
from pathlib import Path

import pytest
import torch

from sandbox.task import load_task
from sandbox.tolerance import compare

TASKS = Path(__file__).resolve().parent.parent / "tasks"
CASES = [  # (task, seed module)
    ("swiglu_fwd.py", "seeds.swiglu"), ("swiglu_bwd.py", "seeds.swiglu_bwd"),
    ("geglu_fwd.py", "seeds.geglu"), ("geglu_bwd.py", "seeds.geglu_bwd"),
    ("geglu_erf_fwd.py", "seeds.geglu"), ("geglu_erf_bwd.py", "seeds.geglu_bwd"),
]
SHAPES = [(1, 1), (3, 37), (17, 300), (64, 129)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _check(task_file, seed_mod, shape, dtype, dist, device):
    task = load_task(TASKS / task_file).with_constants({"M": shape[0], "N": shape[1]})
    model = task.make_reference(0, device)
    new = importlib.import_module(seed_mod).ModelNew(*task.init_inputs()).to(device)
    inputs = [x.to(dtype) for x in task.make_inputs(1, dist, device)]
    got = new(*inputs)
    ref = model(*inputs)
    truth = copy.deepcopy(model).double()(*[x.double() for x in inputs])
    got, ref, truth = [list(o) if isinstance(o, tuple) else [o] for o in (got, ref, truth)]
    for i, (g, r, t) in enumerate(zip(got, ref, truth)):
        assert g.dtype == r.dtype and g.shape == r.shape
        bad = compare(f"out[{i}]", g, r, t)
        assert bad is None, bad.describe()


@pytest.mark.parametrize("task_file,seed_mod", CASES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_glu_shapes_dtypes(task_file, seed_mod, shape, dtype, device):
    _check(task_file, seed_mod, shape, dtype, "normal", device)


@pytest.mark.parametrize("task_file,seed_mod", CASES)
@pytest.mark.parametrize("dist", ["uniform", "large", "outliers", "constant_rows"])
def test_glu_distributions(task_file, seed_mod, dist, device):
    _check(task_file, seed_mod, (13, 257), torch.bfloat16, dist, device)


def test_glu_block_variants_agree(device):
    from seeds.swiglu import glu_bwd, glu_fwd
    a, b, dy = (torch.randn(5, 999, device=device) for _ in range(3))
    y = glu_fwd(a, b, "silu")
    for block, warps in ((256, 4), (1024, 4), (4096, 8)):
        assert torch.equal(glu_fwd(a, b, "silu", block, warps), y)
        da, db = glu_bwd(a, b, dy, "tanh", block, warps)
        assert torch.equal(da, glu_bwd(a, b, dy, "tanh")[0]) and torch.equal(db, glu_bwd(a, b, dy, "tanh")[1])


@pytest.mark.parametrize("act", ["silu", "tanh", "none"])
def test_glu_lean_forward_agrees(act, device):
    """lean (32-bit offsets, no masks where the blocks divide the tensor) gives the default's bits, on a tensor the
    blocks divide (unmasked) and on one they do not (masked tail); bf16 so the rounding path is the task's."""
    from seeds.swiglu import glu_fwd
    for shape in ((8, 512), (5, 999)):
        a, b = (torch.randn(*shape, device=device).to(torch.bfloat16) for _ in range(2))
        y = glu_fwd(a, b, act, lean=False)
        assert torch.equal(glu_fwd(a, b, act), y), shape  # lean is the default
        for block, warps in ((256, 4), (1024, 4)):
            assert torch.equal(glu_fwd(a, b, act, block, warps, lean=True), y), (shape, block)


def test_glu_rejects_mismatched_inputs():
    from seeds.swiglu import glu_fwd
    with pytest.raises(ValueError, match="share shape"):
        glu_fwd(torch.randn(4, 8), torch.randn(4, 9))
    with pytest.raises(ValueError, match="activation"):
        glu_fwd(torch.randn(4, 8), torch.randn(4, 8), "relu")
