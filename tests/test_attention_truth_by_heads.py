"""The attention tasks' float64 truth runs a few heads at a time (the tasks' `_by_heads`), so that its [B, heads, S, S]
scores fit beside a search's other work: the same values as the whole computation, for the forward and the
backward, causal or not, with a head count that is not a multiple of the chunk."""
import pytest
import torch
import torch.nn.functional as F

from sandbox.task import load_task

TASKS = ["attention_fwd", "attention_fwd_causal", "attention_fwd_bwd", "attention_fwd_bwd_causal"]


def _whole(causal, q, k, v, do=None):
    if do is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return (o.detach(), *torch.autograd.grad(o, (q, k, v), do))


@pytest.mark.parametrize("name", TASKS)
def test_the_float64_truth_by_heads_equals_the_whole(name):
    from pathlib import Path
    task = load_task(Path(__file__).resolve().parent.parent / "tasks" / f"{name}.py")
    model = task.module.Model(*task.init_inputs()).double()
    assert task.module._TRUTH_HEADS < 5 and "_TRUTH_HEADS" not in task.constants
    gen = torch.Generator().manual_seed(0)
    n_in = 4 if "bwd" in name else 3
    xs = [torch.randn(2, 5, 48, 16, generator=gen, dtype=torch.float64) for _ in range(n_in)]
    got = model(*xs)
    want = _whole(model.causal, *xs)
    got, want = (list(t) if isinstance(t, tuple) else [t] for t in (got, want))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == torch.float64
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    low = model.float()(*(x.float() for x in xs))  # other dtypes: the whole computation, as before
    low = list(low) if isinstance(low, tuple) else [low]
    for g, w in zip(low, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-4)
