"""The THREATS classes that only a GPU can show: allocator reuse, a CUDA fault, timer patching and caching during
timing, side streams; and the timing stage on an honest kernel. Skipped without a CUDA GPU; on the H200:
`CRUCIBLE_TEST_DEVICE=cuda python3 -m pytest -q tests/test_harness_gpu.py` (docs/BENCHMARKS.md has the output)."""
from pathlib import Path

import pytest

from sandbox.harness import CheckOptions, Harness
from sandbox.records import Reason, Stage, Verdict
from tests.conftest import needs_gpu

pytestmark = needs_gpu
HERE = Path(__file__).parent
GPU = HERE / "candidates" / "gpu"
RMSNORM = HERE.parent / "tasks" / "rmsnorm_fwd.py"
HONEST = HERE / "candidates" / "rmsnorm_honest.py"


@pytest.fixture(scope="module")
def harness():
    with Harness("cuda") as h:
        yield h


def test_allocator_reuse_is_caught(harness):
    r = harness.check(RMSNORM, GPU / "allocator_reuse.py", CheckOptions(timing=False))
    assert (r.stage, r.reason) == (Stage.CORRECTNESS, Reason.NONFINITE_MISMATCH), r.message


def test_cuda_fault_ends_only_that_candidate(harness):
    r = harness.check(RMSNORM, GPU / "cuda_fault.py", CheckOptions(timing=False))
    assert r.verdict is Verdict.REJECTED and r.reason in (Reason.RUNTIME_ERROR, Reason.CRASH), r.message
    honest = harness.check(RMSNORM, HONEST, CheckOptions(timing=False))
    assert honest.verdict is Verdict.ACCEPTED, honest.message


def test_side_stream_is_refused(harness):
    r = harness.check(RMSNORM, GPU / "side_stream.py")
    assert r.verdict is Verdict.REJECTED and r.stage is Stage.STATIC, r.message


def test_timer_patching_is_refused(harness):
    """`torch.cuda.Event.elapsed_time = ...` is refused at the static stage (an attribute set on an imported module's
    class); the timing stage's own check of the timer, behind it, is shown by tests/test_profiler_gpu.py."""
    r = harness.check(RMSNORM, GPU / "timer_patch.py")
    assert (r.stage, r.reason) == (Stage.STATIC, Reason.FORBIDDEN_CALL), r.message
    assert "torch.cuda.Event.elapsed_time" in r.message, r.message


def test_caching_after_the_first_calls_is_caught_before_timing(harness):
    """A call counter in the model: the state rule (sandbox.carry) sees it change between calls, so the cheat never
    reaches the timing stage, whose output check caught it before that rule existed."""
    r = harness.check(RMSNORM, GPU / "warmup_then_cache.py")
    assert r.verdict is Verdict.REJECTED and r.reason is Reason.STATE_CARRIED, r.message


def test_honest_kernel_is_timed_and_stable(harness):
    a = harness.check(RMSNORM, HONEST, CheckOptions(baselines=("eager",)))
    b = harness.check(RMSNORM, HONEST, CheckOptions(baselines=("eager",)))
    for r in (a, b):
        assert r.verdict is Verdict.ACCEPTED and r.timed, r.message
        assert r.timing["roofline"]["pct_of_roofline"] < 100
    ms_a, ms_b = a.timing["candidate_ms"], b.timing["candidate_ms"]
    assert abs(ms_a - ms_b) / min(ms_a, ms_b) < 0.1, (ms_a, ms_b)


def test_a_verified_source_s_later_check_starts_with_its_own_compiled_kernels(harness, tmp_path):
    """The first check compiles and, verified, keeps its Triton cache (sandbox/compiled.py); the next check of the same
    source gets it before the import, so its first call compiles nothing; another source starts empty."""
    source = tmp_path / "rmsnorm_kept.py"
    source.write_bytes(HONEST.read_bytes() + b"\n# a source of this test's own: nothing kept for it yet\n")
    first = harness.check(RMSNORM, source, CheckOptions(timing=False))
    assert first.accepted, first.message
    assert first.stages[1].details["planted_files"] == 0 and first.costs["kept_files"] > 0
    again = harness.check(RMSNORM, source, CheckOptions(timing=False))
    assert again.accepted, again.message
    assert again.stages[1].details["planted_files"] == first.costs["kept_files"]
    smoke = [r.stages[2] for r in (first, again)]
    assert all(s.stage is Stage.SMOKE for s in smoke)
    print(f"the smoke stage (its first call compiles): {smoke[0].seconds:.2f} s; with the kept kernels "
          f"{smoke[1].seconds:.2f} s")
    assert smoke[1].seconds < smoke[0].seconds
