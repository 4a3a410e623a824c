"""The loop with a fake LLM and the real harness (CPU interpreter), on a tiny task written here.

Every kind of bad proposal is replayed; the run must survive each one and archive it with the right reason.
"""
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agent.archive.records import Candidate, DuelOutcome, sha256

from agent.archive.store import Archive
from agent.llm.fake import FakeProvider
from agent.llm.chat import ProviderError, Usage
from agent.search.issuing import FEWER_CHECKS, MORE_CHECKS, REGAIN_AFTER
from agent.search.loop import EventKind, LoopError, RunConfig, run_search
from sandbox.records import GPU_FULL, GPU_FULL_HARNESS, GPU_FULL_SHARED, CheckResult, Reason, Stage, StageResult, Verdict

TASK = '''"""y = 2 * x + 1 on a vector (a task small enough for the interpreter)."""
import torch
import torch.nn as nn

N = 4096


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
'''

GOOD = '''import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK_SIZE = 1024


@triton.jit
def _scale_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask)
    tl.store(Y + offs, x * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        _scale_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, y, n, BLOCK=BLOCK_SIZE, num_warps=4)
        return y
'''
GOOD_512 = GOOD.replace("BLOCK_SIZE = 1024", "BLOCK_SIZE = 512")
WRONG = GOOD.replace("x * 2.0 + 1.0, mask", "x * 3.0 + 1.0, mask")
COMPILE_ERROR = GOOD.replace("tl.arange(0, BLOCK)", "tl.arange(0, BLOCK) + tl.no_such_function(1)")
SYNTAX_ERROR = GOOD.replace("def forward(self, x):", "def forward(self, x)")
CHEAT = GOOD.replace("        return y", "        return (x[:, None] @ torch.full((1, 1), 2.0)).squeeze(1) + 1.0")


def fenced(code: str, note: str) -> str:
    return f"{note}\n\n```python\n{code}```\n"


@pytest.fixture
def task(tmp_path) -> Path:
    path = tmp_path / "scale.py"
    path.write_text(TASK)
    return path


@pytest.fixture
def kernel(tmp_path) -> Path:
    path = tmp_path / "start.py"
    path.write_text(GOOD)
    return path


def by_reply(archive: Archive) -> dict[str, Candidate]:
    return {c.reply.split("\n")[0]: c for c in archive.candidates() if c.origin == "llm" and c.reply}


def test_the_run_survives_every_kind_of_bad_proposal(tmp_path, task):
    fake = FakeProvider("fake:model")
    fake.enqueue(fenced(GOOD_512, "good"), usage=Usage(input_tokens=100, output_tokens=50))
    fake.enqueue(fenced(SYNTAX_ERROR, "syntax"))
    fake.enqueue(fenced(COMPILE_ERROR, "compile"))
    fake.enqueue(fenced(WRONG, "wrong"))
    fake.enqueue(fenced(CHEAT, "cheat"))
    fake.enqueue("no code: I think the kernel is already optimal.")
    fake.enqueue_error(ProviderError("the endpoint answered 503 five times; try again later", transient=True))
    fake.enqueue(fenced(GOOD_512, "duplicate"))
    events = []
    with Archive(tmp_path / "a.db") as archive:
        summary = run_search(RunConfig(task_path=task, budget=8, device="cpu", concurrency=1, polish=0), archive,
                             provider=fake, on_event=events.append)
        got = by_reply(archive)
        assert {k: (c.verdict, c.stage, c.reason) for k, c in got.items()} == {
            "good": ("accepted", "robustness", "ok"),
            "syntax": ("rejected", "static", "syntax_error"),
            "compile": ("rejected", "smoke", "runtime_error"),  # the interpreter reports compile errors at run time
            "wrong": ("rejected", "correctness", "output_mismatch"),
            "cheat": ("rejected", "smoke", "torch_compute"),
            "no code: I think the kernel is already optimal.": ("rejected", "propose", "no_code"),
            "duplicate": ("rejected", "propose", "duplicate"),
        }
        errors = [c for c in archive.candidates() if c.reason == "provider_error"]
        assert len(errors) == 1 and "503" in errors[0].message and errors[0].source_sha is None
        assert "no_such_function" in got["compile"].message
        assert got["good"].input_tokens == 100 and got["good"].output_tokens == 50
        assert got["good"].prompt.startswith("[system]") and "scale" in got["good"].prompt
        assert not got["good"].timed and got["good"].speedup is None  # CPU: nothing timed
        assert got["wrong"].diagnostics["stages"][-1]["mismatch"]["mismatched"] > 0
    assert summary.stop_reason == "budget spent" and summary.progress.proposals == 8
    assert summary.progress.accepted == 1 and summary.progress.input_tokens == 100
    assert summary.start is None  # no seed for this task: the LLM started from the reference
    assert summary.best.id == got["good"].id and summary.best_path.read_text() == GOOD_512
    assert "No kernel yet" in fake.calls[0].prompt
    # once a kernel failed, the model is shown the failure (fix) or a verified kernel (improve)
    assert any("rejected" in c.prompt or "Accepted" in c.prompt for c in fake.calls[1:])
    assert events[0].kind is EventKind.START and events[-1].kind is EventKind.FINISHED
    assert fake.pending == 0


def test_tuner_from_a_kernel_and_resume(tmp_path, task, kernel):
    with Archive(tmp_path / "a.db") as archive:
        first = run_search(RunConfig(task_path=task, budget=2, device="cpu", start_from=kernel), archive)
        assert first.proposer == "tuner" and first.start.origin == "seed" and first.start.accepted
        assert first.progress.proposals == 2
        rows = archive.candidates(run_id=first.run_id)
        assert [c.origin for c in rows] == ["seed", "tuner", "tuner"]
        assert all(c.parent_id is not None and c.prompt.startswith("tuner ") for c in rows[1:])
        assert len({c.source_sha for c in rows}) == 3
        # resume: same run, the budget counts what was done, the starting kernel is not checked again
        again = run_search(RunConfig(task_path=task, budget=4, device="cpu", resume="latest"), archive)
        assert again.run_id == first.run_id and again.progress.proposals == 4
        rows2 = archive.candidates(run_id=first.run_id)
        assert [c.id for c in rows2[:3]] == [c.id for c in rows] and len(rows2) == 5
        assert [c.origin for c in rows2].count("seed") == 1
        assert len({c.source_sha for c in rows2}) == 5
        assert archive.get_run(first.run_id).stop_reason == "budget spent"


def test_tuner_without_a_kernel_refuses_to_start(tmp_path, task):
    with Archive(tmp_path / "a.db") as archive:
        with pytest.raises(LoopError, match="tuner needs a kernel"):
            run_search(RunConfig(task_path=task, budget=2, device="cpu"), archive)
        with pytest.raises(LoopError, match="no earlier run"):
            run_search(RunConfig(task_path=task, budget=2, device="cpu", resume="latest"), archive)
        with pytest.raises(LoopError, match="does not exist"):
            run_search(RunConfig(task_path=task.parent / "missing.py", budget=2, device="cpu"), archive)
        assert archive.candidates() == []


# ---- loop logic with a scripted evaluator (timings the CPU cannot produce) --------------------------------------------

class ScriptedEvaluator:
    """Accepts every candidate with a timing whose roofline % rises by 30 per call."""

    calls = 0
    asked: list = []  # the baselines each check was asked for (None: the run's own)
    raced: list = []  # the incumbent time each check was given to race (None: no race)

    def __init__(self, *args):
        self.closed = False

    def check(self, path: Path, baselines=None, incumbent_ms=None, retime=False) -> CheckResult:
        ScriptedEvaluator.asked.append(baselines)
        ScriptedEvaluator.raced.append(incumbent_ms)
        ScriptedEvaluator.calls += 1
        pct = 30.0 * ScriptedEvaluator.calls
        stage = StageResult(Stage.ROBUSTNESS, True, Reason.OK)
        timing = {"candidate_ms": 1.0 / ScriptedEvaluator.calls,
                  "baselines": {"eager": {"ms": 1.0, "speedup": float(ScriptedEvaluator.calls),
                                          "ci_low": ScriptedEvaluator.calls - 0.1,
                                          "ci_high": ScriptedEvaluator.calls + 0.1, "significant": True}},
                  "roofline": {"pct_of_roofline": pct, "bound": "memory"}}
        return CheckResult(task="t", candidate=str(path), device="cpu", verdict=Verdict.ACCEPTED,
                           stage=Stage.ROBUSTNESS, reason=Reason.OK, message="ok", stages=(stage,), seconds=0.01,
                           timed=True, timing=timing, environment={"gpu": "scripted"})

    def close(self):
        self.closed = True


def test_each_proposal_races_the_best_time_so_far(tmp_path, task, kernel):
    """After the first verified, timed kernel, every proposal's check is given the best's time to race (its timing
    stops once it cannot win); the starting kernel, with nothing to beat, runs in full."""
    ScriptedEvaluator.calls, ScriptedEvaluator.raced, ScriptedEvaluator.asked = 0, [], []
    with Archive(tmp_path / "a.db") as archive:
        run_search(RunConfig(task_path=task, budget=3, device="cpu", start_from=kernel, concurrency=1), archive,
                   evaluator_factory=ScriptedEvaluator)
    assert ScriptedEvaluator.raced == [None, 1.0, 0.5, pytest.approx(1 / 3)]  # the best so far: 1/calls ms


def test_target_roofline_and_token_budget_stop_early(tmp_path, task, kernel):
    ScriptedEvaluator.calls = 0
    with Archive(tmp_path / "a.db") as archive:
        s = run_search(RunConfig(task_path=task, budget=20, device="cpu", start_from=kernel, target_roofline=80),
                       archive, evaluator_factory=ScriptedEvaluator)
        assert s.stop_reason.startswith("target reached") and s.progress.proposals < 20
        assert s.best.timings.pct_roofline >= 80 and s.best.timings.speedup_eager == 3.0
        fake = FakeProvider("fake:model", default=fenced(GOOD_512, "again"))
        for i in range(6):
            fake.enqueue(fenced(GOOD.replace("1024", str(2 ** (i + 4))), f"v{i}"),
                         usage=Usage(input_tokens=600, output_tokens=0))
        s2 = run_search(RunConfig(task_path=task, budget=20, device="cpu", start_from=kernel, max_tokens=1000,
                                  concurrency=1, polish=0), archive, provider=fake,
                        evaluator_factory=ScriptedEvaluator)
        assert s2.stop_reason.startswith("token budget reached") and s2.progress.proposals == 2


def test_stop_records_in_flight_as_interrupted(tmp_path, task, kernel):
    release = threading.Event()
    stop = threading.Event()

    class Slow(ScriptedEvaluator):
        def check(self, path, baselines=None, incumbent_ms=None, retime=False):
            if ScriptedEvaluator.calls >= 1:  # the starting kernel passes; the next check hangs
                stop.set()
                release.wait(30)
            return super().check(path, baselines)

    ScriptedEvaluator.calls = 0
    with Archive(tmp_path / "a.db") as archive:
        s = run_search(RunConfig(task_path=task, budget=5, device="cpu", start_from=kernel), archive,
                       evaluator_factory=Slow, stop=stop)
        release.set()
        rows = archive.candidates(run_id=s.run_id)
        assert s.stop_reason == "interrupted"
        assert [c.verdict for c in rows] == ["accepted", "interrupted"]
        assert rows[1].source is None and archive.get(rows[1].id).source  # the file is kept for a resume
        assert archive.get_run(s.run_id).stop_reason == "interrupted"
        assert rows[1].source_sha not in archive.known_sources(rows[1].task_hash, timed=False)


# ---- the same through the real SDK clients, against a scripted server on loopback -------------------------------------

def test_run_through_real_clients_survives_http_failures(tmp_path, task, monkeypatch):
    from agent.llm.pool import make_provider
    from tests.llm_server import (ScriptedServer, anthropic_message, json_reply, openai_completion, openai_stream,
                                  raw_reply, sse_reply)

    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "CRUCIBLE_PRICES"):
        monkeypatch.delenv(var, raising=False)
    fast = {"backoff_s": 0.01, "backoff_max_s": 0.02, "max_attempts": 2}
    with ScriptedServer() as server, Archive(tmp_path / "a.db") as archive:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        monkeypatch.setenv("ANTHROPIC_API_KEY", "ak-test")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        server.add(
            json_reply({"error": {"message": "slow down"}}, status=429, **{"Retry-After": "0"}),
            json_reply(openai_completion(fenced(GOOD_512, "good"), prompt_tokens=900, completion_tokens=300)),
            json_reply({"error": {"message": "boom"}}, status=500),
            json_reply({"error": {"message": "unavailable"}}, status=503),  # retries spent: provider_error
            raw_reply("{this is not json"),
            json_reply(openai_completion("I would rather not write code today.")),  # no_code
            json_reply(openai_completion(fenced(WRONG, "wrong"))),
        )
        provider = make_provider("openai:served", prices={"openai:served": {"input": 1.0, "output": 2.0}}, **fast)
        s = run_search(RunConfig(task_path=task, budget=4, device="cpu", concurrency=1, polish=0), archive,
                       provider=provider)
        # evaluation overlaps the next request, so records land in completion order, not request order
        reasons = sorted((c.reason, c.input_tokens, c.output_tokens) for c in archive.candidates(run_id=s.run_id))
        assert reasons == [("no_code", 11, 7), ("ok", 900, 300), ("output_mismatch", 11, 7), ("provider_error", 0, 0)]
        assert s.progress.cost_usd == pytest.approx((900 + 2 * 11) * 1e-6 + (300 + 2 * 7) * 2e-6)
        assert {c.proposer for c in archive.candidates(run_id=s.run_id)} == {"openai:served"}
        assert "503" in next(c.message for c in archive.candidates(run_id=s.run_id) if c.reason == "provider_error")

        # Anthropic and a streamed OpenAI reply feed the same archive
        server.add(json_reply(anthropic_message(fenced(CHEAT, "cheat"))))
        claude = make_provider("anthropic:served-claude", **fast)
        s2 = run_search(RunConfig(task_path=task, budget=1, device="cpu", polish=0), archive, provider=claude)
        assert [c.reason for c in archive.candidates(run_id=s2.run_id)] == ["torch_compute"]
        server.add(sse_reply(openai_stream(["Faster:\n```python\n", GOOD.replace("1024", "2048"), "```\n"])))
        streamed = make_provider("openai:served", stream=True, **fast)
        s3 = run_search(RunConfig(task_path=task, budget=1, device="cpu", polish=0), archive, provider=streamed)
        assert [c.reason for c in archive.candidates(run_id=s3.run_id)] == ["ok"]


def test_an_endpoint_that_never_answers_stops_the_run(tmp_path, task, monkeypatch):
    from agent.llm.pool import make_provider
    from tests.llm_server import closed_port

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{closed_port()}/v1")
    provider = make_provider("openai:served", backoff_s=0.01, backoff_max_s=0.02, max_attempts=2)
    with Archive(tmp_path / "a.db") as archive:
        s = run_search(RunConfig(task_path=task, budget=10, device="cpu", concurrency=1), archive, provider=provider)
        assert [c.reason for c in archive.candidates()] == ["provider_error", "provider_error"]
    assert s.replies == 0 and "could not reach" in s.provider_failure and s.progress.proposals == 2


def test_time_and_cost_limits(tmp_path, task, kernel):
    from agent.llm.chat import Price

    ScriptedEvaluator.calls = 0
    with Archive(tmp_path / "a.db") as archive:
        s = run_search(RunConfig(task_path=task, budget=5, device="cpu", start_from=kernel, time_limit_s=0),
                       archive, evaluator_factory=ScriptedEvaluator)
        assert s.stop_reason.startswith("time limit reached") and s.progress.proposals == 0
        fake = FakeProvider("fake:priced", price=Price(input=1000.0, output=0.0))  # $0.001 per input token
        for i in range(5):
            fake.enqueue(fenced(GOOD.replace("1024", str(2 ** (i + 4))), f"v{i}"), usage=Usage(input_tokens=2))
        s2 = run_search(RunConfig(task_path=task, budget=5, device="cpu", start_from=kernel, max_cost=0.005,
                                  concurrency=1, polish=0), archive, provider=fake,
                        evaluator_factory=ScriptedEvaluator)
        assert s2.stop_reason.startswith("cost budget reached") and s2.progress.proposals == 3
        assert s2.progress.cost_usd == pytest.approx(0.006)


def test_one_evaluation_worker_per_gpu(tmp_path, task, kernel, monkeypatch):
    """With --gpus 2 --checks-per-gpu 1 two harnesses (GPU 0 and 1) evaluate at once; scripted, since this machine
    has no GPU (tests/test_pipeline.py: several per GPU)."""
    import agent.search.loop as loop_mod
    import torch

    monkeypatch.setattr(loop_mod, "_device", lambda device: "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    made, busy, peak = [], set(), []
    lock = threading.Lock()

    class PerGpu(ScriptedEvaluator):
        def __init__(self, task_obj, device, gpu):
            made.append((device, gpu))
            self.gpu = gpu

        def check(self, path, baselines=None, incumbent_ms=None, retime=False):
            with lock:
                busy.add(self.gpu)
                peak.append(len(busy))
            threading.Event().wait(0.3)
            with lock:
                busy.discard(self.gpu)
            return super().check(path, baselines)

    ScriptedEvaluator.calls = 0
    with Archive(tmp_path / "a.db") as archive:
        s = run_search(RunConfig(task_path=task, budget=6, device="cuda", gpus=2, start_from=kernel, checks_per_gpu=1),
                       archive, evaluator_factory=PerGpu)
        assert s.progress.proposals == 6 and s.timed
    assert sorted(made) == [("cuda", 0), ("cuda", 1)] and max(peak) == 2
    with Archive(tmp_path / "b.db") as archive:
        with pytest.raises(LoopError, match="more GPUs"):
            run_search(RunConfig(task_path=task, budget=1, device="cuda", gpus=3, start_from=kernel), archive,
                       evaluator_factory=PerGpu)


def test_the_best_is_checked_again_against_the_final_baselines(tmp_path, task, kernel, monkeypatch):
    """Candidates are timed against eager alone; the run's best is checked once more, every stage, against
    eager, torch.compile, Liger and the vendor library, and that re-check is appended to the archive. A best that fails it is said so."""
    import agent.search.loop as loop_mod
    import torch

    monkeypatch.setattr(loop_mod, "_device", lambda device: "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    ScriptedEvaluator.calls, ScriptedEvaluator.asked = 0, []
    with Archive(tmp_path / "a.db") as archive:
        s = run_search(RunConfig(task_path=task, budget=2, device="cuda", start_from=kernel), archive,
                       evaluator_factory=ScriptedEvaluator)
        # between the proposals' checks, a duel re-timed a challenger against the seed (eager alone)
        assert [a for a in ScriptedEvaluator.asked if a != ("eager",)] == \
            [None, None, None, ("eager", "compile", "liger", "vendor")]
        assert s.final is not None and s.final.candidate_id == s.best.id and s.final.status == "confirmed"
        # these timings carry no per-round data: two paired checks per duel, never significant, the seed stays best
        fought = [d for d in s.duels if d.legs]
        assert fought and all(d.n_pairs == 2 and not d.crowned for d in fought) and s.best.id == s.start.id
        assert all(d.outcome is DuelOutcome.WITHIN_NOISE for d in s.duels if not d.legs)
        assert archive.reverifications(s.best.id)[-1].status == "confirmed"
        assert not s.notes

    class RejectsLast(ScriptedEvaluator):
        def check(self, path, baselines=None, incumbent_ms=None, retime=False):
            result = super().check(path, baselines)
            if baselines is None:
                return result
            return replace(result, verdict=Verdict.REJECTED, stage=Stage.CORRECTNESS,
                           reason=Reason.OUTPUT_MISMATCH, message="wrong result on outliers inputs", timing=None)

    ScriptedEvaluator.calls, ScriptedEvaluator.asked = 0, []
    with Archive(tmp_path / "b.db") as archive:
        s = run_search(RunConfig(task_path=task, budget=1, device="cuda", start_from=kernel), archive,
                       evaluator_factory=RejectsLast)
        assert s.final.status == "stale" and "output_mismatch" in s.final.note
        assert any("did not hold up" in n for n in s.notes)


def test_fitness_prefers_a_speedup_that_holds():
    from agent.archive.records import Timings
    from agent.search.elites import fitness

    def timed(speed, low, high):
        return Candidate(task_path="t", task_hash="h", origin="tuner", proposer="tuner", verdict="accepted",
                         reason="ok", source="x", timed=True,
                         timings=Timings(speedup_eager=speed, eager_ci_low=low, eager_ci_high=high))
    noisy, steady = timed(1.5, 1.1, 1.9), timed(1.45, 1.40, 1.50)
    assert fitness(steady) > fitness(noisy)
    rejected_late = Candidate(task_path="t", task_hash="h", origin="llm", proposer="m", verdict="rejected",
                              reason="output_mismatch", stage="correctness")
    rejected_early = Candidate(task_path="t", task_hash="h", origin="llm", proposer="m", verdict="rejected",
                               reason="syntax_error", stage="static")
    untimed = Candidate(task_path="t", task_hash="h", origin="llm", proposer="m", verdict="accepted", reason="ok",
                        source="y")
    assert fitness(noisy) > fitness(untimed) > fitness(rejected_late) > fitness(rejected_early)


def test_llm_run_ends_with_a_tuner_polish(tmp_path, task, kernel):
    ScriptedEvaluator.calls = 0
    fake = FakeProvider("fake:model")
    fake.enqueue(fenced(GOOD.replace("BLOCK_SIZE = 1024", "BLOCK_SIZE = 128"), "v1"))
    fake.enqueue(fenced(GOOD.replace("BLOCK_SIZE = 1024", "BLOCK_SIZE = 64"), "v2"))
    events = []
    with Archive(tmp_path / "a.db") as archive:
        s = run_search(RunConfig(task_path=task, model="fake:model", budget=4, polish=2, device="cpu",
                                 start_from=kernel, concurrency=1), archive, provider=fake,
                       evaluator_factory=ScriptedEvaluator, on_event=events.append)
        mine = archive.candidates(run_id=s.run_id)
        origins = [c.origin for c in mine]
        tuned = [c for c in mine if c.origin == "tuner"]
        llm_kernels = [c for c in mine if c.origin == "llm"]
        seed_id = mine[0].id
    assert origins == ["seed", "llm", "llm", "tuner", "tuner"] and fake.pending == 0
    assert tuned[0].parent_id in {c.id for c in llm_kernels} | {seed_id}
    assert min(c.id for c in tuned) > max(c.id for c in llm_kernels)  # the polish began after the LLM's verdicts
    assert any(e.kind is EventKind.NOTE and "polish" in e.message for e in events)
    assert "the tuner polishes the last 2" in events[0].message


def _tuned(tmp_path: Path, task: Path, kernel: Path, budget: int, evaluator: type) -> list[Candidate]:
    """The archive's records of a tuner run of `budget` proposals from `kernel`, checked by `evaluator`."""
    ScriptedEvaluator.calls, ScriptedEvaluator.raced, ScriptedEvaluator.asked = 0, [], []
    with Archive(tmp_path / "a.db") as archive:
        run_search(RunConfig(task_path=task, budget=budget, device="cpu", start_from=kernel, concurrency=1, seed=1),
                   archive, evaluator_factory=evaluator)
        return archive.candidates()


def _rejected_at_correctness(path: Path, reason: Reason, message: str) -> CheckResult:
    stage = StageResult(Stage.CORRECTNESS, False, reason, message)
    return CheckResult(task="t", candidate=str(path), device="cpu", verdict=Verdict.REJECTED, stage=Stage.CORRECTNESS,
                       reason=reason, message=message, stages=(stage,), seconds=0.01, timed=False)


def test_the_tuner_does_not_propose_again_a_value_whose_variant_was_rejected(tmp_path, task, kernel):
    """A one-knob variant rejected at correctness (here: every BLOCK_SIZE of 2048) blames that value: the tuner
    proposes it once, whichever verified kernel it starts from next."""
    seen: list[str] = []

    class RejectsBlock2048(ScriptedEvaluator):
        def check(self, path: Path, baselines=None, incumbent_ms=None, retime=False) -> CheckResult:
            source = Path(path).read_text()
            seen.append(source)
            if "BLOCK_SIZE = 2048" in source:
                return _rejected_at_correctness(path, Reason.OUTPUT_MISMATCH, "wrong")
            return super().check(path, baselines, incumbent_ms)

    rows = _tuned(tmp_path, task, kernel, 14, RejectsBlock2048)
    assert len(seen) == 15
    assert sum("BLOCK_SIZE = 2048" in s for s in seen) == 1
    assert any(c.reason == "output_mismatch" for c in rows)


def test_a_check_the_harness_failed_is_run_once_more(tmp_path, task, kernel):
    """A harness_error verdict (the harness ran out of GPU memory beside other checks) says nothing about the
    kernel: the candidate is checked again, once; a second failure is recorded as it is."""
    seen: list[str] = []

    class FailsFirstTwice(ScriptedEvaluator):
        def check(self, path: Path, baselines=None, incumbent_ms=None, retime=False) -> CheckResult:
            source = Path(path).read_text()
            seen.append(source)
            first, always = len(seen) == 2, "BLOCK_SIZE = 2048" in source
            if first or always:  # the first proposal fails once; any BLOCK_SIZE 2048 fails every time
                return _rejected_at_correctness(path, Reason.HARNESS_ERROR, "out of GPU memory")
            return super().check(path, baselines, incumbent_ms)

    rows = [c for c in _tuned(tmp_path, task, kernel, 12, FailsFirstTwice) if c.origin == "tuner"]
    assert seen[1] == seen[2]  # the first proposal, checked again
    by_sha = {sha256(s): s for s in seen}
    first = next(c for c in rows if c.source_sha == sha256(seen[1]))
    assert first.accepted
    failing = [c for c in rows if "BLOCK_SIZE = 2048" in by_sha[c.source_sha]]
    for c in failing:
        assert c.reason == "harness_error" and seen.count(by_sha[c.source_sha]) == 2
    assert failing and len(rows) == 12 and len(seen) == 1 + 12 + 1 + len(failing)


def test_a_run_stops_after_three_checks_in_a_row_the_harness_failed(tmp_path, task, kernel):
    """Checks the harness itself fails every time (a machine whose Triton interpreter cannot run the kernels) stop
    the run at the third in a row, saying why, instead of spending the whole budget on verdicts that say nothing."""
    seen: list[str] = []

    class AlwaysFails(ScriptedEvaluator):
        def check(self, path: Path, baselines=None, incumbent_ms=None, retime=False) -> CheckResult:
            seen.append(Path(path).read_text())
            if len(seen) == 1:  # the starting kernel passes
                return super().check(path, baselines, incumbent_ms)
            return _rejected_at_correctness(path, Reason.HARNESS_ERROR, "Triton 3.6's CPU interpreter cannot run")

    with Archive(tmp_path / "a.db") as archive:
        summary = run_search(RunConfig(task_path=task, budget=12, device="cpu", start_from=kernel, concurrency=1,
                                       seed=1), archive, evaluator_factory=AlwaysFails)
        rows = [c for c in archive.candidates() if c.origin == "tuner"]
    assert [c.reason for c in rows] == ["harness_error"] * 3
    assert len(seen) == 1 + 3 * 2  # each failing proposal checked twice
    assert "the harness failed 3 times in a row" in summary.stop_reason
    assert "CPU interpreter cannot run" in summary.stop_reason


def _full_gpu_run(tmp_path: Path, task: Path, kernel: Path, budget: int, fills: dict[tuple[int, int], int],
                  how: str = GPU_FULL_HARNESS, crowd: dict[tuple[int, int], int] | None = None
                  ) -> tuple[list[str], dict[int, int], list[str], list[Candidate]]:
    """A tuner run at three checks at once in which the check starting `k`-th in phase `p` ends because the GPU was
    full, `fills[(p, k)]` times in a row (its retry included), and waits before it answers until `crowd[(p, k)]`
    checks are in flight (5 s at most: as many as the run's slots allow then). The phase is how many notes about the
    checks at once the run has emitted so far. Returns those notes, the most checks in flight in each phase, every
    source checked in order and the tuner's records."""
    ScriptedEvaluator.calls, ScriptedEvaluator.raced, ScriptedEvaluator.asked = 0, [], []
    lock, seen, notes = threading.Lock(), [], []
    state = {"in_flight": 0, "most": {}, "started": {}, "targets": {}}

    class FullGpu(ScriptedEvaluator):
        def check(self, path: Path, baselines=None, incumbent_ms=None, retime=False) -> CheckResult:
            source = Path(path).read_text()
            with lock:
                phase = len(notes)
                state["in_flight"] += 1
                state["most"][phase] = max(state["most"].get(phase, 0), state["in_flight"])
                seen.append(source)
                k = state["started"][phase] = state["started"].get(phase, 0) + 1
                if (phase, k) in fills:
                    state["targets"][source] = fills[(phase, k)]
                full = state["targets"].get(source, 0) > 0
                state["targets"][source] = state["targets"].get(source, 0) - full
                wanted = (crowd or {}).get((phase, k), 0)
            try:
                time.sleep(0.15)  # long enough for the loop to fill every slot
                until = time.monotonic() + 5.0
                while wanted:
                    with lock:
                        state["most"][phase] = max(state["most"][phase], state["in_flight"])
                        if state["most"][phase] >= wanted or time.monotonic() > until:
                            break
                    time.sleep(0.01)
                if full:
                    stage = StageResult(Stage.TIMING, False, Reason.HARNESS_ERROR, "the GPU was full",
                                        details={GPU_FULL: how})
                    return CheckResult(task="t", candidate=str(path), device="cpu", verdict=Verdict.REJECTED,
                                       stage=Stage.TIMING, reason=Reason.HARNESS_ERROR, message="the GPU was full",
                                       stages=(stage,), seconds=0.01, timed=False)
                return super().check(path, baselines, incumbent_ms)
            finally:
                with lock:
                    state["in_flight"] -= 1

    def on_event(event) -> None:
        if event.kind is EventKind.NOTE and event.message.startswith((FEWER_CHECKS, MORE_CHECKS)):
            with lock:
                notes.append(event.message)

    with Archive(tmp_path / "a.db") as archive:
        run_search(RunConfig(task_path=task, budget=budget, device="cpu", start_from=kernel, concurrency=1, seed=1,
                             checks_per_gpu=3), archive, evaluator_factory=FullGpu, on_event=on_event)
        rows = [c for c in archive.candidates() if c.origin == "tuner"]
    return notes, state["most"], seen, rows


@pytest.mark.parametrize("how, failures, fewer", [
    (GPU_FULL_HARNESS, 1, True),  # the parent's own figures: one check fewer at once
    (GPU_FULL_SHARED, 1, False),  # the candidate's account of its memory: the retry passes, nothing changes
    (GPU_FULL_SHARED, 2, True),  # ... and its retry ends so too: one check fewer
])
def test_a_full_gpu_leaves_the_run_one_check_fewer_at_once(tmp_path, task, kernel, how, failures, fewer):
    """A check that ended because the GPU's memory was full (GPU_FULL on its stage) means the checks at once do not
    fit at this task: the run goes on with one fewer, down to one, and the candidate is checked again."""
    notes, most, seen, rows = _full_gpu_run(tmp_path, task, kernel, 10, {(0, 4): failures}, how)
    target = seen[3]
    assert notes[:1] == (["the GPU's memory was full with 3 checks at once: 2 at a time from now on, 3 again after "
                          "4 verdicts without a full GPU"] if fewer else [])
    assert most[0] == 3 and (most.get(1, 0) <= 2 if fewer else len(most) == 1)
    # checked again, once, and recorded with its last verdict; a source the harness failed twice is not known to be
    # wrong, so the tuner may propose it again later (a third check)
    mine = [c.reason for c in rows if c.source_sha == sha256(target)]
    assert len(rows) == 10 and mine[0] == ("harness_error" if failures == 2 else "ok")
    assert seen.count(target) == 1 + len(mine) and len(mine) <= (2 if failures == 2 else 1)


def test_a_check_given_up_for_a_full_gpu_comes_back_unless_the_gpu_fills_again_at_that_count(tmp_path, task, kernel):
    """A full GPU may be a passing peak: after REGAIN_AFTER verdicts a check at once without one, the run takes the
    check back and runs three at once again; full once more at three, it stays at two for the rest of the run."""
    notes, most, seen, rows = _full_gpu_run(tmp_path, task, kernel, 24, {(0, 4): 1, (2, 2): 1}, crowd={(2, 2): 3})
    assert notes == [
        "the GPU's memory was full with 3 checks at once: 2 at a time from now on, 3 again after 4 verdicts "
        "without a full GPU",
        f"the GPU's memory was not full in {REGAIN_AFTER * 2} verdicts at 2 checks at once: 3 at a time again",
        "the GPU's memory was full with 3 checks at once: 2 at a time from now on"]
    assert most[0] == 3 and most[1] <= 2 and most[2] == 3 and most[3] <= 2
    assert len(rows) == 24 and all(c.accepted for c in rows)  # both retried, passed
