"""Hugging Face's MixtralForCausalLM (transformers 5: fused MixtralExperts routed by a MixtralTopKRouter, built from
a config with random weights) through the whole `crucible model` flow on the CPU, as tests/test_model_hf.py runs
its Llama: the regions at the model's shapes, their task files, the patch with every region's outcome, the
gradients of the fused experts' weights, and 3 AdamW steps of the patched model against eager's."""
import copy

import pytest
import torch

import patching
from patching.find import find_regions
from patching.optimizer import AdamW
from patching.records import Kind
from patching.steps import loss_gap, train_losses
from tests.test_model_hf import _tiny as tiny_hf
from tests.test_model_hf import assert_all_patched
from tests.test_model_patch import LOSS_BOUND, STEPS


def _tiny():
    return tiny_hf("models/hf_mixtral.py")


@pytest.mark.slow
def test_hf_mixtral_match_extract_patch_train(tmp_path):
    spec, cfg = _tiny()
    model, inputs = spec.build(), spec.inputs()
    eager = copy.deepcopy(model)

    report = patching.patch(model, inputs, name=spec.name, workdir=tmp_path)

    assert_all_patched(report, {Kind.RMSNORM, Kind.MOE, Kind.LM_LOSS})
    # left to PyTorch: the attention's projections and the routers' (no fx trace of transformers' code), RoPE,
    # attention; the experts' activation is the patched block's
    left = report.unmatched
    assert left["Linear"] == 4 * cfg.layers and left["MixtralTopKRouter"] == cfg.layers, left
    assert "SiLUActivation" not in left, left
    for op in ("apply_rotary_pos_emb", "attention (sdpa)"):
        assert [v for k, v in left.items() if k.startswith(op + " (left to PyTorch: ")] == [cfg.layers], left

    # one backward: the fused experts' gradients (and the routers') are finite and as close to an fp32 eager
    # model's as eager's own bf16 ones (at init these differ from fp32's by 0.5-1% here, in eager too)
    exact = copy.deepcopy(eager).float()
    for m in (model, eager, exact):
        m(*inputs).backward()
    got, want, ref = (dict(m.named_parameters()) for m in (model, eager, exact))
    for name, p in got.items():
        assert p.grad is not None and torch.isfinite(p.grad.float()).all(), name
        if name.endswith(("experts.gate_up_proj", "experts.down_proj", "gate.weight")):
            r = ref[name].grad
            err, eager_err = ((g.float() - r).norm() / r.norm() for g in (p.grad, want[name].grad))
            assert err <= 1.25 * eager_err + 1e-2, (name, float(err), float(eager_err))
    model.zero_grad(set_to_none=True)
    eager.zero_grad(set_to_none=True)

    batch = lambda step: spec.inputs(seed=step)  # noqa: E731
    opt, adamw = patching.adamw(model, lr=1e-3, weight_decay=0.0, workdir=tmp_path / "adamw")
    assert adamw.patched, adamw.reason
    before = patching.call_counts(model)
    want_losses, got_losses = train_losses(eager, batch, STEPS), train_losses(model, batch, STEPS, optimizer=AdamW)
    assert loss_gap(want_losses, got_losses) < LOSS_BOUND, (want_losses, got_losses)
    counts = patching.call_counts(model)
    assert set(counts) == {"lm", "lm.model.norm"} | {f"lm.model.layers.{i}.{m}" for i in range(cfg.layers)
                                                     for m in ("mlp", "input_layernorm", "post_attention_layernorm")}
    assert all((c[0] - before[n][0], c[1]) == (STEPS, 0) for n, c in counts.items()), counts


def test_hf_mixtral_regions_carry_the_forward_shapes():
    spec, cfg = _tiny()
    regions, misfits = find_regions(spec.build(), spec.inputs())
    by_kind = {r.kind: r for r in regions}
    tokens = cfg.batch * cfg.seq
    assert by_kind[Kind.RMSNORM].constants == {"M": tokens, "N": cfg.hidden}
    assert len(by_kind[Kind.RMSNORM].modules) == 2 * cfg.layers + 1
    assert by_kind[Kind.MOE].constants == {"T": tokens, "H": cfg.hidden, "FFN": cfg.ffn, "EXPERTS": cfg.experts,
                                           "TOP_K": cfg.top_k}
    assert by_kind[Kind.MOE].modules == tuple(f"lm.model.layers.{i}.mlp" for i in range(cfg.layers))
    assert by_kind[Kind.LM_LOSS].constants == {"BT": tokens, "H": cfg.hidden, "V": cfg.vocab}
    assert {r.kind for r in regions} == {Kind.RMSNORM, Kind.MOE, Kind.LM_LOSS}
    assert {r.dtype for r in regions} == {"bfloat16"} and misfits == {}


def test_hf_mixtral_calls_outside_the_contract_are_unmatched():
    """Router jitter in training (random noise on the block's input) leaves the MoE blocks unmatched; a training
    call whose loss adds the router's auxiliary loss leaves the causal LM unmatched; each with its reason."""
    spec, cfg = _tiny()
    model = spec.build()
    for layer in model.lm.model.layers:
        layer.mlp.jitter_noise = 0.01
    model.lm.config.output_router_logits = True
    regions, misfits = find_regions(model, spec.inputs())
    assert {r.kind for r in regions} == {Kind.RMSNORM}
    assert all("jitter" in misfits[f"lm.model.layers.{i}.mlp"] for i in range(cfg.layers)), misfits
    assert "auxiliary loss" in misfits["lm"], misfits
