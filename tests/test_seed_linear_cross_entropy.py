"""The vocab-outer form of the fused linear + cross-entropy seed (seeds/linear_cross_entropy.py) against the task's
reference through the Triton interpreter: chunks in dweight's tail and in the workspace, the stored first chunk,
ignore_index, label smoothing, mean/sum. (tests/test_seed_cross_entropy.py covers ModelNew and the token form.)"""
import copy
from pathlib import Path

import pytest
import torch

from sandbox.task import load_task
from sandbox.tolerance import compare
from seeds.linear_cross_entropy import linear_cross_entropy_fwd_bwd, vocab_chunks

TASK = Path(__file__).resolve().parent.parent / "tasks" / "linear_cross_entropy.py"


def _check(got, model, x, target):
    ref = model(x, target)
    truth = copy.deepcopy(model).double()(x.double(), target)
    for name, g, r, t in zip(("loss", "dx", "dweight"), got, ref, truth):
        assert g.dtype == r.dtype and g.shape == r.shape, (name, g.dtype, r.dtype, g.shape, r.shape)
        bad = compare(name, g, r, t)
        assert bad is None, bad.describe()


def _case(bt, h, v, dtype, dist, smoothing=0.0, reduction="mean", seed=3, device="cpu"):
    task = load_task(TASK).with_constants({"BT": bt, "H": h, "V": v})
    model = task.module.Model(h, v, -100, smoothing, reduction).to(device=device, dtype=dtype)
    x, target = task.make_inputs(seed, dist, device)
    target[::5] = -100
    return model, x.to(dtype), target


# (BT, H, V, workspace bytes): None = the default (everything in one workspace chunk at these sizes); small
# workspaces force chunks in dweight's tail (the first one holding pass 1's logits) and then workspace chunks.
CASES = [(1, 16, 1, None), (7, 24, 37, None), (33, 40, 301, 33 * 2 * 16), (64, 16, 97, 1), (70, 32, 129, 70 * 2 * 9)]


@pytest.mark.parametrize("bt,h,v,workspace", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_vocab_form(bt, h, v, workspace, dtype, device):
    model, x, target = _case(bt, h, v, dtype, "normal", device=device)
    got = linear_cross_entropy_fwd_bwd(x, model.weight.detach(), target, -100, 0.0, "mean", workspace=workspace)
    _check(got, model, x, target)


@pytest.mark.parametrize("dist", ["uniform", "large", "outliers", "constant_rows"])
@pytest.mark.parametrize("smoothing,reduction", [(0.0, "sum"), (0.1, "mean"), (0.2, "sum")])
def test_vocab_form_options(dist, smoothing, reduction, device):
    model, x, target = _case(29, 24, 211, torch.bfloat16, dist, smoothing, reduction, seed=4, device=device)
    got = linear_cross_entropy_fwd_bwd(x, model.weight.detach(), target, -100, smoothing, reduction,
                                       workspace=29 * 2 * 12)
    _check(got, model, x, target)


@pytest.mark.parametrize("store_first", [True, False])
def test_vocab_form_agrees_with_token_form(store_first, device):
    """Both forms, with and without pass 1's stored logits, give the same loss and gradients in fp32."""
    model, x, target = _case(45, 32, 173, torch.float32, "outliers", 0.1, "mean", seed=5, device=device)
    w = model.weight.detach()
    vocab = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "mean", workspace=45 * 4 * 8,
                                         store_first=store_first)
    token = linear_cross_entropy_fwd_bwd(x, w, target, -100, 0.1, "mean", form="token", chunk=16)
    for a, b in zip(vocab, token):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    _check(vocab, model, x, target)


def test_vocab_form_all_ignored_rows_give_zero_gradients(device):
    model, x, target = _case(9, 16, 50, torch.float32, "normal", 0.0, "sum", device=device)
    target[:] = -100
    target[4] = 7
    loss, dx, dw = linear_cross_entropy_fwd_bwd(x, model.weight.detach(), target, -100, 0.0, "sum", workspace=9 * 4)
    assert torch.count_nonzero(dx[:4]) == 0 and torch.count_nonzero(dx[5:]) == 0
    _check((loss, dx, dw), model, x, target)


@pytest.mark.parametrize("bt,h,v,ws_cols", [(8192, 4096, 128256, 3072), (37, 24, 300, 16), (5, 3, 1000, 1),
                                            (1, 16, 1, 1)])
def test_vocab_chunks_plan(bt, h, v, ws_cols):
    """Chunks tile [0, V) in order; a chunk kept in dweight's tail never overlaps rows already or now written."""
    chunks = vocab_chunks(bt, h, v, ws_cols)
    assert chunks[0][0] == 0 and chunks[-1][1] == v
    for (a0, a1, start), (b0, _, _) in zip(chunks, chunks[1:] + [(v, v, -1)]):
        assert a1 == b0 and a1 > a0
        if start >= 0:
            assert a1 * h <= start and start + (a1 - a0) * bt <= v * h
        else:
            assert a1 - a0 <= max(1, ws_cols)
    if bt == 8192:  # the task's shape: a third of the vocabulary first, then ~2/3 of the rest each time
        assert chunks[0][1] == 42752 and len(chunks) <= 12


def test_rejects_bad_form():
    with pytest.raises(ValueError, match="form"):
        linear_cross_entropy_fwd_bwd(torch.randn(2, 4), torch.randn(3, 4), torch.zeros(2, dtype=torch.long),
                                     form="vocabulary")
