"""The parent believes nothing the candidate's process sends, and every check ends with a verdict.

Two kinds of test. The attacks in tests/candidates/attacks/parent_*.py run in a real child forked from the
harness's zygote, with the static stage bypassed (as tests/test_policy.py reaches the runtime layers directly): they
forge replies on the worker's socket, stop themselves, or kill or stop the zygote, and each must end in a rejection
within its timeout. Whether the signals land depends on the other layers (audit hook, PID namespace), so the
parent's side of them is also exercised directly: this test stops the candidate's processes, or kills or stops the
zygote, while a candidate spins in its forward. Each time the same Harness must then accept an honest kernel.
"""
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from sandbox import process, static
from sandbox.harness import CheckOptions, Harness
from sandbox.records import Reason, Stage, Verdict

HERE = Path(__file__).parent
ATTACKS = HERE / "candidates" / "attacks"
ROW_MEAN = HERE / "tasks" / "row_mean.py"
HONEST = HERE / "candidates" / "row_mean_honest.py"
TIMEOUT_S = 30.0
GRACE_S = 15.0  # process.CLOSE_GRACE_S + process.CONTROL_TIMEOUT_S, plus a loaded machine's scheduling
SPIN = """
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        while True:
            pass
"""


@pytest.fixture(scope="module")
def harness():
    with Harness("cpu") as h:
        yield h


@pytest.fixture
def no_static(monkeypatch):
    monkeypatch.setattr(static, "check_source", lambda source, filename="": None)


def _check(harness, candidate):
    t0 = time.monotonic()
    result = harness.check(ROW_MEAN, candidate, CheckOptions(timeout_s=TIMEOUT_S))
    elapsed = time.monotonic() - t0
    assert result.verdict is Verdict.REJECTED, result.message
    assert elapsed < TIMEOUT_S + GRACE_S, f"the check took {elapsed:.1f} s"
    return result, elapsed


def _honest_still_accepted(harness):
    result = harness.check(ROW_MEAN, HONEST, CheckOptions(timeout_s=120))
    assert result.verdict is Verdict.ACCEPTED, result.message


@pytest.mark.parametrize("forgery, reason, says", [
    ("deep", Reason.SANDBOX_VIOLATION, "header nests deeper"),
    ("wrong_type", Reason.SANDBOX_VIOLATION, "ok must be true or false"),
    ("unknown_reason", Reason.SANDBOX_VIOLATION, "reason is not one of the known values"),
    ("nan_seconds", Reason.SANDBOX_VIOLATION, "NaN is not JSON"),
    ("truncated", Reason.CRASH, "the candidate's process"),  # it ended mid-frame
])
def test_a_forged_reply_from_a_real_child_is_refused(harness, no_static, tmp_path, forgery, reason, says):
    source = (ATTACKS / "parent_forged_reply.py").read_text(encoding="utf-8")
    candidate = tmp_path / f"parent_forged_{forgery}.py"
    candidate.write_text(source.replace('FORGERY = "deep"', f"FORGERY = {forgery!r}"), encoding="utf-8")
    result, _ = _check(harness, candidate)
    assert result.stage is Stage.SMOKE and result.reason is reason, (result.reason, result.message)
    assert says in result.message, result.message


@pytest.mark.parametrize("attack", ["parent_stops_itself.py", "parent_kills_zygote.py", "parent_stops_zygote.py"])
def test_a_child_that_signals_itself_or_the_zygote_is_rejected_in_time(harness, no_static, attack):
    before = harness.zygote
    result, _ = _check(harness, ATTACKS / attack)
    if before.health() is not None:  # the signal reached the zygote: the candidate is blamed, the zygote killed
        assert result.reason is Reason.SANDBOX_VIOLATION and "worker process" in result.message, result.message
        assert before.proc.poll() is not None


def _spin_and(harness, tmp_path, act):
    """Check a candidate that spins in its forward; `act(child_pid)` runs once the child has run a second."""
    candidate = tmp_path / "spin.py"
    candidate.write_text(SPIN, encoding="utf-8")
    zygote = harness.zygote

    def later():
        end = time.monotonic() + TIMEOUT_S
        while time.monotonic() < end:
            tree = process.process_tree(zygote.pid)
            if len(tree) > 1:
                time.sleep(1.0)
                act(tree[1])
                return
            time.sleep(0.05)

    actor = threading.Thread(target=later)
    actor.start()
    try:
        return _check(harness, candidate)
    finally:
        actor.join()


def test_a_stopped_child_is_noticed_long_before_the_timeout(harness, no_static, tmp_path):
    def stop(pid):
        for p in process.process_tree(pid):
            os.kill(p, signal.SIGSTOP)

    result, elapsed = _spin_and(harness, tmp_path, stop)
    assert result.reason is Reason.SANDBOX_VIOLATION and "stopped itself" in result.message, result.message
    assert elapsed < TIMEOUT_S / 2, elapsed


@pytest.mark.parametrize("sig, how", [(signal.SIGKILL, "died (killed by SIGKILL)"), (signal.SIGSTOP, "was stopped")])
def test_a_zygote_lost_mid_check_ends_it_at_once_and_is_replaced(harness, no_static, tmp_path, sig, how):
    before = harness.zygote
    result, elapsed = _spin_and(harness, tmp_path, lambda _pid: os.kill(before.pid, sig))
    assert result.reason is Reason.SANDBOX_VIOLATION, (result.reason, result.message)
    assert f"worker process {how}" in result.message, result.message
    assert elapsed < TIMEOUT_S / 2, elapsed
    assert before.proc.poll() is not None  # killed, not left stopped
    _honest_still_accepted(harness)
    assert harness.zygote is not before


def test_the_harness_is_usable_after_every_attack(harness):
    _honest_still_accepted(harness)


@pytest.mark.parametrize("bomb", ["x = " + "1+" * 100_000 + "1\n", "x = " + "[" * 50_000 + "]" * 50_000 + "\n",
                                  "x = " + "-" * 100_000 + "1\n", "x = f" + "()" * 100_000 + "\n"])
def test_an_ast_bomb_is_a_static_finding(harness, tmp_path, bomb):
    candidate = tmp_path / "bomb.py"
    candidate.write_text(bomb, encoding="utf-8")
    finding = static.check_source(bomb, "bomb.py")
    assert finding is not None and finding.reason is Reason.SYNTAX_ERROR, finding
    result = harness.check(ROW_MEAN, candidate)
    assert result.stage is Stage.STATIC and result.reason is Reason.SYNTAX_ERROR, result.message


def test_a_flood_of_output_keeps_only_a_capped_tail(monkeypatch):
    """The drain holds the last OUTPUT_TAIL_BYTES whatever the child writes, and past FLOOD_BYTES reads at a paced
    rate (a child writing as fast as it can then mostly waits on a full pipe)."""
    import mmap
    import socket

    monkeypatch.setattr(process, "FLOOD_BYTES", 1 << 20)
    r, w = os.pipe()
    mine, theirs = socket.socketpair()
    child = process.Child(0, mine, r, zygote=None, shared=mmap.mmap(-1, 4096))
    chunk = b"x" * (1 << 16)
    t0 = time.monotonic()
    for _ in range(64):  # 4 MiB
        os.write(w, chunk)
    os.write(w, b"the end")
    os.close(w)
    child._drain.join(timeout=30)
    assert not child._drain.is_alive()
    assert child.output_bytes == 64 * len(chunk) + 7
    assert len(child._tail) <= process.OUTPUT_TAIL_BYTES and child.output_tail(7) == "the end"
    assert time.monotonic() - t0 >= 48 * process.FLOOD_PACE_S  # the 3 MiB past the threshold came in paced reads
    mine.close()
    theirs.close()


@pytest.fixture
def fake_zygote(monkeypatch, tmp_path):
    """A Zygote whose control socket's far end is the test's, and whose process is a plain sleep."""
    import socket
    import subprocess
    import tempfile

    monkeypatch.setattr(process, "CONTROL_TIMEOUT_S", 1.0)
    z = process.Zygote.__new__(process.Zygote)
    z.ctrl, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    z.proc = subprocess.Popen(["sleep", "60"])
    z._lock, z.lost, z._stderr = threading.Lock(), None, tempfile.TemporaryFile()
    yield z, far
    z.close()
    far.close()


@pytest.mark.parametrize("answer, says", [
    (b"not json", "malformed control reply"),
    (b"[" * 100_000, "malformed control reply"),
    (b'{"pid": "7"}', "malformed control reply"),
    (b'{"pid": 1}', "malformed control reply"),
    (b'{"pid": 99, "status": 0}', "malformed control reply"),  # a wait answered for another pid
    (None, "did not answer"),
])
def test_the_zygotes_control_replies_are_checked_and_waited_for_with_a_deadline(fake_zygote, answer, says):
    z, far = fake_zygote
    if answer is not None:
        far.send(answer)
    t0 = time.monotonic()
    with pytest.raises(process.ZygoteLost) as info:
        if b"status" in (answer or b""):
            z.wait_status(42)
        else:
            z.spawn()
    assert says in str(info.value), str(info.value)
    assert time.monotonic() - t0 < 5 and z.proc.poll() is not None  # killed, and marked lost for later calls
    with pytest.raises(process.ZygoteLost):
        z.wait_status(42)
