"""The whole `crucible model` flow on the CPU, through Triton's interpreter, on the tiny Llama and Mixtral presets
made smaller still (`smaller`): find the regions, write their task files (each loads and passes `check --reference`),
have the harness check the kernels at the model's shapes and patch them in, compare every parameter's gradient with
eager's, train a few steps and compare the losses with eager's."""
import copy
import dataclasses

import pytest
import torch

import patching
from patching.find import find_regions
from patching.modelfile import ModelFileError, load_model_file
from patching.optimizer import AdamW
from patching.records import Kind, Outcome
from patching.steps import loss_gap, train_losses
from sandbox.reference import check_task
from sandbox.task import load_task

# bf16 training, 3 AdamW steps at lr 1e-3 on a 4.9 loss: the eager and patched curves round differently inside
# the ops (fp32 in the kernels, bf16 between them) and in the optimizer (crucible's fp32 step against torch's bf16
# foreach ops), measured under 1e-4 apart here; 2e-3 is 20x that. It does not catch a wrong gradient: zeroing,
# halving or doubling any one parameter's gradient moved the gap by 1.3e-3 at most (measured), so the gradients
# are compared too, each parameter's against eager's on one batch: measured 1.8% (Llama) and 2.4% (Mixtral) apart
# at most (eager's bf16 against the kernels' fp32 inside), where a halved, doubled or missing one is 50-100% off.
LOSS_BOUND = 2e-3
GRAD_BOUND = 0.1
STEPS = 3


def smaller(spec):
    """The model file's "tiny" preset (hidden 64, 2 layers, 4 experts) at smaller sizes, for the tests that patch and
    train it through the interpreter, whose time follows the programs each kernel launches (the fused AdamW's follow
    the parameter count: most of a step): hidden 32 in 2 query heads and 1 key/value head of 16 (still GQA), FFN 64
    (a Mixtral expert's 32), a vocabulary of 128, 8 tokens a row. Still 2 layers (each region spans several modules),
    4 experts top-2, every region kind and kernel of the preset, at a fifth to a quarter of its parameters."""
    cfg = spec.module.PRESETS["tiny"]
    spec.module.PRESETS["tiny"] = dataclasses.replace(  # this load's own module: the shipped preset is untouched
        cfg, vocab=128, hidden=32, heads=2, kv_heads=1, head_dim=16, seq=8, ffn=32 if hasattr(cfg, "experts") else 64)
    return spec


@pytest.mark.slow
@pytest.mark.parametrize("name, expected", [
    ("llama", {Kind.RMSNORM, Kind.ROPE, Kind.ATTENTION, Kind.SWIGLU, Kind.LM_LOSS}),
    ("mixtral", {Kind.RMSNORM, Kind.ROPE, Kind.ATTENTION, Kind.SWIGLU, Kind.LM_LOSS, Kind.MOE}),
])
def test_match_extract_patch_train(name, expected, tmp_path):
    spec = smaller(load_model_file(f"models/{name}.py", "tiny"))
    model, inputs = spec.build(), spec.inputs()
    eager = copy.deepcopy(model)

    report = patching.patch(model, inputs, name=spec.name, workdir=tmp_path)

    assert {r.region.kind for r in report.results} == expected
    for result in report.results:
        for task in result.tasks:  # every written task file loads at the model's shape and is a usable task
            loaded = load_task(task.path, rescale=False)
            assert all(loaded.current_constants()[k] == v for k, v in result.region.constants.items()
                       if k in loaded.constants)
            check_task(loaded, "cpu")
        assert result.outcome is Outcome.PATCHED, result.reason
        assert all(v.accepted for v in result.verdicts)
    assert report.unmatched.get("Linear", 0) > 0  # the projections stay PyTorch's, and are listed as such
    gaps = grad_gaps(model, eager, inputs)
    assert gaps and max(gaps.values()) < GRAD_BOUND, sorted(gaps.items(), key=lambda kv: -kv[1])[:4]

    batch = lambda step: spec.inputs(seed=step)  # noqa: E731
    # the patched model trains with crucible's AdamW (the fused bf16 step), eager with torch's
    opt, adamw = patching.adamw(model, lr=1e-3, weight_decay=0.0, workdir=tmp_path / "adamw")
    assert isinstance(opt, AdamW) and adamw.patched, adamw.reason
    want, got = train_losses(eager, batch, STEPS), train_losses(model, batch, STEPS, optimizer=AdamW)
    assert loss_gap(want, got) < LOSS_BOUND, (want, got)
    counts = patching.call_counts(model)
    blocks = [m for r in report.results if r.region.kind is Kind.MOE for m in r.region.modules]
    inside = {m for m in counts if any(m.startswith(b + ".") for b in blocks)}
    assert counts and all(calls > 0 and fallbacks == 0 for m, (calls, fallbacks) in counts.items()
                          if m not in inside), counts
    # the experts' SwiGLU runs inside the MoE blocks' kernel: patched (for a block's fallback), never called
    assert all(counts[m] == (0, 0) for m in inside) and bool(inside) == (name == "mixtral"), counts
    swiglu = next(r for r in report.results if r.region.kind is Kind.SWIGLU)
    assert ("inside the patched MoE blocks" in swiglu.reason) == (name == "mixtral"), swiglu.reason
    # the patched model's gradients reach every parameter (but an expert no token was routed to) and are finite
    model(*inputs).backward()
    for pname, p in model.named_parameters():
        assert ".experts." in pname or p.grad is not None, pname
        assert p.grad is None or torch.isfinite(p.grad.float()).all(), pname


def grad_gaps(model: torch.nn.Module, eager: torch.nn.Module, inputs) -> dict[str, float]:
    """Each parameter's gradient of the patched model against eager's on the same batch, as the relative L2 error;
    the gradients are cleared again (training starts from none)."""
    for m in (model, eager):
        m(*inputs).backward()
    gaps = {}
    for (name, p), (_, q) in zip(model.named_parameters(), eager.named_parameters()):
        g, w = p.grad, q.grad
        if w is None or not w.float().norm():  # an expert no token was routed to: none or zero on both sides
            assert g is None or not g.float().norm(), name
        else:
            gaps[name] = _rel(g, w)
        p.grad = q.grad = None
    return gaps


class _Refused(torch.nn.Module):
    def forward(self, *args):
        raise AssertionError("the fwd+bwd kernel ran in an inference call")


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.detach().float() - want.float()).norm() / want.float().norm())


def test_patched_moe_block_at_another_token_count():
    """A MoE block with the seeds installed for 32 tokens, called at 15: served by the kernels, without gradients by
    the forward kernel alone; output and gradients agree with the block's own forward (the per-expert loop) to bf16
    precision; between the forward and the backward the kernels hold no stacked copy of the weights."""
    from models.layers import init_weights
    from models.mixtral import SparseMoE
    from patching.find import READERS
    from patching.functions import Installed, install
    from seeds import moe_block, moe_layer

    moe = SparseMoE(64, 96, 4, 2, torch.bfloat16)
    init_weights(moe, 0.02, 0)
    own = copy.deepcopy(moe)
    key = READERS[Kind.MOE](moe, (torch.zeros(32, 64, dtype=torch.bfloat16),))[1]
    kernels = {"forward": moe_layer.ModelNew(64, 96, 4, 2), "backward": moe_block.ModelNew(64, 96, 4, 2)}
    install(moe, inst := Installed(Kind.MOE, key, dict(kernels)))
    inst.kernels["backward"] = _Refused()
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with torch.no_grad():
        assert _rel(moe(x), own(x)) < 1e-2
    inst.kernels["backward"] = kernels["backward"]
    x.requires_grad_()
    y = moe(x)
    # the stacked weights are not kept for the backward, nor the ones the kernels were built with
    assert all(p.numel() == 0 for k in kernels.values() for p in k.parameters())
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    got = torch.autograd.grad(y, [x, *moe.parameters()], dy)
    want = torch.autograd.grad(own(x), [x, *own.parameters()], dy, allow_unused=True)
    for g, w in zip(got, want):  # an expert no token was routed to: no gradient, or a zero one
        assert (not g.any()) if w is None else _rel(g, w) < 2e-2
    assert (inst.calls, inst.fallbacks) == (2, 0)
    assert all(p.numel() == 0 for k in kernels.values() for p in k.parameters())


def test_unverified_shapes_fall_back_and_are_counted(tmp_path):
    """A call at a shape key the kernels were not checked at (another hidden size) runs the module's own forward."""
    from models.layers import RMSNorm
    from patching.functions import Installed, install

    norm = RMSNorm(64, 1e-6, torch.bfloat16)
    inst = Installed(Kind.RMSNORM, (32,), {"forward": torch.nn.Linear(1, 1), "backward": torch.nn.Linear(1, 1)})
    install(norm, inst)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(norm(x), torch.nn.functional.rms_norm(x, (64,), norm.weight, 1e-6))
    assert (inst.calls, inst.fallbacks) == (0, 1)


def test_regions_carry_the_forward_shapes():
    spec = load_model_file("models/llama.py", "tiny")
    cfg = spec.module.PRESETS["tiny"]
    regions, misfits = find_regions(spec.build(), spec.inputs())
    by_kind = {r.kind: r for r in regions}
    tokens = cfg.batch * cfg.seq
    assert by_kind[Kind.RMSNORM].constants == {"M": tokens, "N": cfg.hidden}
    assert len(by_kind[Kind.RMSNORM].modules) == 2 * cfg.layers + 1
    assert by_kind[Kind.ROPE].constants == {"B": cfg.batch, "T": cfg.seq, "HQ": cfg.heads, "HK": cfg.kv_heads,
                                            "D": cfg.head_dim}
    assert by_kind[Kind.LM_LOSS].constants == {"BT": tokens, "H": cfg.hidden, "V": cfg.vocab}
    assert by_kind[Kind.RMSNORM].floats == {"EPS": cfg.eps}
    assert misfits == {}


def test_bad_model_files_end_in_one_sentence(tmp_path):
    with pytest.raises(ModelFileError, match="does not exist"):
        load_model_file(tmp_path / "none.py")
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ModelFileError, match="does not define PRESETS, get_model, get_inputs"):
        load_model_file(empty)
    with pytest.raises(ModelFileError, match="no preset 'huge'"):
        load_model_file("models/llama.py", "huge")
