"""A reference run that finds the GPU full (sandbox/reference.py `Reference.run`): tried once more alone; where the
float64 truth still does not fit, that run goes without it, says so beside a mismatch, and the task's other honest
implementations still bound the comparison; the truth is never dropped for the rest of the check. Without this, one
moment's want of memory in a busy search held every later output of the check to the bf16 reference as if it had
no error. The GPU's memory is played here by models that raise torch.OutOfMemoryError."""
import textwrap

import pytest
import torch

from sandbox import reference as reference_mod
from sandbox import tolerance
from sandbox.reference import TRUTH_MISSING, Reference
from sandbox.task import load_task

TASK = """
import torch
N = 64
FULL = {"float64": 0, "alternate": 0, "model": 0}  # how many more runs of each find the GPU full
def _full(what):
    if FULL[what]:
        FULL[what] -= 1
        raise torch.OutOfMemoryError("CUDA out of memory (played)")
class Model(torch.nn.Module):
    def forward(self, x):
        _full("float64" if x.dtype == torch.float64 else "model")
        return torch.softmax(x * 3, -1)
def get_inputs():
    return [torch.randn(4, N, dtype=torch.bfloat16)]
def get_init_inputs():
    return []
def crucible_references(model):
    def log_domain(x):
        _full("alternate")
        return torch.exp(torch.log_softmax(x.float() * 3, -1)).to(x.dtype)
    return {"log-domain": log_domain}
"""


@pytest.fixture
def task(tmp_path):
    path = tmp_path / "full.py"
    path.write_text(textwrap.dedent(TASK))
    return load_task(path)


def _full(task, **runs):
    task.module.FULL.update(runs)


def test_a_truth_that_finds_the_gpu_full_once_is_made_again(task):
    ref = Reference(task, "cpu", 0)
    _full(task, float64=1)
    expected = ref.run(task.make_inputs(1, "normal"))
    assert expected.truth is not None and expected.truth[0].dtype == torch.float64 and expected.note == ""
    assert len(expected.alternates) == 1


def test_a_truth_that_never_fits_leaves_this_run_without_it_and_the_next_tries_again(task):
    ref = Reference(task, "cpu", 0)
    _full(task, float64=2)  # the first try and the one alone
    expected = ref.run(task.make_inputs(1, "normal"))
    assert expected.truth is None and expected.note == TRUTH_MISSING
    assert len(expected.alternates) == 1  # still counted, measured against the reference
    assert ref.model64 is not None
    again = ref.run(task.make_inputs(2, "normal"))
    assert again.truth is not None and again.note == ""


def test_an_alternate_that_finds_the_gpu_full_is_not_left_out(task):
    ref = Reference(task, "cpu", 0)
    _full(task, alternate=1)
    expected = ref.run(task.make_inputs(1, "normal"))
    assert expected.truth is not None and len(expected.alternates) == 1


def test_a_reference_that_never_fits_is_the_harness_s_error(task):
    ref = Reference(task, "cpu", 0)
    _full(task, model=3)
    with pytest.raises(torch.OutOfMemoryError):
        ref.run(task.make_inputs(1, "normal"))


def test_a_model_that_cannot_run_in_float64_still_loses_its_truth_for_good(task, monkeypatch):
    ref = Reference(task, "cpu", 0)

    def no_float64(*args):
        raise RuntimeError('"softmax" not implemented for \'Double\'')
    monkeypatch.setattr(ref, "model64", no_float64)
    expected = ref.run(task.make_inputs(1, "normal"))
    assert expected.truth is None and expected.note == "" and ref.model64 is None


def test_without_a_truth_the_alternates_spread_bounds_the_comparison():
    """r stands in for the truth: how far an alternate lies from r is PyTorch's own error there."""
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(4096, generator=gen)
    alt = ref + 0.1 * torch.randn(4096, generator=gen)  # another implementation, far past bf16's own bounds
    near = ref + 0.1 * torch.randn(4096, generator=gen)  # a candidate as far off as the alternate
    far = ref + 0.5 * torch.randn(4096, generator=gen)
    bf = torch.bfloat16
    for fused in (False, True):  # the torch passes and the kernels (Triton's interpreter here)
        assert tolerance.compare("o", near.to(bf), ref.to(bf), None, alternates=(alt.to(bf),), fused=fused) is None
        assert tolerance.compare("o", near.to(bf), ref.to(bf), None, fused=fused) is not None
        assert tolerance.compare("o", far.to(bf), ref.to(bf), None, alternates=(alt.to(bf),), fused=fused) is not None


def test_the_harness_says_beside_a_mismatch_that_the_truth_was_missing(monkeypatch):
    from pathlib import Path

    from sandbox.harness import CheckOptions, Harness
    from sandbox.records import Reason

    here = Path(__file__).parent
    run_with_truth = Reference._run_with_truth

    def never_fits(self, dev_inputs, with_truth=True):
        if with_truth:
            raise torch.OutOfMemoryError("CUDA out of memory (played)")
        return run_with_truth(self, dev_inputs, with_truth)
    with Harness("cpu") as h:
        plain = h.check(here.parent / "tasks" / "rmsnorm_fwd.py", here / "candidates" / "rmsnorm_honest.py",
                        CheckOptions(timeout_s=120, seed=3))
        monkeypatch.setattr(reference_mod.Reference, "_run_with_truth", never_fits)
        bad = h.check(here.parent / "tasks" / "rmsnorm_fwd.py", here / "candidates" / "cheats" / "partial_write.py",
                      CheckOptions(timeout_s=120, seed=3))
        good = h.check(here.parent / "tasks" / "rmsnorm_fwd.py", here / "candidates" / "rmsnorm_honest.py",
                       CheckOptions(timeout_s=120, seed=3))
    assert bad.reason in (Reason.OUTPUT_MISMATCH, Reason.NONFINITE_MISMATCH), bad.message
    assert TRUTH_MISSING in bad.message, bad.message
    assert good.accepted, good.message
    assert good.costs["compared_without_truth"] >= 4  # the smoke call's output and at least three more
    assert plain.accepted and plain.costs["compared_without_truth"] == 0
    # `crucible check` says it beside an acceptance too
    import io

    from rich.console import Console

    from agent.commands import check as check_cmd
    for result, said in ((good, True), (plain, False)):
        out = io.StringIO()
        monkeypatch.setattr(check_cmd, "console", Console(file=out, width=200))
        check_cmd.render(result)
        assert ("compared without their float64 truth" in out.getvalue()) is said


def test_a_float64_copy_of_the_model_that_finds_the_gpu_full_is_made_when_a_run_needs_it(task, monkeypatch):
    deepcopy = reference_mod.copy.deepcopy
    full = {"left": 1}

    def copies(obj, *a):
        if full["left"]:
            full["left"] -= 1
            raise torch.OutOfMemoryError("CUDA out of memory (played)")
        return deepcopy(obj, *a)
    monkeypatch.setattr(reference_mod.copy, "deepcopy", copies)
    ref = Reference(task, "cpu", 0)
    assert ref.model64 is None
    expected = ref.run(task.make_inputs(1, "normal"))
    assert expected.truth is not None and expected.note == "" and ref.model64 is not None
