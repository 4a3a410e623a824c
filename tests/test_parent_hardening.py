"""The parent believes nothing the candidate's process sends, and every check ends with a verdict.

Each attack in tests/candidates/attacks/parent_*.py runs in a real child forked from the harness's zygote; the
static stage is bypassed (as tests/test_policy.py reaches the runtime layers directly), so these show what the
parent does when a candidate gets past every Python-level layer: it forges replies, stops itself, or kills or stops
the zygote. Each check must reject within its timeout, and the same Harness must then accept an honest kernel.
"""
import time
from pathlib import Path

import pytest

from sandbox import static
from sandbox.harness import CheckOptions, Harness
from sandbox.records import Reason, Stage, Verdict

HERE = Path(__file__).parent
ATTACKS = HERE / "candidates" / "attacks"
ROW_MEAN = HERE / "tasks" / "row_mean.py"
HONEST = HERE / "candidates" / "row_mean_honest.py"
TIMEOUT_S = 30.0
GRACE_S = 15.0  # process.CLOSE_GRACE_S + process.CONTROL_TIMEOUT_S, plus a loaded machine's scheduling


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


@pytest.mark.parametrize("forgery, reasons", [
    ("deep", {Reason.SANDBOX_VIOLATION}),
    ("wrong_type", {Reason.SANDBOX_VIOLATION}),
    ("unknown_reason", {Reason.SANDBOX_VIOLATION}),
    ("truncated_then_stop", {Reason.SANDBOX_VIOLATION}),
])
def test_a_forged_reply_from_a_real_child_is_refused(harness, no_static, tmp_path, forgery, reasons):
    source = (ATTACKS / "parent_forged_reply.py").read_text(encoding="utf-8")
    candidate = tmp_path / f"parent_forged_{forgery}.py"
    candidate.write_text(source.replace('FORGERY = "deep"', f"FORGERY = {forgery!r}"), encoding="utf-8")
    result, elapsed = _check(harness, candidate)
    assert result.stage is Stage.SMOKE and result.reason in reasons, (result.reason, result.message)
    if forgery == "truncated_then_stop":
        assert "stopped itself" in result.message and elapsed < TIMEOUT_S / 2, (elapsed, result.message)
    else:
        assert "malformed reply" in result.message, result.message


def test_a_child_that_stops_itself_is_noticed_before_its_timeout(harness, no_static):
    result, elapsed = _check(harness, ATTACKS / "parent_stops_itself.py")
    assert result.reason is Reason.SANDBOX_VIOLATION and "stopped itself" in result.message, result.message
    assert elapsed < TIMEOUT_S / 2, elapsed


@pytest.mark.parametrize("attack, how", [("parent_kills_zygote.py", "died (killed by SIGKILL)"),
                                         ("parent_stops_zygote.py", "was stopped")])
def test_a_child_that_kills_or_stops_the_zygote_is_rejected_and_the_zygote_replaced(harness, no_static, attack,
                                                                                      how):
    before = harness.zygote
    result, _ = _check(harness, ATTACKS / attack)
    assert result.reason is Reason.SANDBOX_VIOLATION, (result.reason, result.message)
    assert f"worker process {how}" in result.message, result.message
    assert before.health() is not None and before.proc.poll() is not None  # lost, and killed (not left stopped)
    _honest_still_accepted(harness)
    assert harness.zygote is not before


def test_the_harness_is_usable_after_forged_replies(harness):
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
