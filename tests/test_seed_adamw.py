"""AdamW seed against the task reference (torch's AdamW update written out) and torch.optim.AdamW itself, through
the Triton interpreter."""
import copy
from pathlib import Path

import pytest
import torch

from sandbox.task import load_task
from sandbox.tolerance import compare
from seeds.adamw import ModelNew, adamw_step

TASKS = Path(__file__).resolve().parent.parent / "tasks"
SIZES = [  # N0..N3
    {"N0": 1, "N1": 1, "N2": 1, "N3": 1}, {"N0": 4099, "N1": 257, "N2": 17, "N3": 2},
    {"N0": 30000, "N1": 4096, "N2": 31, "N3": 1000},
]


def _run(consts, grad_dtype, dist, device):
    task = load_task(TASKS / "adamw.py").with_constants(consts)
    model = task.make_reference(0, device)
    new = ModelNew(*task.init_inputs())
    inputs = task.make_inputs(4, dist, device)
    n = (len(inputs) - 1) // 4
    inputs = [x.to(grad_dtype) if n <= i < 2 * n else x for i, x in enumerate(inputs)]
    pristine = [x.clone() for x in inputs]
    got = new(*inputs)
    ref = model(*inputs)
    truth = copy.deepcopy(model).double()(*[x.double() for x in inputs])
    assert all(torch.equal(a, b) for a, b in zip(inputs, pristine)), "the task's forward must not touch its inputs"
    assert len(got) == len(ref) == 4 * n
    for i, (g, r, t) in enumerate(zip(got, ref, truth)):
        assert g.dtype == r.dtype and g.shape == r.shape
        bad = compare(f"out[{i}]", g, r, t)
        assert bad is None, bad.describe()


@pytest.mark.parametrize("consts", SIZES)
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_adamw_sizes_grad_dtypes(consts, grad_dtype, device):
    _run(consts, grad_dtype, "normal", device)


@pytest.mark.parametrize("dist", ["uniform", "large", "outliers", "constant_rows"])
def test_adamw_distributions(dist, device):
    _run(SIZES[1], torch.float32, dist, device)


def test_adamw_matches_torch_optim_over_steps(device):
    """Three in-place steps track torch.optim.AdamW (foreach=False) step for step."""
    g = torch.Generator().manual_seed(0)
    shapes = [(33, 7), (129,), (1,)]
    params = [torch.randn(s, generator=g).to(device) for s in shapes]
    ref = [p.clone().requires_grad_() for p in params]
    opt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False)
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for step in range(1, 4):
        grads = [torch.randn(p.shape, generator=g).to(device) for p in params]
        for r, gr in zip(ref, grads):
            r.grad = gr.clone()
        opt.step()
        _, _, _, p16 = adamw_step(params, grads, m, v, torch.tensor(float(step), device=device), 1e-2, (0.9, 0.95),
                                  1e-8, 0.1)
        for p, r, h in zip(params, ref, p16):
            torch.testing.assert_close(p, r.detach(), rtol=2e-6, atol=2e-7)
            # Within one bf16 step: the interpreter rounds fp32 -> bf16 by truncation, the GPU to nearest.
            torch.testing.assert_close(h.float(), p.to(torch.bfloat16).float(), rtol=8e-3, atol=0)


def test_adamw_rejects_bad_state():
    with pytest.raises(ValueError, match="float32"):
        adamw_step([torch.zeros(3, dtype=torch.bfloat16)], [torch.zeros(3)], [torch.zeros(3)], [torch.zeros(3)],
                   torch.tensor(1.0))
    with pytest.raises(ValueError, match="grads"):
        adamw_step([torch.zeros(3)], [], [torch.zeros(3)], [torch.zeros(3)], torch.tensor(1.0))
