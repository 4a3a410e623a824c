"""The patched autograd Functions' memory-saving paths: the LM loss scales its saved gradients in place, and a seed's
SwiGLU backward writes its gradients over the saved inputs; both give the gradients the plain paths give, and a graph
that still needs the overwritten tensors fails loudly instead of reading gradients as activations."""
import pytest
import torch
import torch.nn as nn

from patching.functions import _LMLoss, _SwiGLU
from seeds.swiglu_bwd import ModelNew as SwiGLUBwd


class _Fwd(nn.Module):
    def forward(self, a, b):
        return torch.nn.functional.silu(a.float()).mul(b.float()).to(a.dtype)


def _swiglu_grads(device: str, seed: bool, use_a_again: bool = False):
    torch.manual_seed(0)
    a = torch.randn(4, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    b = torch.randn(4, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    bwd = SwiGLUBwd()
    object.__setattr__(bwd, "crucible_seed", seed)
    a1, b1 = a * 1, b * 1  # the saved tensors are these, as a projection's outputs in a model
    # another op that saved a1, earlier in the graph: its backward runs after the SwiGLU's
    extra = a1 * a1 if use_a_again else None
    y = _SwiGLU.apply(a1, b1, _Fwd(), bwd)
    if extra is not None:
        y = y + extra
    y.float().pow(2).sum().backward()
    return a.grad, b.grad


def test_a_seeds_in_place_swiglu_backward_gives_the_same_gradients(device):
    da, db = _swiglu_grads(device, seed=True)
    da0, db0 = _swiglu_grads(device, seed=False)
    assert torch.equal(da, da0) and torch.equal(db, db0)


def test_an_overwritten_input_another_op_saved_fails_loudly(device):
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _swiglu_grads(device, seed=True, use_a_again=True)
    _swiglu_grads(device, seed=False, use_a_again=True)  # the plain path has nothing to overwrite


def test_only_a_seed_kernel_is_asked_to_work_in_place(device):
    calls = []

    class Archived(SwiGLUBwd):  # an archived winner may carry an in_place the harness never checked
        def in_place(self, a, b, dy):
            calls.append("in_place")
            return super().in_place(a, b, dy)
    a = torch.randn(2, 8, dtype=torch.bfloat16, device=device, requires_grad=True)
    b = torch.randn(2, 8, dtype=torch.bfloat16, device=device, requires_grad=True)
    bwd = Archived()
    object.__setattr__(bwd, "crucible_seed", False)
    _SwiGLU.apply(a * 1, b * 1, _Fwd(), bwd).float().sum().backward()
    assert calls == []


def test_the_lm_loss_scales_its_saved_gradients_in_place_and_autograd_keeps_them():
    x = torch.randn(6, 8, requires_grad=True)
    w = nn.Parameter(torch.randn(10, 8))
    made = {}

    def kernel(x, target):
        dx, dw = torch.ones_like(x), torch.full_like(w, 2.0)
        made["dw"] = dw.data_ptr()
        return torch.tensor(1.0), dx, dw
    (_LMLoss.apply(x, w, torch.zeros(6, dtype=torch.long), kernel) * 3).backward()
    assert torch.equal(w.grad, torch.full_like(w, 6.0)) and torch.equal(x.grad, torch.full_like(x, 3.0))
    assert w.grad.data_ptr() == made["dw"]  # no second [V, H] tensor: the saved one became the grad
