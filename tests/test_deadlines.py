"""Deadlines from the task: a hanging candidate is rejected in seconds, with the stage and the deadline it missed named,
and honest kernels still pass. The arithmetic and the signs of compilation are tested directly; the harness tests run
the hanging candidates (tests/candidates/hangs/) on the RMSNorm task through the CPU interpreter."""
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from sandbox import channel
from sandbox.deadlines import BUDGETS, Budget, CompileSigns, Deadline
from sandbox.harness import CheckOptions, Harness
from sandbox.records import Reason, Stage
from seeds.registry import TASKS_DIR, all_seeds

HERE = Path(__file__).parent
RMSNORM = TASKS_DIR / "rmsnorm_fwd.py"
HANGS = HERE / "candidates" / "hangs"
CPU_LIMIT_S = 30.0  # a hang on the CPU is rejected within this much wall time, the check's earlier stages included


# ---- the arithmetic -----------------------------------------------------------------------------------------------
def _budget(compile_s: float = 5.0, margin_s: float = 2.0, per_call: float = 20.0, pace: float = 3.0) -> Budget:
    return Budget(compile_s=compile_s, margin_s=margin_s, per_call=per_call, pace=pace)


def test_granted_time_is_the_base_plus_the_larger_multiple():
    b = _budget()
    d = Deadline("the smoke call", b, start=100.0, ceiling=1e9, reference_s=0.31, calls=1)
    assert d.granted_s == pytest.approx(5.0 + 20 * 0.31)  # no call timed yet: the compile budget
    assert d() == pytest.approx(100.0 + 11.2)
    # once a call was timed, the margin, and three of that call where they outlast twenty of the reference
    d = Deadline("the correctness call", b, start=0.0, ceiling=1e9, reference_s=0.01, calls=1, own_s=2.0)
    assert d.granted_s == pytest.approx(2.0 + 6.0)
    d = Deadline("the soak of 10 calls", b, start=0.0, ceiling=1e9, reference_s=0.01, calls=10, own_s=0.05)
    assert d.granted_s == pytest.approx(2.0 + 10 * 0.2)


def test_ceiling_caps_the_deadline_and_says_so():
    d = Deadline("the smoke call", _budget(), start=0.0, ceiling=3.0, reference_s=1.0, calls=1)
    assert d() == 3.0 and d.by_ceiling
    assert not Deadline("x", _budget(), start=0.0, ceiling=100.0).by_ceiling


def test_message_names_the_request_and_what_it_was_granted():
    d = Deadline("the smoke call", _budget(compile_s=6.0), start=time.monotonic(), ceiling=1e12, reference_s=0.31,
                 calls=1)
    assert d.describe() == ("the smoke call did not finish within 12.2 s (the compile budget of 6 s plus 20x the "
                            "reference's 0.31 s)")
    d = Deadline("the correctness call", _budget(margin_s=5.0), start=time.monotonic(), ceiling=1e12,
                 reference_s=1e-4, calls=1, own_s=1.5)
    assert d.describe() == ("the correctness call did not finish within 9.5 s (a margin of 5 s plus 3x its own "
                            "earlier call's 1.50 s)")


def test_signs_of_compilation_move_the_deadline_but_not_past_the_ceiling():
    seen = [None]
    b = _budget(compile_s=2.0)
    d = Deadline("the smoke call", b, start=0.0, ceiling=10.0, signs=lambda: seen[0])
    assert d() == 2.0 and not d.extended
    seen[0] = 1.5  # a kernel's IR landed in its cache at t=1.5
    assert d() == 3.5 and d.extended
    assert "extended while its kernels compiled" in d.describe()
    seen[0] = 9.0
    assert d() == 10.0 and d.by_ceiling


def test_a_missed_deadline_stays_where_the_wait_ended():
    """Killing a candidate's process can leave a sign of compilation (its cache files change as it dies): the
    deadline it ran past is the one its verdict reports, not one that sign moved later."""
    seen = [1.0]
    d = Deadline("the smoke call", _budget(compile_s=2.0), start=0.0, ceiling=100.0, signs=lambda: seen[0])
    assert d() == 3.0
    d.miss()
    seen[0] = 50.0
    assert d() == 3.0 and not d.by_ceiling and "within 3.0 s" in d.describe()


@pytest.mark.parametrize("field", ["compile_s", "margin_s", "per_call", "pace"])
def test_a_budget_must_be_positive(field):
    with pytest.raises(ValueError):
        _budget(**{field: 0.0})


def test_every_device_has_a_budget():
    assert set(BUDGETS) == {"cpu", "cuda"}


# ---- the signs of compilation -------------------------------------------------------------------------------------
def test_a_new_cache_entry_is_a_sign(tmp_path, monkeypatch):
    monkeypatch.setattr("sandbox.deadlines.POLL_S", 0.0)
    signs = CompileSigns(tmp_path, os.getpid())
    assert signs() is None
    (tmp_path / "KEYHASH").mkdir()
    t0 = time.monotonic()
    assert signs() is not None and signs.last >= t0
    last = signs.last
    assert signs() == last  # nothing new: the last sign stays where it was


def test_a_compiler_in_the_process_tree_is_a_sign(tmp_path, monkeypatch):
    monkeypatch.setattr("sandbox.deadlines.POLL_S", 0.0)
    fake = tmp_path / "ptxas"
    shutil.copy(shutil.which("sleep"), fake)
    parent = subprocess.Popen(["sh", "-c", f"{fake} 5; true"])
    try:
        signs = CompileSigns(tmp_path / "cache", parent.pid)
        end = time.monotonic() + 5
        while signs() is None and time.monotonic() < end:
            time.sleep(0.05)
        assert signs.last is not None
    finally:
        parent.kill()
        parent.wait()


def test_channel_waits_until_a_moving_deadline():
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        start = time.monotonic()
        with pytest.raises(channel.ChannelTimeout):
            channel.read_frame(a.fileno(), lambda: start + 0.3)
        assert 0.25 <= time.monotonic() - start < 2.0
    finally:
        a.close()
        b.close()


# ---- the harness --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def harness():
    with Harness("cpu") as h:
        yield h


@pytest.mark.parametrize("name,stage,request_name", [
    ("forward_loops.py", Stage.SMOKE, "the smoke call"),
    ("kernel_loops.py", Stage.SMOKE, "the smoke call"),
    ("later_call_loops.py", Stage.CORRECTNESS, "the correctness call"),
    ("odd_shape_loops.py", Stage.ROBUSTNESS, "the robustness call"),
])
def test_a_hang_is_rejected_in_seconds_with_its_stage_named(harness, name, stage, request_name):
    t0 = time.monotonic()
    result = harness.check(RMSNORM, HANGS / name, CheckOptions(timeout_s=300, seed=0))
    took = time.monotonic() - t0
    assert not result.accepted
    assert (result.stage, result.reason) == (stage, Reason.TIMEOUT), result.message
    assert result.message.startswith(f"{request_name} did not finish within "), result.message
    assert "compile budget" in result.message or "margin" in result.message
    assert took < CPU_LIMIT_S, f"{name} took {took:.1f} s to reject"
    failed = result.stages[-1]
    assert failed.details["request"] == request_name and failed.details["deadline_s"] < CPU_LIMIT_S


def test_the_ceiling_still_ends_a_check_first_when_it_is_shorter(harness):
    t0 = time.monotonic()
    result = harness.check(RMSNORM, HANGS / "forward_loops.py", CheckOptions(timeout_s=4, seed=0))
    assert (result.stage, result.reason) == (Stage.SMOKE, Reason.TIMEOUT)
    assert "the check's ceiling" in result.message and time.monotonic() - t0 < 15


@pytest.mark.parametrize("candidate,task", [
    (HERE / "candidates" / "rmsnorm_honest.py", RMSNORM),
    *[(s.path, TASKS_DIR / t) for s in all_seeds() if s.name in ("rmsnorm", "softmax") for t in s.tasks[:1]],
])
def test_honest_kernels_still_pass(harness, candidate, task):
    result = harness.check(task, candidate, CheckOptions(timeout_s=300, seed=0))
    assert result.accepted, f"{candidate.name}: {result.stage.value}/{result.reason.value}: {result.message}"
