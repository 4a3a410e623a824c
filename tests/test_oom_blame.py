"""Who a candidate process's GPU out-of-memory error is put down to: the harness where the parent's own tensors hold
a large share of the GPU (a full-size KernelBench task: inputs, float64 truths and lent copies), else the candidate.
The CUDA memory queries are replaced; the real ones run in the GPU tests."""
from types import SimpleNamespace

import pytest
import torch

from sandbox import harness as harness_mod
from sandbox.records import Reason, Stage

GIB = 2**30


def _verdict(monkeypatch, reserved_gib: float, device: str = "cuda:0", error_type: str = "OutOfMemoryError"):
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: int(reserved_gib * GIB))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=140 * GIB))
    run = SimpleNamespace(device=device, child=SimpleNamespace(output_tail=lambda n=0: ""))
    reply = {"ok": False, "reason": Reason.RUNTIME_ERROR.value, "message": "CUDA out of memory. Tried to allocate 6 GiB",
             "error": {"type": error_type, "message": "CUDA out of memory", "traceback": ""}}
    return harness_mod.Harness._reject_from_reply(None, Stage.ROBUSTNESS, reply, run).result


def test_a_parent_holding_much_of_the_gpu_takes_the_blame(monkeypatch):
    result = _verdict(monkeypatch, reserved_gib=60)
    assert result.reason is Reason.HARNESS_ERROR
    assert "harness itself held 60.0 GiB of the GPU's 140.0 GiB" in result.message
    assert "Tried to allocate 6 GiB" in result.message  # the child's own words are kept


@pytest.mark.parametrize("reserved_gib, device, error_type", [
    (5, "cuda:0", "OutOfMemoryError"),  # the parent holds little: the candidate's allocations are the likelier cause
    (60, "cpu", "OutOfMemoryError"),  # no GPU involved
    (60, "cuda:0", "RuntimeError"),  # not a memory error
])
def test_otherwise_the_candidate_is_rejected_for_its_error(monkeypatch, reserved_gib, device, error_type):
    result = _verdict(monkeypatch, reserved_gib, device, error_type)
    assert result.reason is Reason.RUNTIME_ERROR and result.message.startswith("CUDA out of memory")
