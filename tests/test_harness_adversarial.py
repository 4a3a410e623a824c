"""Every cheat in THREATS.md that can be shown on the CPU, as a candidate file the harness must reject for the
right reason; and honest kernels it must accept. GPU-only classes live in test_harness_gpu.py."""
from pathlib import Path

import pytest

from sandbox.harness import CheckOptions, Harness
from sandbox.records import Reason, Stage, Verdict

HERE = Path(__file__).parent
CHEATS = HERE / "candidates" / "cheats"
RMSNORM = HERE.parent / "tasks" / "rmsnorm_fwd.py"

# file -> (stage, reason) the harness must name
EXPECTED = {
    "torch_compute.py": (Stage.SMOKE, Reason.TORCH_COMPUTE),                    # 1
    "torch_compile.py": (Stage.STATIC, Reason.FORBIDDEN_CALL),                  # 1
    "never_launched.py": (Stage.SMOKE, Reason.NO_TRITON_LAUNCH),                # 2
    "dead_branch.py": (Stage.SMOKE, Reason.NO_TRITON_LAUNCH),                   # 2
    "try_except.py": (Stage.STATIC, Reason.TRY_EXCEPT),                         # 3
    "subclasses_reference.py": (Stage.STATIC, Reason.SUBCLASSES_REFERENCE),     # 3
    "cache_by_shape.py": (Stage.CORRECTNESS, Reason.NO_TRITON_LAUNCH),          # 4
    "uninitialised.py": (Stage.CORRECTNESS, Reason.NONFINITE_MISMATCH),         # 5
    "hardcoded_shape.py": (Stage.ROBUSTNESS, None),                             # 7: wrong or crashing at other widths
    "partial_write.py": (Stage.CORRECTNESS, Reason.NONFINITE_MISMATCH),         # 8
    "mutates_input.py": (Stage.SMOKE, Reason.INPUT_MUTATED),                    # 11
    "aliases_input.py": (Stage.SMOKE, Reason.OUTPUT_ALIASES_INPUT),             # 12
    "returns_subclass.py": (Stage.SMOKE, Reason.OUTPUT_TYPE),                   # 12
    "background_thread.py": (Stage.STATIC, Reason.FORBIDDEN_IMPORT),            # 14
    "patches_allclose.py": (Stage.STATIC, Reason.FORBIDDEN_CALL),               # 18: setting torch.allclose
    "reads_gc.py": (Stage.STATIC, Reason.FORBIDDEN_IMPORT),                     # 19
    "nan_output.py": (Stage.CORRECTNESS, Reason.NONFINITE_MISMATCH),            # 20
    "global_flags.py": (Stage.SMOKE, Reason.GLOBAL_FLAGS_CHANGED),              # 21
    "fake_verdict.py": (Stage.STATIC, Reason.FORBIDDEN_CALL),                   # 24: SystemExit (runtime: crash.py)
    "writes_outside.py": (Stage.STATIC, Reason.FORBIDDEN_CALL),                 # 25: torch.save (runtime: test_policy)
    "network.py": (Stage.STATIC, Reason.FORBIDDEN_CALL),                        # 25: torch.hub (runtime: test_policy)
    "spawns_process.py": (Stage.STATIC, Reason.FORBIDDEN_CALL),                 # 25: a module attribute (test_policy)
    "crash.py": (Stage.SMOKE, Reason.CRASH),                                    # 26
    "hangs.py": (Stage.SMOKE, Reason.TIMEOUT),                                  # 25/26
}


@pytest.fixture(scope="module")
def harness():
    with Harness("cpu") as h:
        yield h


def test_every_cheat_file_has_an_expectation():
    assert sorted(p.name for p in CHEATS.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cheat_is_rejected_for_the_right_reason(harness, name):
    stage, reason = EXPECTED[name]
    result = harness.check(RMSNORM, CHEATS / name, CheckOptions(timeout_s=15 if name == "hangs.py" else 120))
    assert result.verdict is Verdict.REJECTED, result.message
    assert result.stage is stage, (result.stage, result.reason, result.message)
    if reason is not None:
        assert result.reason is reason, (result.reason, result.message)
    else:
        assert result.reason in (Reason.OUTPUT_MISMATCH, Reason.NONFINITE_MISMATCH, Reason.CRASH), result.message


def test_sandbox_left_no_trace_outside_scratch():
    assert not Path("/tmp/crucible-stolen-inputs.pt").exists()
    assert not Path("/tmp/crucible-pwned").exists()


def test_a_crash_does_not_affect_the_next_candidate(harness):
    crashed = harness.check(RMSNORM, CHEATS / "crash.py")
    honest = harness.check(RMSNORM, HERE / "candidates" / "rmsnorm_honest.py")
    assert crashed.reason is Reason.CRASH
    assert honest.verdict is Verdict.ACCEPTED, honest.message


def test_mismatch_report_says_where_and_how_much(harness):
    result = harness.check(RMSNORM, HERE / "candidates" / "rmsnorm_wrong_eps.py")
    mismatch = result.stages[-1].mismatch
    assert mismatch is not None and mismatch.mismatched > 0
    assert len(mismatch.worst_index) == 2 and mismatch.rel_l2_err > mismatch.rel_l2_bound
    assert "worst at index" in result.message and "relative L2 error" in result.message


def test_zeros_for_a_small_valued_output_fail(harness):
    task = HERE / "tasks" / "row_mean.py"
    zeros = harness.check(task, HERE / "candidates" / "row_mean_zeros.py")
    honest = harness.check(task, HERE / "candidates" / "row_mean_honest.py")
    assert zeros.reason is Reason.OUTPUT_MISMATCH and zeros.stage is Stage.CORRECTNESS, zeros.message
    assert honest.verdict is Verdict.ACCEPTED, honest.message


def test_lowered_precision_fails_on_a_float32_task(harness):
    task = HERE / "tasks" / "matmul_fp32.py"
    lowp = harness.check(task, HERE / "candidates" / "matmul_fp32_lowp.py")
    honest = harness.check(task, HERE / "candidates" / "matmul_fp32_honest.py")
    assert lowp.reason is Reason.OUTPUT_MISMATCH, lowp.message
    assert honest.verdict is Verdict.ACCEPTED, honest.message


def test_honest_kernel_is_accepted_with_every_stage_named(harness):
    result = harness.check(RMSNORM, HERE / "candidates" / "rmsnorm_honest.py")
    assert result.verdict is Verdict.ACCEPTED, result.message
    assert [s.stage for s in result.stages] == [Stage.STATIC, Stage.COMPILE, Stage.SMOKE, Stage.CORRECTNESS,
                                                Stage.ROBUSTNESS]
    assert not result.timed
    robustness = result.stages[-1].details
    assert robustness["shapes"], "odd shapes must be tried"


def test_a_coding_declaration_cannot_hide_code_from_the_static_stage(harness, tmp_path):
    """The static stage reads the file as UTF-8; Python reading the same bytes honours a coding declaration, and
    under `unicode_escape` a comment's `\\u000a` is a new line of code that the static stage saw as a comment. The
    child runs the text the static stage checked, so the hidden line never runs (it would end the import)."""
    hidden = b"# \\u000araise SystemExit('code the static stage never saw ran')\n"
    cand = tmp_path / "coding_cookie.py"
    cand.write_bytes(b"# coding: unicode_escape\n" + (HERE / "candidates" / "rmsnorm_honest.py").read_bytes() + hidden)
    result = harness.check(RMSNORM, cand)
    assert result.verdict is Verdict.ACCEPTED, result.message



def test_a_large_first_expected_is_computed_again_for_the_repeat(harness, monkeypatch):
    """Past KEPT_EXPECTED_BYTES the first call's expected values are not held through the correctness calls: the
    robustness stage's repeat of that call runs the reference on those inputs once more and compares with that
    (a reference that answers the second time with doubled values gets the honest candidate rejected there)."""
    from sandbox import stage_runners
    from sandbox.reference import Expected, Reference

    runs, real, tamper = [], Reference.run, []

    def run(self, inputs):
        again = any(x is inputs[0] for x in runs)
        runs.append(inputs[0])  # the tensor itself, kept alive: no later inputs can take its place
        expected = real(self, inputs)
        if not (again and tamper):
            return expected
        return Expected(ref=[t * 2 for t in expected.ref], truth=[t * 2 for t in expected.truth or []],
                        structure=expected.structure, alternates=[[t * 2 for t in alt] for alt in expected.alternates])
    monkeypatch.setattr(Reference, "run", run)
    honest = HERE / "candidates" / "rmsnorm_honest.py"
    assert harness.check(RMSNORM, honest).verdict is Verdict.ACCEPTED
    assert sum(x is runs[0] for x in runs) == 1  # the smoke call's inputs: their expected values were kept
    runs.clear()
    monkeypatch.setattr(stage_runners, "KEPT_EXPECTED_BYTES", 0)
    assert harness.check(RMSNORM, honest).verdict is Verdict.ACCEPTED
    runs.clear()
    tamper.append(True)
    result = harness.check(RMSNORM, honest)
    assert sum(x is runs[0] for x in runs) == 2  # and computed again for the repeat, which is compared with them
    assert result.stage is Stage.ROBUSTNESS and result.reason is Reason.OUTPUT_MISMATCH, result.message
    assert "a repeat of the first inputs" in result.message
