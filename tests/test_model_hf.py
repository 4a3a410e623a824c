"""Hugging Face's LlamaForCausalLM (transformers, built from a config with random weights) through the whole
`crucible model` flow on the CPU, as tests/test_model_patch.py runs the shipped Llama (at the same smaller sizes:
`smaller`): the regions at the model's shapes, their task files, the patch with every region's outcome, the ops left
to PyTorch with their reasons, and 3 AdamW steps of the patched model against eager's."""
import copy
import sys

import pytest
import torch

import patching
from patching.find import HF_READERS, find_regions
from patching.functions import FORWARDS, Installed, install
from patching.modelfile import ModelFileError, load_model_file
from patching.optimizer import AdamW
from patching.records import Kind, Outcome
from patching.steps import loss_gap, train_losses
from sandbox.reference import check_task
from sandbox.task import load_task
from tests.test_model_patch import GRAD_BOUND, LOSS_BOUND, STEPS, grad_gaps, smaller


def _tiny(path: str = "models/hf_llama.py"):
    """The model file's "tiny" preset at tests/test_model_patch.py's smaller sizes, and its config."""
    pytest.importorskip("transformers")
    spec = smaller(load_model_file(path, "tiny"))
    return spec, spec.module.PRESETS["tiny"]


def assert_all_patched(report, kinds: set) -> None:
    """The regions are of `kinds`; every task file carries the region's constants and passes its check; every
    region is patched."""
    assert {r.region.kind for r in report.results} == kinds
    for result in report.results:
        for task in result.tasks:
            loaded = load_task(task.path, rescale=False)
            assert all(loaded.current_constants()[k] == v for k, v in result.region.constants.items()
                       if k in loaded.constants)
            check_task(loaded, "cpu")
        assert result.outcome is Outcome.PATCHED, result.reason


@pytest.mark.slow
def test_hf_llama_match_extract_patch_train(tmp_path):
    spec, cfg = _tiny()
    model, inputs = spec.build(), spec.inputs()
    eager = copy.deepcopy(model)

    report = patching.patch(model, inputs, name=spec.name, workdir=tmp_path)

    assert_all_patched(report, {Kind.RMSNORM, Kind.SWIGLU, Kind.LM_LOSS})
    # what stays PyTorch's is listed, with why: the projections (no fx trace of transformers' code), RoPE, attention
    left = report.unmatched
    assert left["Linear"] == 7 * cfg.layers and left["Embedding"] == 1, left
    assert any(k.startswith("(not traced by torch.fx") for k in left), left
    for op in ("apply_rotary_pos_emb", "attention (sdpa)"):
        assert [v for k, v in left.items() if k.startswith(op + " (left to PyTorch: ")] == [cfg.layers], left
    gaps = grad_gaps(model, eager, inputs)  # every parameter's gradient as eager's (tests/test_model_patch.py)
    assert gaps and max(gaps.values()) < GRAD_BOUND, sorted(gaps.items(), key=lambda kv: -kv[1])[:4]

    batch = lambda step: spec.inputs(seed=step)  # noqa: E731
    opt, adamw = patching.adamw(model, lr=1e-3, weight_decay=0.0, workdir=tmp_path / "adamw")
    assert adamw.patched, adamw.reason
    before = patching.call_counts(model)
    want, got = train_losses(eager, batch, STEPS), train_losses(model, batch, STEPS, optimizer=AdamW)
    assert loss_gap(want, got) < LOSS_BOUND, (want, got)
    counts = patching.call_counts(model)
    assert set(counts) == {"lm", "lm.model.norm"} | {f"lm.model.layers.{i}.{m}" for i in range(cfg.layers)
                                                     for m in ("mlp", "input_layernorm", "post_attention_layernorm")}
    assert all((c[0] - before[n][0], c[1]) == (STEPS, 0) for n, c in counts.items()), counts
    model(*inputs).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad.float()).all(), name


def test_hf_regions_carry_the_forward_shapes():
    spec, cfg = _tiny()
    regions, misfits = find_regions(spec.build(), spec.inputs())
    by_kind = {r.kind: r for r in regions}
    tokens = cfg.batch * cfg.seq
    assert by_kind[Kind.RMSNORM].constants == {"M": tokens, "N": cfg.hidden}
    assert by_kind[Kind.RMSNORM].floats == {"EPS": cfg.eps}
    assert len(by_kind[Kind.RMSNORM].modules) == 2 * cfg.layers + 1
    assert by_kind[Kind.SWIGLU].constants == {"M": tokens, "N": cfg.ffn}
    assert by_kind[Kind.SWIGLU].modules == tuple(f"lm.model.layers.{i}.mlp" for i in range(cfg.layers))
    # every position has a label slot; the shifted-out last one of each row is ignore_index, as transformers does
    assert by_kind[Kind.LM_LOSS].constants == {"BT": tokens, "H": cfg.hidden, "V": cfg.vocab}
    assert {r.dtype for r in regions} == {"bfloat16"} and misfits == {}
    assert set(FORWARDS) == set(HF_READERS)  # every class read whole has its patched forward


def test_hf_calls_outside_the_contract_are_unmatched_or_fall_back():
    """An MLP whose activation is not SiLU is unmatched, with the reason; a patched causal LM in eval mode (which
    must return the logits) runs its own forward and counts a fallback."""
    spec, cfg = _tiny()
    model = spec.build()
    model.lm.config.hidden_act = "gelu"
    from transformers.activations import ACT2FN
    for layer in model.lm.model.layers:
        layer.mlp.act_fn = ACT2FN["gelu"]
    regions, misfits = find_regions(model, spec.inputs())
    assert Kind.SWIGLU not in {r.kind for r in regions}
    assert all("not SiLU" in misfits[f"lm.model.layers.{i}.mlp"] for i in range(cfg.layers)), misfits

    lm = spec.build().lm
    inst = Installed(Kind.LM_LOSS, (cfg.hidden, cfg.vocab), {"forward+backward": torch.nn.Identity()})
    install(lm, inst)
    ids = spec.inputs()[0]
    out = lm.eval()(input_ids=ids, labels=ids)
    assert out.logits.shape == (cfg.batch, cfg.seq, cfg.vocab) and (inst.calls, inst.fallbacks) == (0, 1)


def test_hf_model_file_without_transformers_ends_in_one_sentence(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now fails as if not installed
    with pytest.raises(ModelFileError, match=r"^hf_llama\.py: this model file needs Hugging Face's transformers: "
                                             r"pip install transformers$"):
        load_model_file("models/hf_llama.py", "tiny")
