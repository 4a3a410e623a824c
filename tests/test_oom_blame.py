"""Who a candidate process's GPU out-of-memory error is put down to: the GPU's other users where the harness and the
other processes on the GPU (a search's other checks, their candidates' processes) hold a large share of it, else the
candidate. The CUDA memory queries are replaced; the real ones run in the GPU tests."""
from types import SimpleNamespace

import pytest
import torch

from sandbox import harness as harness_mod
from sandbox.records import GPU_FULL, GPU_FULL_HARNESS, GPU_FULL_SHARED, Reason, Stage

GIB = 2**30
TOTAL = 140


def _verdict(monkeypatch, harness_gib: float, free_gib: float = 0.1, own: str = "", device: str = "cuda:0",
             error_type: str = "OutOfMemoryError"):
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: int(harness_gib * GIB))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (int(free_gib * GIB), TOTAL * GIB))
    run = SimpleNamespace(device=device, child=SimpleNamespace(output_tail=lambda n=0: ""))
    message = f"CUDA out of memory. Tried to allocate 6 GiB.{own}"
    reply = {"ok": False, "reason": Reason.RUNTIME_ERROR.value, "message": message,
             "error": {"type": error_type, "message": "CUDA out of memory", "traceback": ""}}
    return harness_mod.Harness._reject_from_reply(None, Stage.TIMING, reply, run).result


def test_a_harness_holding_much_of_the_gpu_takes_the_blame(monkeypatch):
    result = _verdict(monkeypatch, harness_gib=60)
    assert result.reason is Reason.HARNESS_ERROR
    assert result.details[GPU_FULL] == GPU_FULL_HARNESS  # the parent's own figures: the search runs fewer at once
    assert "60.0 GiB held by the harness and 0.0 GiB by other processes" in result.message
    assert "of the GPU's 140.0 GiB" in result.message
    assert "Tried to allocate 6 GiB" in result.message  # the child's own words are kept


def test_other_checks_filling_the_gpu_take_the_blame(monkeypatch):
    # As on the H100 at three attention checks: the harness held little, the candidate's process 20.57 GiB (its
    # timing's input sets), the other checks' processes the rest.
    own = " Including non-PyTorch memory, this process has 20.57 GiB memory in use."
    result = _verdict(monkeypatch, harness_gib=5, own=own)
    assert result.reason is Reason.HARNESS_ERROR
    assert "5.0 GiB held by the harness and 114.3 GiB by other processes" in result.message
    assert result.details[GPU_FULL] == GPU_FULL_SHARED  # resting on the candidate's account of its own use


@pytest.mark.parametrize("harness_gib, own, device, error_type", [
    # the candidate's process holds most of the GPU itself: its allocations are the likelier cause
    (5, " Including non-PyTorch memory, this process has 120.00 GiB memory in use.", "cuda:0", "OutOfMemoryError"),
    # its own use unknown: all that is not the harness's counts as the candidate's
    (5, "", "cuda:0", "OutOfMemoryError"),
    (60, "", "cpu", "OutOfMemoryError"),  # no GPU involved
    (60, "", "cuda:0", "RuntimeError"),  # not a memory error
])
def test_otherwise_the_candidate_is_rejected_for_its_error(monkeypatch, harness_gib, own, device, error_type):
    result = _verdict(monkeypatch, harness_gib, own=own, device=device, error_type=error_type)
    assert result.reason is Reason.RUNTIME_ERROR and result.message.startswith("CUDA out of memory")
    assert GPU_FULL not in result.details


def test_a_claimed_use_larger_than_the_gpu_s_counts_as_all_that_is_not_the_harness_s(monkeypatch):
    own = " Including non-PyTorch memory, this process has 900.00 GiB memory in use."
    assert _verdict(monkeypatch, harness_gib=5, own=own).reason is Reason.RUNTIME_ERROR


def _timing_verdict(monkeypatch, error_type: str, harness_gib: float = 5):
    """The timing stage's verdict where the candidate raised `error_type` during its measurement."""
    from sandbox import timing_parent
    from sandbox.records import Rejected
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: int(harness_gib * GIB))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (int(0.1 * GIB), TOTAL * GIB))
    message = ("candidate raised during timing: OutOfMemoryError: CUDA out of memory. Including non-PyTorch memory, "
               "this process has 25.85 GiB memory in use.")
    report = {"problems": [{"reason": Reason.RUNTIME_ERROR.value, "message": message}],
              "candidate_error": error_type}
    monkeypatch.setattr(timing_parent, "measure", lambda *a, **k: report)
    harness = SimpleNamespace(_request=lambda *a, **k: {"ok": True})
    reference = SimpleNamespace(init_inputs=lambda: [], state_dict=lambda: {}, model_seed=0)
    run = SimpleNamespace(device="cuda:0", task=None)
    with pytest.raises(Rejected) as caught:
        timing_parent.run(harness, run, reference)
    return caught.value.result


def test_a_timing_out_of_memory_beside_other_checks_is_the_harness_s_as_at_any_stage(monkeypatch):
    # As on the H100 at four attention checks: the candidate's timing process held 25.85 GiB, the GPU was full.
    result = _timing_verdict(monkeypatch, "OutOfMemoryError")
    assert result.stage is Stage.TIMING and result.reason is Reason.HARNESS_ERROR
    assert result.details[GPU_FULL] == GPU_FULL_SHARED
    assert "5.0 GiB held by the harness and 109.1 GiB by other processes" in result.message


def test_another_timing_error_stays_the_candidate_s(monkeypatch):
    result = _timing_verdict(monkeypatch, "RuntimeError")
    assert result.reason is Reason.RUNTIME_ERROR and GPU_FULL not in result.details
