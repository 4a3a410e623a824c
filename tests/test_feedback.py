"""The loop learns from its own diagnostics: what each request shows the model, and when it is sent.

A quick judge stands in for the harness (a verdict from the file's content, after a short wait, as a check takes
time); the acceptance run at the end goes through the real harness and a fake OpenAI-compatible endpoint.
"""
import threading
import time
from pathlib import Path

import pytest

from agent.archive.store import Archive
from agent.llm.fake import FakeProvider
from agent.llm.chat import Usage
from agent.search.loop import RunConfig, run_search
from sandbox.records import CheckResult, Reason, Stage, StageResult, Verdict
from tests.test_loop import COMPILE_ERROR, GOOD, TASK, WRONG, fenced

ERROR = "AttributeError: module 'triton.language' has no attribute 'no_such_function'"


class Judge:
    """The harness's verdicts, by content: a compile error, a wrong result, or accepted (not timed)."""

    delay_s = 0.3
    checked: list[str] = []

    def __init__(self, *args):
        pass

    def check(self, path: Path, baselines=None, incumbent_ms=None, retime=False) -> CheckResult:
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
                           seconds=Judge.delay_s, timed=False,
                           environment={"torch": "2.x", "triton": "3.x", "device": "cpu"})

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


# ---- diffs, standalone files, truncation ----------------------------------------------------------------------------
def edit(search: str, replace: str, note: str = "Edit.") -> str:
    return f"{note}\n\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


FIX = edit("    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK) + tl.no_such_function(1)",
           "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "Drop the call that does not exist.")


def test_edits_are_offered_applied_and_a_failed_edit_is_reported_with_its_reason(tmp_path, task):
    fake = FakeProvider("fake:m").enqueue(fenced(COMPILE_ERROR, "first"))
    fake.enqueue(edit("    offs = not_in_the_kernel()", "    offs = 0", "A wrong edit."))
    fake.enqueue(FIX)
    with Archive(tmp_path / "a.db") as archive:
        s = run(task, archive, fake, budget=3)
        failed = [c for c in archive.candidates() if c.reason == "edit_failed"]
    assert "SEARCH/REPLACE" in fake.calls[0].messages[0].content  # the system prompt offers edits
    assert len(failed) == 1 and "does not occur" in failed[0].message and failed[0].stage == "propose"
    third = fake.prompts[2]
    assert "the edits did not apply" in third and "not_in_the_kernel" in third and "no_such_function" in third
    assert Judge.checked[-1] == GOOD and s.progress.accepted == 1  # the edit applied to the kernel shown


def test_a_truncated_reply_is_recognised_and_the_model_told(tmp_path, task):
    fake = FakeProvider("fake:m").enqueue(fenced(COMPILE_ERROR, "first"))
    fake.enqueue("I will rewrite it.\n```python\nimport torch\ndef f(", finish_reason="length")
    fake.enqueue(FIX)
    with Archive(tmp_path / "a.db") as archive:
        run(task, archive, fake, budget=3, reply_max_tokens=1234)
        cut = [c for c in archive.candidates() if c.reason == "truncated"]
    assert len(cut) == 1 and "cut off at the output limit (1234 tokens" in cut[0].message
    assert all(c.max_tokens == 1234 for c in fake.calls) and "at most 1234 tokens" in fake.prompts[0]
    assert "cut off" in fake.prompts[2] and "missing" not in cut[0].message
    assert len(Judge.checked) == 2  # the cut reply was not checked


def test_seed_code_a_kernel_imports_is_shown_and_editable(tmp_path, task):
    start = tmp_path / "start.py"
    start.write_text(GOOD.replace("import triton.language as tl\n",
                                  "import triton.language as tl\nfrom seeds._common import row_warps\n")
                     .replace("num_warps=4", "num_warps=row_warps(1024, 4)"))
    fake = FakeProvider("fake:m").enqueue(edit("    return max(4, min(32, block * elem_bytes // 1024))",
                                                "    return max(2, min(32, block * elem_bytes // 1024))", "Fewer."))
    with Archive(tmp_path / "a.db") as archive:
        run(task, archive, fake, budget=1, start_from=start)
        seed, child = (archive.with_source(c) for c in archive.candidates())
    assert "from seeds." not in seed.source and "def row_warps(" in seed.source
    assert "def row_warps(" in fake.prompts[0] and "from seeds." not in Judge.checked[0]
    assert child.accepted and "return max(2, min(32" in child.source  # an edit inside the imported seed code


def test_near_duplicates_are_recognised_and_not_checked_again(tmp_path, task):
    same = GOOD.replace("class ModelNew(nn.Module):",
                        "# a comment\n\nclass ModelNew(nn.Module):\n    \"\"\"Doc.\"\"\"\n")
    fake = FakeProvider("fake:m").enqueue(fenced(GOOD, "first")).enqueue(fenced(same, "again"))
    with Archive(tmp_path / "a.db") as archive:
        run(task, archive, fake, budget=2)
        dup = [c for c in archive.candidates() if c.reason == "duplicate"]
    assert len(Judge.checked) == 1 and len(dup) == 1 and "up to comments and formatting" in dup[0].message


def test_edit_blocks_apply_tolerantly_and_say_why_they_do_not():
    from agent.llm.diffs import EditError, apply_edits, parse_edits

    src = "def f(x):\n    if x:\n        return 1   \n    return 2\n"
    loose = "<<<<<<< SEARCH\nif x:\n    return 1\n=======\nif x:\n    return 3\n>>>>>>> REPLACE\n"
    assert apply_edits(src, parse_edits(loose)) == "def f(x):\n    if x:\n        return 3\n    return 2\n"
    with pytest.raises(EditError, match="occurs 2 times"):
        apply_edits("a = 1\na = 1\n", parse_edits("<<<<<<< SEARCH\na = 1\n=======\na = 2\n>>>>>>> REPLACE"))
    with pytest.raises(EditError, match="not closed"):
        parse_edits("<<<<<<< SEARCH\na = 1\n=======\na = 2\n")


def test_every_seed_flattens_or_says_why():
    from agent.search.flatten import SEEDS_DIR, flatten
    from sandbox.static import check_source

    flattened = 0
    for path in sorted(SEEDS_DIR.glob("*.py")):
        if path.name.startswith("_") or path.name == "registry.py":
            continue
        flat = flatten(path.read_text())
        if flat.problem:
            assert "from seeds." in flat.source  # left as it was, with the reason
            continue
        compile(flat.source, str(path), "exec")
        assert check_source(flat.source, path.name) == check_source(path.read_text(), path.name)
        # what stays imported is a host-side helper the static checks refuse in a candidate, never a kernel
        for line in (ln for ln in flat.source.split("\n") if ln.startswith("from seeds.")):
            assert set(line.split(" import ")[1].replace(",", " ").split()) <= HOST_HELPERS, line
        flattened += bool(flat.modules)
    assert flattened >= 20


def test_two_modules_importing_different_things_by_one_name_are_not_flattened(tmp_path):
    """In one file the later import would shadow the earlier (seeds/attention.py's TensorDescriptor is
    triton.tools', Gluon's takes a layout: the flattened training seed failed on the H200 wherever it fell back to
    the Triton path): the file is left as it was, with the name in the reason. The same import twice is fine."""
    from agent.search.flatten import flatten

    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "a.py").write_text("from math import floor as r\nimport math\n\n\ndef fa():\n    return r(1.5) * math.prod([1])\n")
    (seeds / "b.py").write_text("from math import ceil as r\n\n\ndef fb():\n    return r(1.5)\n")
    (seeds / "c.py").write_text("from math import floor as r\nfrom math import ceil\n\n\ndef fc():\n"
                                "    return r(1.5) + ceil(0.5)\n")
    (seeds / "d.py").write_text("def math():\n    return 0\n")
    src = "from seeds.a import fa\nfrom seeds.b import fb\n\nx = (fa(), fb())\n"
    flat = flatten(src, seeds_dir=seeds)
    assert flat.source == src and "import different things as 'r'" in flat.problem
    assert "'math'" in flatten("from seeds.a import fa\nfrom seeds.d import math\n", seeds_dir=seeds).problem
    assert "'r'" in flatten("from math import trunc as r\nfrom seeds.c import fc\n", seeds_dir=seeds).problem
    same = flatten("from seeds.a import fa\nfrom seeds.c import fc\n\nx = fa() + fc()\n", seeds_dir=seeds)
    assert same.problem is None and same.source.count("from math import floor as r") == 1
    ns: dict = {}
    exec(same.source, ns)
    assert ns["x"] == 1 + (1 + 1)


def test_a_flattened_seed_binds_each_top_level_name_to_one_thing():
    import ast

    from agent.search.flatten import SEEDS_DIR, _defines, flatten

    for path in sorted(SEEDS_DIR.glob("*.py")):
        if path.name.startswith("_") or path.name == "registry.py":
            continue
        seen: dict[str, str] = {}
        for node in ast.parse(flatten(path.read_text()).source).body:
            for name in _defines(node):
                what = ast.unparse(node) if not isinstance(node, (ast.Import, ast.ImportFrom)) else next(
                    f"{getattr(node, 'module', '')}.{a.name}" for a in node.names
                    if (a.asname or a.name.split(".")[0]) == name)
                assert seen.setdefault(name, what) == what, (path.name, name, seen[name], what)


# Host-side helpers that stay imported from their seed modules when a seed is flattened: each reads a tensor's values
# on the host (`.tolist()`) or caches on the host, which a candidate may not do.
HOST_HELPERS = {"_sm_count_cuda", "RowVariant", "input_amax", "_fused_forward"}


def test_the_attention_training_seed_flattens_with_its_gluon_kernels():
    """The fwd+bwd seed runs the Gluon kernels on the H200: flattened, the candidate holds them (no two seed modules
    define a kernel helper by one name) and the tuner finds the Gluon backward's knobs."""
    from agent.search.flatten import SEEDS_DIR, flatten
    from agent.search.tuner import find_knobs

    flat = flatten((SEEDS_DIR / "attention_bwd.py").read_text())
    assert flat.problem is None and "seeds.attention_gluon_bwd" in flat.modules
    assert "def _dkdv_kernel(" in flat.source and "def _dq_kernel(" in flat.source
    names = {k.name for k in find_knobs(flat.source)}
    assert {"dq_block_n", "group_heads"} <= names


# ---- the acceptance run: `crucible run` with a model that learns only from what each request shows it ------------
def learner(body: dict | None):
    """A model that repeats a broken kernel until a request shows it that kernel with its error; then it fixes it
    with an edit; shown a verified kernel, it tries a block size the request does not mention yet, by an edit."""
    from tests.llm_server import json_reply, openai_completion

    user = body["messages"][-1]["content"]
    text = "\n".join(m["content"] for m in body["messages"])
    shown, _, why = user.partition("# Why it was rejected")
    if "no_such_function(1)" in shown and "no_such_function" in why:
        reply = FIX
    elif "# How the harness judged it\nAccepted" in user or "# Verified kernel A" in user:
        size = next((b for b in (512, 256, 2048, 128, 64, 4096, 32) if f"BLOCK_SIZE = {b}" not in text), 16)
        current = next(line for line in user.split("\n") if line.startswith("BLOCK_SIZE = "))
        reply = edit(current, f"BLOCK_SIZE = {size}", f"Use BLOCK_SIZE = {size} instead.")
    else:
        reply = fenced(COMPILE_ERROR, "A first kernel.")
    return json_reply(openai_completion(reply, model="learner", prompt_tokens=len(text) // 4,
                                        completion_tokens=len(reply) // 4))


def test_crucible_run_learns_from_its_diagnostics(tmp_path, task):
    import json
    import os
    import subprocess
    import sys

    from tests.llm_server import ScriptedServer

    db = tmp_path / "archive.db"
    env = {k: v for k, v in os.environ.items() if k not in ("CRUCIBLE_MODEL", "CRUCIBLE_ARCHIVE", "CRUCIBLE_PRICES")}
    with ScriptedServer(responder=learner) as server:
        env.update(OPENAI_BASE_URL=server.url + "/v1", OPENAI_API_KEY="test-key")
        out = subprocess.run([sys.executable, "-m", "agent.cli", "run", str(task), "--model", "openai:learner",
                              "--concurrency", "2", "--budget", "12", "--device", "cpu", "--archive", str(db),
                              "--json"], cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True,
                             text=True, timeout=400)
        sent = [r.body for r in server.requests]
    assert out.returncode == 0, out.stderr + out.stdout
    summary = json.loads(out.stdout)
    with Archive(db) as archive:
        llm = [c for c in archive.candidates() if c.origin == "llm"]
    assert len(llm) == len(sent) <= 12
    first = next(i for i, c in enumerate(llm, 1) if c.accepted)
    assert first <= 8, [(c.id, c.reason) for c in llm]
    assert sum(c.accepted for c in llm) >= 3 and summary["accepted"] >= 3
    assert "SEARCH/REPLACE" in sent[0]["messages"][0]["content"]  # edits offered
    assert sum(c.accepted and "<<<<<<< SEARCH" in (c.reply or "") for c in llm) >= 3  # and applied


# ---- honest accounting --------------------------------------------------------------------------------------------
def test_an_unpriced_model_costs_unknown_and_max_cost_is_refused(tmp_path, task):
    from agent.commands.run import summary_dict
    from agent.search.loop import LoopError

    fake = FakeProvider("fake:m").enqueue(fenced(GOOD, "one"), usage=Usage(input_tokens=900, output_tokens=500))
    with Archive(tmp_path / "a.db") as archive:
        s = run(task, archive, fake, budget=1)
        with pytest.raises(LoopError, match="--max-cost needs a price for fake:m"):
            run(task, archive, FakeProvider("fake:m"), budget=1, max_cost=1.0)
    assert s.progress.cost_usd is None  # unknown, not $0
    d = summary_dict(s, tmp_path / "a.db")
    assert d["cost_usd"] is None and d["requests"] == 1 and d["verified_per_1k_output_tokens"] == 2.0


def test_cli_refuses_max_cost_unpriced_and_prints_model_names_literally(tmp_path, task):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("CRUCIBLE_MODEL", "CRUCIBLE_PRICES")}
    env.update(OPENAI_API_KEY="test-key", COLUMNS="300")
    out = subprocess.run([sys.executable, "-m", "agent.cli", "run", str(task), "--model", "openai:m:[red]x",
                          "--max-cost", "1", "--device", "cpu", "--archive", str(tmp_path / "a.db")],
                         cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--max-cost needs a price for openai:m:[red]x" in out.stderr
    assert len(out.stderr.strip().split("\n")) <= 2  # one sentence (wrapped at most once)


def test_one_definition_of_best_for_the_run_and_the_archive(tmp_path, task):
    from agent.archive.browse import Query, select, task_summaries

    fake = FakeProvider("fake:m").enqueue(fenced(GOOD, "one"))
    fake.enqueue(fenced(GOOD.replace("BLOCK_SIZE = 1024", "BLOCK_SIZE = 512"), "two"))
    with Archive(tmp_path / "a.db") as archive:
        s = run(task, archive, fake, budget=2)
        (summary,) = task_summaries(archive)
        listed = select(archive, Query(sort="speedup"))
    assert s.progress.accepted == 2
    assert summary.best.id == s.best.id == listed[0].id
    assert s.best_path.read_text() == GOOD  # nothing timed: the earliest verified kernel, everywhere


# ---- facts, not boilerplate -----------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent


def test_cpu_prompt_states_the_installed_versions_and_that_nothing_is_timed(tmp_path, task):
    import torch

    fake = FakeProvider("fake:m").enqueue(fenced(GOOD, "one"))
    with Archive(tmp_path / "a.db") as archive:
        run(task, archive, fake, budget=1)
    system = fake.calls[0].messages[0].content
    assert "nothing is timed" in system and f"PyTorch {torch.__version__}" in system
    assert "H200" not in system and "132 SMs" not in system  # no device it does not run on
    assert "bytes not declared by the task" in system


def test_gpu_facts_give_device_ceilings_floor_and_time_to_beat():
    from agent.search.facts import facts_text
    from sandbox.task import load_task

    task = load_task(ROOT / "tasks" / "rmsnorm_fwd.py")
    env = {"torch": "2.9.0", "triton": "3.5.0", "gpu": {"name": "NVIDIA Testcard", "sm_count": 77,
                                                         "capability": "8.9"}}
    text = facts_text(task, timed=True, env=env, ceilings={"copy_gbps": 1000.0, "matmul_tflops": {"bf16": 100.0}},
                      baselines={"eager": 0.5, "compile": 0.4})
    nbytes = 2 * (2 * 16384 * 4096 + 4096)
    assert "NVIDIA Testcard" in text and "77 SMs" in text and "PyTorch 2.9.0, Triton 3.5.0" in text
    assert f"{nbytes / 1e6:.4g} MB" in text and "copy 1000 GB/s" in text
    assert f"Floor time at those ceilings: {nbytes / 1e9:.4g} ms (memory-bound)" in text
    assert "Time to beat: 0.4 ms (torch.compile" in text
    unmeasured = facts_text(task, timed=True, env=env, ceilings=None, baselines={})
    assert "not measured yet (crucible bench --ceilings" in unmeasured and "Floor time" not in unmeasured


# ---- knowledge and diversity ----------------------------------------------------------------------------------------
def test_examples_are_retrieved_by_op_family(tmp_path):
    from agent.archive.records import Candidate
    from agent.search.examples import family, retrieve

    assert family("rmsnorm_residual_fwd") == "norm" and family("swiglu_bwd") == "glu" and family("scale") is None
    title, source = retrieve(ROOT / "tasks" / "softmax_bwd.py", own_seed=ROOT / "seeds" / "softmax_bwd.py")
    assert "softmax" in title and "ModelNew" in source
    with Archive(tmp_path / "a.db") as archive:
        archive.add(Candidate(task_path="tasks/layernorm_fwd.py", task_hash="h", origin="llm", proposer="m",
                              verdict="accepted", reason="ok", stage="robustness", source=GOOD))
        title, source = retrieve(ROOT / "tasks" / "rmsnorm_fwd.py", archive)
    assert "layernorm_fwd" in title and source == GOOD
    assert retrieve(ROOT / "tasks" / "scale.py") is None  # no family: the default example


def test_a_reflection_is_kept_in_the_archive_and_reused_by_later_runs(tmp_path, task):
    fake = FakeProvider("fake:m").enqueue(fenced(COMPILE_ERROR, "first")).enqueue(FIX)
    with Archive(tmp_path / "a.db") as archive:
        run(task, archive, fake, budget=2)
        kept = archive.latest_reflection("no such hash", task.name)  # found by the task's name too
        later = FakeProvider("fake:m").enqueue(fenced(GOOD.replace("1024", "256"), "Smaller blocks."))
        run(task, archive, later, budget=1)
    assert kept is not None and "From 2 proposals so far: 1 verified." in kept
    assert "runtime_error x1" in kept and "Drop the call that does not exist." in kept
    assert "What has worked for this task so far" in later.prompts[0] and kept in later.prompts[0]


def test_a_second_near_copy_of_a_kernel_is_shown_as_a_diff():
    from agent.llm.prompting import code_block, fix_messages

    best = "\n".join(f"line_{i} = {i}" for i in range(200))
    broken = best.replace("line_100 = 100", "line_100 = oops")
    shown = fix_messages(task_name="t", task_source="T", broken_source=broken, diagnostics="NameError: oops",
                         best=("#1 verified", best))[1].content
    assert shown.count("line_150 = 150") == 1 and "-line_100 = oops\n+line_100 = 100" in shown
    assert code_block(best, best) == "(the same file as the kernel shown above)"
    assert code_block("x = 1", best).startswith("```python")  # nothing alike: in full


def test_several_models_are_weighted_by_verified_improvement(tmp_path, task, monkeypatch):
    from agent.llm.chat import Price
    from agent.llm.pool import ModelPool, make_provider

    bad = FakeProvider("fake:bad", default=fenced(WRONG, "Wrong."))
    variants = iter(GOOD.replace("BLOCK_SIZE = 1024", f"BLOCK_SIZE = {b}") for b in range(64, 2000, 8))

    class Varied(FakeProvider):  # a new verified kernel each time
        def complete(self, messages, **kw):
            self.enqueue(fenced(next(variants), "Another block size."))
            return super().complete(messages, **kw)

    good = Varied("fake:good")
    pool = ModelPool([bad, good], seed=1)
    with Archive(tmp_path / "a.db") as archive:
        s = run(task, archive, pool, budget=12, temperature=0.3)
        by = [c.proposer for c in archive.candidates() if c.origin == "llm"]
    assert s.proposer == "fake:bad,fake:good" and set(by) == {"fake:bad", "fake:good"}
    assert by.count("fake:good") >= 8, by  # the model that verifies gets most requests
    assert all(c.temperature == 0.3 for c in bad.calls + good.calls)  # --temperature reaches every request
    priced = ModelPool([FakeProvider("a", price=Price(input=1, output=1)), FakeProvider("b")])
    assert priced.price is None  # one unpriced model: --max-cost is refused
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    assert isinstance(make_provider("openai:a,anthropic:b", prices={}), ModelPool)


def test_gpu_diagnostics_show_per_kernel_time_registers_spills_and_shared_memory():
    from agent.llm.prompting import describe_result

    timing = {"candidate_ms": 0.2, "baselines": {"eager": {"ms": 0.3, "speedup": 1.5, "ci_low": 1.4, "ci_high": 1.6}},
              "roofline": {"pct_of_roofline": 61.0, "bound": "memory", "gbps": 2600.0},
              "kernels": [{"name": "_rms_kernel", "ms": 0.19, "registers": 40, "spills": 2, "shared_bytes": 4096,
                           "num_warps": 8, "num_stages": 3,
                           "counters": {"dram__throughput.avg.pct_of_peak_sustained_elapsed": 71.5}}]}
    text = describe_result({"verdict": "accepted", "stages": [{"stage": "timing", "passed": True}], "timed": True,
                            "timing": timing})
    assert "61% of the memory-bound limit (2600 GB/s)" in text
    assert ("Kernel _rms_kernel: 0.19 ms, 40 registers/thread, 2 spills, 4096 bytes shared memory, 8 warps, 3 stages, "
            "dram__throughput.avg.pct_of_peak_sustained_elapsed 71.5.") in text


def test_the_summary_prints_model_names_literally(tmp_path, task):
    from agent.commands import run as run_cmd

    fake = FakeProvider("openai:m:[bold]x").enqueue(fenced(GOOD, "one"), usage=Usage(input_tokens=10,
                                                                                    output_tokens=20))
    with Archive(tmp_path / "a.db") as archive:
        s = run(task, archive, fake, budget=1)
    with run_cmd.console.capture() as cap:
        run_cmd.render_summary(s, tmp_path / "a.db")
    text = " ".join(cap.get().split())
    assert "by openai:m:[bold]x:" in text and "(llm, openai:m:[bold]x)" in text
    assert "cost unknown" in text and "$0.0000" not in text and "50.00 verified kernels per 1k output tokens" in text


def test_a_timed_run_states_the_gpu_and_the_time_to_beat_from_its_checks(tmp_path, task, monkeypatch):
    """On a GPU (scripted here), the facts come from the harness's checks and the archive's baseline times."""
    import json as json_mod

    import agent.search.loop as loop_mod
    from tests.test_loop import ScriptedEvaluator

    monkeypatch.setattr(loop_mod, "_device", lambda device: "cuda")
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    env = {"gpu": {"name": "NVIDIA Testcard", "sm_count": 77, "capability": "8.9"}, "driver": "1", "torch": "t"}
    monkeypatch.setenv("CRUCIBLE_CACHE", str(tmp_path))
    from profiler.env import device_key
    (tmp_path / "ceilings.json").write_text(json_mod.dumps({device_key(env): {"copy_gbps": 2000.0,
                                                                              "matmul_tflops": {"bf16": 300.0}}}))

    class OnTestcard(ScriptedEvaluator):
        def check(self, path, baselines=None, incumbent_ms=None, retime=False):
            from dataclasses import replace
            return replace(super().check(path, baselines), device="cuda", environment=env)

    kernel = tmp_path / "k.py"
    kernel.write_text(GOOD)
    fake = FakeProvider("fake:m").enqueue(fenced(GOOD.replace("1024", "512"), "Smaller."))
    ScriptedEvaluator.calls = 0
    with Archive(tmp_path / "a.db") as archive:
        run_search(RunConfig(task_path=task, budget=1, device="cuda", start_from=kernel, polish=0), archive,
                   provider=fake, evaluator_factory=OnTestcard)
    system = fake.calls[0].messages[0].content
    assert "NVIDIA Testcard" in system and "77 SMs" in system and "copy 2000 GB/s" in system
    assert "Time to beat: 1 ms (eager PyTorch" in system and "nothing is timed" not in system


def test_attempts_list_the_lineage_and_what_each_child_changed():
    from agent.archive.records import Candidate
    from agent.search.proposing import attempts_text

    common = dict(task_path="t", task_hash="h", proposer="m", verdict="accepted", reason="ok", source="x")
    seed = Candidate(id=1, origin="seed", **common)
    child = Candidate(id=2, origin="llm", parent_id=1, reply="Use 512 blocks. Then more.\n```python\nx\n```", **common)
    tuned = Candidate(id=3, origin="tuner", parent_id=2, prompt="tuner: BLOCK 512 -> 256", **common)
    failed = Candidate(id=4, origin="llm", parent_id=3, reply="Try 8 warps.\n<<<<<<< SEARCH\na\n=======\nb\n"
                       ">>>>>>> REPLACE", **{**common, "verdict": "rejected", "reason": "output_mismatch",
                                            "stage": "correctness", "message": "worst at [3]: expected 1, got 2"})
    text = attempts_text(tuned, [seed, child, tuned, failed])
    assert text.split("\n")[0] == ('How this kernel came about: #1 (seed) -> #2 ("Use 512 blocks." [whole file]) '
                                   '-> #3 (tuner: BLOCK 512 -> 256)')
    assert text.split("\n")[1] == ('- #4: "Try 8 warps." [1 edit (-1/+1 lines)] -> rejected at the correctness stage '
                                   '(output_mismatch): worst at [3]: expected 1, got 2')


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_failed_edit_is_shown_on_the_next_request(tmp_path, task, seed):
    start = tmp_path / "start.py"
    start.write_text(GOOD)
    fake = FakeProvider("fake:m").enqueue(fenced(GOOD.replace("BLOCK_SIZE = 1024", "BLOCK_SIZE = 512"), "Half."))
    fake.enqueue(fenced(GOOD.replace("BLOCK_SIZE = 1024", "BLOCK_SIZE = 256"), "Quarter."))
    fake.enqueue(edit("    offs = not_in_the_kernel()", "    offs = 0", "A wrong edit."))
    fake.enqueue(fenced(GOOD.replace("BLOCK_SIZE = 1024", "BLOCK_SIZE = 128"), "Eighth."))
    with Archive(tmp_path / "a.db") as archive:
        run(task, archive, fake, budget=4, start_from=start, seed=seed)
    assert "the edits did not apply" in fake.prompts[3] and "not_in_the_kernel" in fake.prompts[3]


def test_edits_drafted_in_the_reasoning_are_not_the_answer(tmp_path, task):
    draft = edit("    offs = never_there()", "    offs = 0", "Draft.")
    fake = FakeProvider("fake:m").enqueue(fenced(COMPILE_ERROR, "first"))
    fake.enqueue(f"<think>{draft}</think>\n{FIX}")
    with Archive(tmp_path / "a.db") as archive:
        s = run(task, archive, fake, budget=2)
    assert s.progress.accepted == 1 and Judge.checked[-1] == GOOD
