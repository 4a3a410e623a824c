"""Prompt templates, the renderer, the verdict written out for the model, and the few-shot example (which must be a
correct candidate: it is checked against its task's reference through the interpreter and through the harness)."""
from __future__ import annotations

import ast
import copy
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from agent.llm import prompting
from agent.llm.prompting import (PROMPTS_DIR, PromptError, crossover_messages, describe_result, fields_of, fix_messages,
                             numbered, propose_messages, render, system_prompt)
from sandbox.allowlist import ALLOWED_IMPORTS, FORBIDDEN_NAMES
from sandbox.records import CheckResult, ErrorInfo, Mismatch, Reason, Stage, StageResult, Verdict
from sandbox.static import check_source
from sandbox.task import load_task
from sandbox.tolerance import compare

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = PROMPTS_DIR / "examples" / "rmsnorm_fwd.py"
TASK = ROOT / "tasks" / "rmsnorm_fwd.py"
TEMPLATES = sorted(p.stem for p in PROMPTS_DIR.glob("*.md"))


# ---- the renderer ---------------------------------------------------------------------------------------------------
def test_every_template_renders_with_exactly_its_fields():
    assert {"system", "propose", "fix", "crossover"} <= set(TEMPLATES)
    for name in TEMPLATES:
        fields = fields_of(name)
        text = render(name, **{f: f"<<{f}>>" for f in fields})
        assert all(f"<<{f}>>" in text for f in fields)
        assert "@include" not in text and "$" not in text.replace("$$", ""), name


def test_missing_and_unknown_fields_fail_loudly():
    fields = {f: "x" for f in fields_of("fix")}
    with pytest.raises(PromptError, match=r"missing \['diagnostics'\]"):
        render("fix", **{k: v for k, v in fields.items() if k != "diagnostics"})
    with pytest.raises(PromptError, match=r"unknown \['diagnostic'\]"):
        render("fix", diagnostic="typo", **fields)
    with pytest.raises(PromptError, match="no prompt template"):
        render("nonexistent")


def test_includes_paste_the_shared_part_once_per_template(tmp_path, monkeypatch):
    for name in ("propose", "fix", "crossover"):
        text = render(name, **{f: "x" for f in fields_of(name)})
        assert text.count("complete file in one ```python block") == 1
    (tmp_path / "a.md").write_text("A\n@include b\n")
    (tmp_path / "b.md").write_text("B $v\n@include a\n")
    monkeypatch.setattr(prompting, "PROMPTS_DIR", tmp_path)
    prompting._text.cache_clear()
    try:
        with pytest.raises(PromptError, match="includes itself"):
            render("a", v=1)
        (tmp_path / "b.md").write_text("B costs $$5 and $v\n")
        prompting._text.cache_clear()
        assert render("a", v="v!") == "A\nB costs $5 and v!\n"
        (tmp_path / "c.md").write_text("stray $ sign\n")
        with pytest.raises(PromptError, match="stray"):
            render("c")
    finally:
        prompting._text.cache_clear()


def test_field_values_are_not_reinterpreted():
    code = "x = '$not_a_field ${nor_this}'\n"
    text = render("fix", task_name="t", task_source=code, broken_source=code, diagnostics="d", attempts="a", best="b",
                  reflection="r")
    assert text.count("$not_a_field ${nor_this}") == 2


# ---- the conversation ------------------------------------------------------------------------------------------------
def test_system_prompt_states_what_the_harness_enforces():
    text = system_prompt()
    for module in ALLOWED_IMPORTS:  # the harness's own allow-list, not a copy that can drift
        assert module in text
    for name in FORBIDDEN_NAMES:
        assert name in text
    for rule in ("try`/`except", "ModelNew", "@triton.jit", "fresh", "NaN", "another process", "rejected",
                 "glue", "primes"):
        assert rule in text, rule
    assert EXAMPLE.read_text().strip() in text
    assert "4,244 GB/s" in text and "132 SMs" in text
    assert "nothing is timed" in system_prompt(gpu="cpu") and "nothing is timed" not in text
    assert "allows PyTorch compute" in system_prompt(allow_torch_compute=True)
    assert "allows PyTorch compute" not in text


def test_propose_fix_and_crossover_messages_carry_their_material():
    task_src = TASK.read_text()
    msgs = propose_messages(task_name="rmsnorm_fwd", task_source=task_src, parent_source="PARENT_SRC",
                            parent_diagnostics="Time: 0.5 ms", elites=[("1.3x vs eager", "ELITE_ONE"),
                                                                       ("1.1x", "ELITE_TWO")])
    assert [m.role for m in msgs] == ["system", "user"]
    user = msgs[1].content
    for piece in ("rmsnorm_fwd", "class Model(nn.Module)", "PARENT_SRC", "Time: 0.5 ms", "Kernel 1: 1.3x vs eager",
                  "ELITE_ONE", "Kernel 2: 1.1x", "ELITE_TWO", "faster"):
        assert piece in user, piece
    alone = propose_messages(task_name="t", task_source="T", parent_source="P", parent_diagnostics="D")[1].content
    assert "None yet." in alone
    fix = fix_messages(task_name="t", task_source="T", broken_source="BROKEN", diagnostics="Rejected: X")[1].content
    assert "BROKEN" in fix and "Rejected: X" in fix and "line number" in fix
    cross = crossover_messages(task_name="t", task_source="T", source_a="AAA", diagnostics_a="da",
                               source_b="BBB", diagnostics_b="db", gpu="cpu")
    assert all(x in cross[1].content for x in ("AAA", "BBB", "da", "db")) and "No GPU" in cross[0].content


# ---- the verdict, written out -----------------------------------------------------------------------------------------
SOURCE = "\n".join(f"line_{i} = {i}" for i in range(1, 41))


def _result(stages, verdict=Verdict.REJECTED, timing=None, candidate="/scratch/cand_7.py") -> CheckResult:
    last = stages[-1]
    return CheckResult(task="rmsnorm_fwd", candidate=candidate, device="cuda" if timing else "cpu",
                       verdict=verdict, stage=last.stage, reason=last.reason, message=last.message,
                       stages=tuple(stages), seconds=1.0, timed=timing is not None, timing=timing)


def test_describe_mismatch_and_survives_the_archive_json_round_trip():
    mm = Mismatch(output="out[0]", numel=1000, mismatched=17, worst_index=(3, 5), expected=1.5, got=float("nan"),
                  max_abs_err=float("nan"), rel_l2_err=0.2, rel_l2_bound=0.01, nonfinite_expected=0,
                  nonfinite_got=17, first_nonfinite_diff=(3, 5))
    result = _result([StageResult(Stage.STATIC, True, Reason.OK),
                      StageResult(Stage.CORRECTNESS, False, Reason.OUTPUT_MISMATCH,
                                  "output differs on the 'outliers' distribution", mismatch=mm)])
    text = describe_result(result)
    assert text.startswith("Rejected at the correctness stage (output_mismatch): output differs on the 'outliers'")
    assert "17/1000 elements outside tolerance" in text and "[3, 5]" in text and "NaN/Inf: expected 0, got 17" in text
    stored = json.loads(json.dumps(result.to_dict()))  # NaN -> null, tuples -> lists, as the archive keeps it
    assert describe_result(stored) == text


def test_describe_error_points_at_the_candidates_line_and_call_path():
    tb = ('Traceback (most recent call last):\n  File "/venv/triton/runtime/interpreter.py", line 1511, in __call__\n'
          '    self.fn(**args)\n  File "/scratch/cand_7.py", line 27, in _kernel\n    y = x + nope\n'
          "NameError: name 'nope' is not defined\n\nThe above exception was the direct cause of the following "
          'exception:\n\nTraceback (most recent call last):\n  File "/work/sandbox/worker.py", line 148, in _call\n'
          '    out = model(*inputs)\n  File "/scratch/cand_7.py", line 35, in forward\n    return launch(x)\n'
          '  File "/scratch/cand_7.py", line 30, in launch\n    _kernel[(1,)](x)\n')
    err = ErrorInfo(type="InterpreterError", message="NameError(\"name 'nope' is not defined\")", traceback=tb)
    result = _result([StageResult(Stage.SMOKE, False, Reason.RUNTIME_ERROR, "the forward raised", error=err)])
    text = describe_result(result, SOURCE)
    assert "InterpreterError: NameError" in text
    assert f"At line 27 of your file:\n{numbered(SOURCE, 27)}" in text
    assert ">   27 | line_27 = 27" in text and "    24 | line_24 = 24" in text and "    30 | line_30 = 30" in text
    assert "Call path in your file: line 35 (forward) -> line 30 (launch) -> line 27 (_kernel)" in text


def test_describe_syntax_error_uses_the_line_in_the_message():
    result = _result([StageResult(Stage.STATIC, False, Reason.SYNTAX_ERROR, "syntax error at line 3: invalid syntax",
                                  error=ErrorInfo("SyntaxError", "syntax error at line 3: invalid syntax"))])
    assert ">    3 | line_3 = 3" in describe_result(result, SOURCE)


def test_describe_timing_baselines_roofline_and_kernel_stats():
    timing = {"candidate_ms": 0.0812,
              "baselines": {"eager": {"ms": 0.251, "speedup": 3.09, "ci_low": 3.01, "ci_high": 3.15, "significant": True},
                            "compile": {"ms": 0.083, "speedup": 1.02, "ci_low": 0.99, "ci_high": 1.05,
                                        "significant": False}},
              "roofline": {"bytes": 268e6, "flops": 0, "gbps": 3301.0, "tflops": 0.0, "pct_of_roofline": 77.8,
                           "bound": "memory"},
              "kernels": [{"name": "_rmsnorm_fwd_kernel", "n_regs": 40, "n_spills": 2}]}
    result = _result([StageResult(Stage.STATIC, True, Reason.OK), StageResult(Stage.TIMING, True, Reason.OK, "ok")],
                     verdict=Verdict.ACCEPTED, timing=timing)
    text = describe_result(result)
    assert text.startswith("Accepted: it passed every check (static, timing).")
    assert "Time: 0.0812 ms" in text
    assert "vs eager: 0.251 ms, speedup 3.09x (95% CI 3.01-3.15)" in text
    assert "vs compile: 0.083 ms, speedup 1.02x (95% CI 0.99-1.05), not significant" in text
    assert "Roofline: 78% of the memory-bound limit (3301 GB/s)." in text
    assert "Kernel _rmsnorm_fwd_kernel: 40 registers/thread, 2 spills." in text
    untimed = _result([StageResult(Stage.CORRECTNESS, True, Reason.OK)], verdict=Verdict.ACCEPTED)
    assert "speed is unknown" in describe_result(untimed)


# ---- the few-shot example is a correct candidate -------------------------------------------------------------------
def _load_example():
    spec = importlib.util.spec_from_file_location("crucible_prompt_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_passes_the_static_checks():
    assert check_source(EXAMPLE.read_text(), EXAMPLE.name) is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 64), (7, 100), (13, 257)])
@pytest.mark.parametrize("distribution", ["normal", "large", "outliers", "constant_rows"])
def test_example_matches_its_reference(shape, dtype, distribution, device):
    task = load_task(TASK).with_constants({"M": shape[0], "N": shape[1]})
    ref_model = task.make_reference(seed=3, device=device).to(dtype)
    (x,) = task.make_inputs(seed=5, distribution=distribution, device=device)
    x = x.to(dtype)
    example = _load_example()
    model = example.ModelNew(*task.init_inputs()).to(device=device, dtype=dtype)
    model.load_state_dict(ref_model.state_dict())  # the harness does the same: same names, same shapes
    with torch.no_grad():
        got = model(x)
        ref = ref_model(x)
        truth = copy.deepcopy(ref_model).double()(x.double())
    assert got.dtype == ref.dtype and got.shape == ref.shape
    mismatch = compare("out", got, ref, truth)
    assert mismatch is None, mismatch.describe()


@pytest.mark.slow
def test_example_is_accepted_by_the_harness():
    harness = pytest.importorskip("sandbox.harness")
    with harness.Harness("cpu") as h:
        result = h.check(TASK, EXAMPLE, harness.CheckOptions(device="cpu", timing=False, timeout_s=240))
    assert result.accepted, describe_result(result, EXAMPLE.read_text())


def test_describe_triton_compile_error_maps_kernel_relative_lines():
    from triton.compiler.errors import CompilationError

    source = EXAMPLE.read_text().replace("    y = x * rstd * w\n", "    y = x * rstd * w[None, :, 0]\n")
    file_line = source.split("\n").index("    y = x * rstd * w[None, :, 0]") + 1
    def_line = source.split("\n").index("def _rmsnorm_fwd_kernel(") + 1
    launch_line = next(i for i, text in enumerate(source.split("\n"), 1) if "_rmsnorm_fwd_kernel[" in text)
    kernel_src = "\n".join(source.split("\n")[def_line - 1:])
    node = ast.parse(kernel_src).body[0].body[-2]  # the `y = ...` statement, as Triton's code generator sees it
    exc = CompilationError(kernel_src, node, "ValueError('unsupported tensor index')")  # Triton's own formatting
    tb = (f'Traceback (most recent call last):\n  File "/scratch/cand_7.py", line {launch_line}, in rmsnorm_fwd\n'
          '    _rmsnorm_fwd_kernel[grid](...)\n  File "/venv/triton/runtime/jit.py", line 1, in run\n')
    result = _result([StageResult(Stage.COMPILE, False, Reason.RUNTIME_ERROR, "compile failed",
                                  error=ErrorInfo("CompilationError", str(exc), tb))])
    text = describe_result(result, source)
    assert str(exc).startswith(f"at {file_line - def_line + 1}:")
    assert f"Triton could not compile `_rmsnorm_fwd_kernel`; at line {file_line} of your file:" in text
    assert f">{file_line:5d} | {source.split(chr(10))[file_line - 1]}" in text
    assert f"Launched from line {launch_line} of your file:" in text
