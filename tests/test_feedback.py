"""The loop learns from its own diagnostics: what each request shows the model, and when it is sent.

A quick judge stands in for the harness (a verdict from the file's content, after a short wait, as a check takes
time); the acceptance run at the end goes through the real harness and a fake OpenAI-compatible endpoint.
"""
import threading
import time
from pathlib import Path

import pytest

from agent.archive import Archive
from agent.fake import FakeProvider
from agent.loop import RunConfig, run_search
from sandbox.records import CheckResult, Reason, Stage, StageResult, Verdict
from tests.test_loop import COMPILE_ERROR, GOOD, TASK, WRONG, fenced

ERROR = "AttributeError: module 'triton.language' has no attribute 'no_such_function'"


class Judge:
    """The harness's verdicts, by content: a compile error, a wrong result, or accepted (not timed)."""

    delay_s = 0.3
    checked: list[str] = []

    def __init__(self, *args):
        pass

    def check(self, path: Path, baselines=None) -> CheckResult:
        source = path.read_text()
        Judge.checked.append(source)
        time.sleep(Judge.delay_s)
        if "no_such_function" in source:
            line = next(i for i, s in enumerate(source.split("\n"), 1) if "no_such_function" in s)
            err = {"type": "AttributeError", "message": ERROR.split(": ", 1)[1],
                   "traceback": f'Traceback (most recent call last):\n  File "{path}", line {line}, in _scale_kernel\n'
                                f"{ERROR}\n"}
            stage = StageResult(Stage.SMOKE, False, Reason.RUNTIME_ERROR, message=ERROR, error=err)
            return CheckResult(task="t", candidate=str(path), device="cpu", verdict=Verdict.REJECTED,
                               stage=Stage.SMOKE, reason=Reason.RUNTIME_ERROR, message=ERROR, stages=(stage,),
                               seconds=Judge.delay_s, timed=False)
        if "x * 3.0" in source:
            msg = "output 0: 4096 of 4096 elements differ; worst at [7]: expected 1.5, got 1.75"
            stage = StageResult(Stage.CORRECTNESS, False, Reason.OUTPUT_MISMATCH, message=msg)
            return CheckResult(task="t", candidate=str(path), device="cpu", verdict=Verdict.REJECTED,
                               stage=Stage.CORRECTNESS, reason=Reason.OUTPUT_MISMATCH, message=msg, stages=(stage,),
                               seconds=Judge.delay_s, timed=False)
        stage = StageResult(Stage.ROBUSTNESS, True, Reason.OK)
        return CheckResult(task="t", candidate=str(path), device="cpu", verdict=Verdict.ACCEPTED,
                           stage=Stage.ROBUSTNESS, reason=Reason.OK, message="ok", stages=(stage,),
                           seconds=Judge.delay_s, timed=False, environment={"torch": "2.x", "triton": "3.x", "device": "cpu"})

    def close(self):
        pass


@pytest.fixture
def task(tmp_path) -> Path:
    path = tmp_path / "scale.py"
    path.write_text(TASK)
    return path


def run(task, archive, fake, **config):
    Judge.checked = []
    config = {"budget": 2, "device": "cpu", "concurrency": 1, "polish": 0, **config}
    return run_search(RunConfig(task_path=task, **config), archive, provider=fake, evaluator_factory=Judge)


# ---- feedback-bounded proposing ---------------------------------------------------------------------------------
def test_with_concurrency_1_each_request_sees_the_previous_verdict(tmp_path, task):
    fake = FakeProvider("fake:m").enqueue(fenced(COMPILE_ERROR, "first")).enqueue(fenced(WRONG, "second"))
    fake.enqueue(fenced(GOOD, "third"))
    with Archive(tmp_path / "a.db") as archive:
        run(task, archive, fake, budget=3)
    first, second, third = fake.prompts
    assert "No kernel yet" in first
    assert "no_such_function" in second and "Why it was rejected" in second
    assert "expected 1.5, got 1.75" in third


def test_outstanding_proposals_never_exceed_concurrency_counting_checks(tmp_path, task):
    """At each request, the proposals sent before it minus the verdicts known must stay below --concurrency."""
    verdicts, seen, lock = [0], [], threading.Lock()
    variants = [fenced(GOOD.replace("BLOCK_SIZE = 1024", f"BLOCK_SIZE = {2 ** i}"), f"v{i}") for i in range(4, 12)]

    class Counting(FakeProvider):
        def complete(self, messages, **kw):
            with lock:
                seen.append(len(self.calls) - verdicts[0])
            return super().complete(messages, **kw)

    fake = Counting("fake:m")
    for v in variants:
        fake.enqueue(v)

    def on_event(event):
        if event.kind.value == "evaluated" and event.candidate is not None and event.candidate.origin == "llm":
            with lock:
                verdicts[0] += 1

    with Archive(tmp_path / "a.db") as archive:
        Judge.checked = []
        s = run_search(RunConfig(task_path=task, budget=6, device="cpu", concurrency=2, polish=0), archive,
                       provider=fake, evaluator_factory=Judge, on_event=on_event)
    assert s.progress.proposals == 6 and len(seen) == 6
    assert max(seen) <= 1, seen  # never a third proposal while two outcomes are unknown


def test_the_same_prompt_is_not_sent_twice_unless_sampling_is_asked_for(tmp_path, task):
    fake = FakeProvider("fake:m", default=fenced(COMPILE_ERROR, "broken"))
    with Archive(tmp_path / "a.db") as archive:
        run(task, archive, fake, budget=2, concurrency=2)
    # the second request waited for the first one's verdict: it asks for a fix, not a first kernel again
    assert "No kernel yet" in fake.prompts[0] and "No kernel yet" not in fake.prompts[1]
    fake = FakeProvider("fake:m", default=fenced(COMPILE_ERROR, "broken"))
    with Archive(tmp_path / "b.db") as archive:
        run(task, archive, fake, budget=2, concurrency=2, samples=2)
    assert fake.prompts[0] == fake.prompts[1]  # parallel sampling, as asked
