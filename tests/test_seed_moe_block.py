"""The MoE block's forward+backward seed (seeds/moe_block.py) against tasks/moe_block_fwd_bwd.py's autograd reference,
through the Triton interpreter at small shapes: odd sizes, top-3, an expert every token takes, an expert none takes,
the input distributions whose errors only track PyTorch's where the rounding points do, and fp32 for a tight check of
the router's backward."""
import copy
from pathlib import Path

import pytest
import torch

from sandbox.task import load_task
from sandbox.tolerance import compare

TASK = Path(__file__).resolve().parent.parent / "tasks" / "moe_block_fwd_bwd.py"
OUTPUTS = ("y", "dx", "dlogits", "dw1", "dw3", "dw2")


def _task(t, e, k, h, f):
    return load_task(TASK).with_constants({"T": t, "EXPERTS": e, "TOP_K": k, "H": h, "FFN": f})


def _check(task, inputs, device, dtype=torch.bfloat16):
    """The seed's six outputs against the reference's and the float64 truth, with the harness's tolerances."""
    from seeds.moe_block import ModelNew
    ref = task.make_reference(0, device)
    new = ModelNew(*task.init_inputs()).to(device)
    new.load_state_dict(ref.state_dict())
    if dtype != torch.bfloat16:
        ref, new = ref.to(dtype), new.to(dtype)
        inputs = [x.to(dtype) for x in inputs]
    got = new(*inputs)
    want = ref(*inputs)
    truth = copy.deepcopy(ref).double()(*[x.double() for x in inputs])
    for name, g, r, t in zip(OUTPUTS, got, want, truth):
        assert g.dtype == r.dtype and g.shape == r.shape and g.is_contiguous(), (name, g.dtype, g.shape)
        bad = compare(name, g, r, t)
        assert bad is None, bad.describe()
    return got


@pytest.mark.parametrize("t,e,k,h,f", [(64, 4, 2, 64, 96), (37, 8, 2, 33, 29), (1, 8, 2, 40, 48),
                                       (23, 6, 3, 16, 40)])
def test_block_matches_reference(t, e, k, h, f, device):
    task = _task(t, e, k, h, f)
    _check(task, task.make_inputs(3, "normal", device), device)


@pytest.mark.parametrize("dist", ["constant_rows", "outliers", "large"])
def test_block_distributions(dist, device):
    """On constant rows the errors are no longer independent across a row, and an output whose rounding points
    differ from the reference's misses the harness's tolerance where PyTorch's own error happens to be small: here
    h = silu(g) u rounded once (y misses) or dg = dh u silu'(g) rounded once (dx misses)."""
    task = _task(128, 8, 2, 256, 224)
    _check(task, task.make_inputs(11, dist, device), device)


def _skewed_logits(t, e, seed):
    """Tie-free grid logits where expert 0 is every token's first choice and expert e-1 nobody's."""
    logits = load_task(TASK).module.router_logits(t, e)
    g = torch.Generator().manual_seed(seed)
    for row in logits:
        order = torch.randperm(e - 2, generator=g) + 1
        values = row.sort(descending=True).values
        row[0], row[e - 1] = values[0], values[-1]
        row[order] = values[1:-1]
    return logits


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_uneven_loads_and_an_empty_expert(dtype, device):
    """Expert 0 carries every token, the last expert none: its gradients are exactly zero, the others' match; in fp32
    the router's backward (dlogits through the renormalised top-k softmax) is held to fp32's tolerance."""
    t, e = 45, 6
    task = _task(t, e, 2, 48, 40)
    x, _, dy = task.make_inputs(5, "normal", device)
    logits = _skewed_logits(t, e, 5).to(device)
    ids = logits.float().topk(2, dim=1).indices
    assert (ids[:, 0] == 0).all() and not (ids == e - 1).any()
    y, dx, dlogits, dw1, dw3, dw2 = _check(task, [x, logits, dy], device, dtype)
    assert all((w[e - 1] == 0).all() for w in (dw1, dw3, dw2))
    assert all((w[0] != 0).any() for w in (dw1, dw3, dw2))


def test_block_is_deterministic_and_tma_matches_pointer(device):
    """Two runs agree bitwise, and so do the pointer kernels and the TMA kernels (small tiles, so that the transposed
    weights of the backward's products are read by TMA too)."""
    from seeds.moe_block import moe_block_backward, moe_block_forward
    task = _task(50, 8, 2, 48, 32)
    model = task.make_reference(0, device)
    x, logits, dy = task.make_inputs(1, "normal", device)
    weights = [w.detach() for w in (model.w1, model.w3, model.w2)]

    def run(**variant):
        y, saved = moe_block_forward(x, logits, *weights, 2, config=(16, 16, 16, 4, 1, 2), **variant)
        return [y, *moe_block_backward(saved, dy)]

    want = run(impl="ptr")
    for got in (run(impl="ptr"), run(impl="tma")):
        for name, g, w in zip(OUTPUTS, got, want):
            assert torch.equal(g.view(torch.int16), w.view(torch.int16)), name


def test_positions_name_each_routed_row_by_its_place(device):
    from seeds.moe import align_block_size, by_position
    ids = torch.tensor([[2, 0], [2, 1], [0, 2], [2, 1], [1, 0]], dtype=torch.int32, device=device)
    layout = align_block_size(ids, 4, 16)
    pos = by_position(layout)
    n = layout.sorted_ids.numel()
    routed = layout.sorted_ids < layout.n_valid
    assert pos.sorted_ids.tolist() == torch.where(routed, torch.arange(n, device=device), n).tolist()
    assert pos.n_valid == n and pos.contiguous
    assert pos.expert_offset.tolist() == layout.expert_start.tolist() == [0, 16, 32, 48]
    assert pos.expert_count.tolist() == [3, 3, 4, 0]


def test_bad_inputs_are_refused(device):
    from seeds.moe_block import moe_block_backward, moe_block_forward
    x = torch.randn(4, 8, dtype=torch.bfloat16, device=device)
    w1 = torch.randn(3, 6, 8, dtype=torch.bfloat16, device=device)
    w2 = torch.randn(3, 8, 6, dtype=torch.bfloat16, device=device)
    logits = torch.randn(4, 3, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="router logits"):
        moe_block_forward(x, logits[:, :2], w1, w1, w2, 2)
    with pytest.raises(ValueError, match="do not fit"):
        moe_block_forward(x, logits, w1, w1[:, :5], w2, 2)
    with pytest.raises(ValueError, match="top_k"):
        moe_block_forward(x, logits, w1, w1, w2, 4)
    _, saved = moe_block_forward(x, logits, w1, w1, w2, 2)
    with pytest.raises(ValueError, match="dy"):
        moe_block_backward(saved, x[:3])
