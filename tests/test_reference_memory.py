"""A reference run that finds the GPU full (sandbox/reference.py `Reference.run`) is tried once more alone; full
again, the check ends as the harness's own failure, which says nothing of the candidate. The float64 truth and the
task's alternates are never dropped for a moment's want of memory: before, any error of the truth dropped it, and the
alternates with it, for the rest of the check, holding every later output to the bf16 reference as if it had no
error. The GPU's memory is played here by models that raise torch.OutOfMemoryError (or cuBLAS's allocation error)."""
import textwrap

import pytest
import torch

from sandbox import reference as reference_mod
from sandbox.reference import Reference, check_task
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
    assert expected.truth is not None and expected.truth[0].dtype == torch.float64
    assert len(expected.alternates) == 1


def test_a_truth_that_never_fits_is_the_harness_s_error_and_the_next_run_tries_again(task):
    ref = Reference(task, "cpu", 0)
    _full(task, float64=2)  # the first try and the one alone
    with pytest.raises(torch.OutOfMemoryError):
        ref.run(task.make_inputs(1, "normal"))
    assert ref.model64 is not None
    again = ref.run(task.make_inputs(2, "normal"))
    assert again.truth is not None and len(again.alternates) == 1


def test_an_alternate_that_finds_the_gpu_full_is_not_left_out(task):
    ref = Reference(task, "cpu", 0)
    _full(task, alternate=1)
    expected = ref.run(task.make_inputs(1, "normal"))
    assert expected.truth is not None and len(expected.alternates) == 1
    _full(task, alternate=2)
    with pytest.raises(torch.OutOfMemoryError):
        ref.run(task.make_inputs(2, "normal"))


def test_a_reference_that_never_fits_is_the_harness_s_error(task):
    ref = Reference(task, "cpu", 0)
    _full(task, model=3)
    with pytest.raises(torch.OutOfMemoryError):
        ref.run(task.make_inputs(1, "normal"))


def test_a_library_s_allocation_failure_counts_as_a_full_gpu(task, monkeypatch):
    ref = Reference(task, "cpu", 0)
    model64, calls = ref.model64, []

    def cublas_full(*args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
        return model64(*args)
    monkeypatch.setattr(ref, "model64", cublas_full)
    expected = ref.run(task.make_inputs(1, "normal"))
    assert expected.truth is not None and len(calls) == 2


def test_a_model_that_cannot_run_in_float64_still_loses_its_truth_for_good(task, monkeypatch):
    ref = Reference(task, "cpu", 0)

    def no_float64(*args):
        raise RuntimeError('"softmax" not implemented for \'Double\'')
    monkeypatch.setattr(ref, "model64", no_float64)
    expected = ref.run(task.make_inputs(1, "normal"))
    assert expected.truth is None and expected.alternates == [] and ref.model64 is None


def test_the_harness_ends_a_check_whose_truth_never_fits_as_its_own_failure(monkeypatch):
    from pathlib import Path

    from sandbox.harness import CheckOptions, Harness
    from sandbox.records import GPU_FULL, GPU_FULL_HARNESS, Reason, Verdict

    here = Path(__file__).parent
    run_with_truth = Reference._run_with_truth
    full = {"on": False}

    def never_fits(self, dev_inputs):
        if full["on"]:
            raise torch.OutOfMemoryError("CUDA out of memory (played)")
        return run_with_truth(self, dev_inputs)
    monkeypatch.setattr(reference_mod.Reference, "_run_with_truth", never_fits)
    with Harness("cpu") as h:  # the task is loaded (and sized for the CPU) by the first check
        good = h.check(here.parent / "tasks" / "rmsnorm_fwd.py", here / "candidates" / "rmsnorm_honest.py",
                       CheckOptions(timeout_s=120, seed=3))
        full["on"] = True
        bad = h.check(here.parent / "tasks" / "rmsnorm_fwd.py", here / "candidates" / "rmsnorm_honest.py",
                      CheckOptions(timeout_s=120, seed=3))
    assert bad.verdict is not Verdict.ACCEPTED and bad.reason is Reason.HARNESS_ERROR, bad.message
    assert "ran out of GPU memory" in bad.message and "says nothing about the candidate" in bad.message
    assert bad.stages[-1].details[GPU_FULL] == GPU_FULL_HARNESS  # a search goes on with fewer checks at once
    assert good.accepted, good.message


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
    assert expected.truth is not None and ref.model64 is not None


def test_check_task_without_float64_makes_no_truth_after_a_full_gpu_at_the_start(task, monkeypatch):
    deepcopy = reference_mod.copy.deepcopy
    made = []

    def copies(obj, *a):
        made.append(1)
        if len(made) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (played)")
        return deepcopy(obj, *a)
    monkeypatch.setattr(reference_mod.copy, "deepcopy", copies)
    check_task(task, "cpu", float64=False)
    assert len(made) == 1  # the float64 copy that found the GPU full is not made later either


def test_the_full_gpu_message_gives_the_gpu_s_memory_as_it_stands(monkeypatch):
    from sandbox import cudaipc

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 30 << 30)
    said = cudaipc.full_gpu_message("correctness", "cuda:0")
    assert said.startswith("the harness ran out of GPU memory at the correctness stage")
    assert "2.0 GiB of 80.0 free, the harness holding 30.0, other processes (the candidates' among them) 48.0" in said
    assert "says nothing about the candidate" in said
    assert "GiB" not in cudaipc.full_gpu_message("smoke", "cpu")
