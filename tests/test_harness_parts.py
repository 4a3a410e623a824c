"""The harness's GPU output hand-back (sandbox/handback.py), in the parts that run anywhere: poisoned buffers and
claiming the child's markers (the GPU path itself runs in tests/test_harness_gpu.py on the H200)."""
import torch

from sandbox.handback import claim, poisoned
from sandbox.records import Reason


def _poisoned(ref):
    return poisoned(ref.shape, ref.dtype, ref.device)


def test_poisoned_buffers_read_as_nan_or_minus_one():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        buf = _poisoned(torch.zeros(3, 5, dtype=dtype))
        assert buf.shape == (3, 5) and buf.dtype == dtype and torch.isnan(buf).all()
    assert (_poisoned(torch.zeros(7, dtype=torch.int32)) == -1).all()
    assert torch.isnan(_poisoned(torch.tensor(1.5))).item()  # a 0-dim loss
    assert _poisoned(torch.zeros(4, dtype=torch.bool)) is None  # no poison pattern: travels by value
    assert _poisoned(torch.zeros(2, 3).t()).is_contiguous()


def test_claim_replaces_markers_with_copies_and_refuses_forgeries():
    a, b = torch.arange(4.0), torch.arange(6.0)
    got = claim([{"__gpu_buffer__": 0}, {"__gpu_buffer__": 1}], [a, b])
    assert torch.equal(got[0], a) and torch.equal(got[1], b)
    assert got[0].data_ptr() != a.data_ptr()  # a copy: the child may still write into the buffer it was lent
    value = torch.ones(2)
    assert claim([value, {"__gpu_buffer__": 1}], [None, b])[0] is value  # sent by value: kept as it came
    assert claim([{"__gpu_buffer__": 1}, {"__gpu_buffer__": 1}], [a, b]) is None  # another position's buffer
    assert claim([{"__gpu_buffer__": 0}], [None]) is None  # no buffer was lent there
    assert claim([{"__gpu_buffer__": 2}], [a]) is None
    assert claim("not a list", [a]) == "not a list"  # the output-type check reports it
    # the timing stage's samples: call j's outputs sit at j * (outputs a call) among one request's buffers
    got = claim([{"__gpu_buffer__": 1}], [a, b], start=1)
    assert torch.equal(got[0], b)
    assert claim([{"__gpu_buffer__": 0}], [a, b], start=1) is None  # the first call's buffer, claimed for the second


def test_running_out_of_gpu_memory_is_the_harness_s_error_not_the_candidate_s(monkeypatch):
    """A parent-side allocation failure (references of a huge task) ends the check with one sentence that blames
    nobody's kernel, not with a traceback."""
    from pathlib import Path

    from sandbox.harness import CheckOptions, Harness
    from sandbox.records import Stage
    from sandbox.reference import Reference
    from sandbox.task import load_task

    root = Path(__file__).resolve().parent.parent

    def out_of_memory(self, inputs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 7.83 GiB.")

    # Loaded (and fitted to the CPU, which runs the reference) first: the failure is the smoke stage's reference.
    task = load_task(root / "tasks" / "rmsnorm_fwd.py").scaled_for_cpu()
    monkeypatch.setattr(Reference, "run", out_of_memory)
    with Harness("cpu") as harness:
        result = harness.check(task, root / "tests" / "candidates" / "rmsnorm_honest.py",
                               CheckOptions(device="cpu", timeout_s=120))
    assert not result.accepted and result.reason is Reason.HARNESS_ERROR and result.stage is Stage.SMOKE
    assert "ran out of GPU memory" in result.message and "says nothing about the candidate" in result.message


def test_each_child_gets_a_scratch_directory_of_its_own(tmp_path):
    """A child's scratch (its Triton cache included) is made new, never found by its pid: what a killed run left
    behind, or an earlier child of the same pid not yet reaped, is not handed to the next candidate, and reaping
    one child does not remove another's."""
    from sandbox.harness import Harness

    harness = Harness.__new__(Harness)  # the scratch bookkeeping alone: no zygote
    harness.workdir = tmp_path

    class FakeChild:
        pid, scratch = 4242, None

    stale = tmp_path / "scratch-4242" / "triton"
    stale.mkdir(parents=True)
    (stale / "planted.json").write_text("{}")
    first, second = FakeChild(), FakeChild()
    a = harness._scratch(first)
    assert harness._scratch(first) == a and list((a / "triton").iterdir()) == []
    (a / "triton" / "kernel.cubin").write_bytes(b"first's")
    b = harness._scratch(second)
    assert b != a and list((b / "triton").iterdir()) == []
    harness._clean(first)
    assert not a.exists() and b.exists() and stale.exists()


def test_a_broken_interpreter_is_reported_as_a_crash():
    """A kernel that writes over its process's heap (the CPU interpreter lets it) can leave CPython raising
    SystemError from then on; that process crashed, whatever it raised. A candidate cannot raise SystemError itself
    (the static stage refuses the name), so the worker's reply is tested directly."""
    from sandbox import worker

    ordinary = worker._raised(TypeError("pop expected at most 1 argument, got 3"))
    broken = worker._raised(SystemError("<method 'pop' of 'list' objects> returned NULL without setting an exception"))
    assert ordinary["reason"] == Reason.RUNTIME_ERROR.value and ordinary["error"]["type"] == "TypeError"
    assert broken["reason"] == Reason.CRASH.value and broken["error"]["type"] == "SystemError"
    assert broken["message"].startswith("SystemError: <method 'pop'") and broken["ok"] is False
