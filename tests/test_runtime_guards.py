"""The checks inside the candidate's process, behind the static stage (bypassed here, so each layer is shown on its
own): computation outside Triton (numpy, Python lists, Python run inside a launch by a hook, a constexpr callable or
a helper the kernel body calls), the trace switched off, frames of the harness reached, state kept across calls, and
calls a check cannot count."""
import random
from pathlib import Path

import pytest

from sandbox import harness as harness_mod
from sandbox.harness import CheckOptions, Harness
from sandbox.records import Reason, Stage, Verdict
from sandbox.stage_runners import SOAK_MIN_CALLS, soak_length

HERE = Path(__file__).parent
ATTACKS = HERE / "candidates" / "attacks"
RMSNORM = HERE.parent / "tasks" / "rmsnorm_fwd.py"
SEED = 1234  # fixed: the scrambled bytes a buffer counter reads, and the order of calls, are then reproducible


@pytest.fixture(scope="module")
def harness():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(harness_mod.static, "check_source", lambda source, name="": None)
        with Harness("cpu") as h:
            yield h


def _check(harness, path, seed=SEED):
    return harness.check(RMSNORM, path, CheckOptions(timeout_s=120, seed=seed))


def _variant(tmp_path, name, n):
    source = (ATTACKS / name).read_text()
    assert "\nN = " in source
    out = tmp_path / f"{Path(name).stem}_{n}.py"
    out.write_text("\n".join(f"N = {n}" if line.startswith("N = ") else line for line in source.splitlines()))
    return out


@pytest.mark.parametrize("name,needle", [
    ("runtime_numpy.py", "numpy"),
    ("runtime_tolist.py", "into Python"),
    ("runtime_jit_helper.py", "_helper"),
    ("runtime_prerun_hook.py", "pre-run hook"),
    ("runtime_autotune_hook.py", "pre_hook"),
    ("runtime_constexpr_callable.py", "argument of type"),
    ("runtime_injected_numpy.py", "`np`"),
])
def test_compute_outside_triton_is_refused(harness, name, needle):
    result = _check(harness, ATTACKS / name)
    assert result.verdict is Verdict.REJECTED
    assert (result.stage, result.reason) == (Stage.SMOKE, Reason.FOREIGN_COMPUTE), result.message
    assert needle in result.message, result.message


@pytest.mark.parametrize("name,needle", [("runtime_frames.py", "sys._getframe"),
                                         ("runtime_generator_frame.py", ".gi_frame")])
def test_frames_are_refused_to_the_candidate(harness, name, needle):
    """A frame leads up the stack to the worker's locals (here: switching the torch-compute check off); library code
    that asks for one while the candidate runs (typing at a lazy import) still may."""
    result = _check(harness, ATTACKS / name)
    assert (result.stage, result.reason) == (Stage.SMOKE, Reason.SANDBOX_VIOLATION), result.message
    assert needle in result.message, result.message


def test_a_tensor_subclass_in_the_state_is_refused(harness):
    """Its methods are the candidate's code, which the state walk would run outside the trace."""
    result = _check(harness, ATTACKS / "runtime_state_subclass.py")
    assert result.verdict is Verdict.REJECTED and result.stage is Stage.SMOKE, result.message
    assert "`model.memo` holds a tensor subclass (Sneaky)" in result.message, result.message


@pytest.mark.parametrize("name,needle", [("runtime_state_dict_hook.py", "model._load_state_dict_post_hooks"),
                                         ("runtime_global_hook.py", "_global_forward_pre_hooks")])
def test_module_hooks_are_refused(harness, name, needle):
    """Hooks run the candidate's Python at parameter loading or around forward, outside the launch trace."""
    result = _check(harness, ATTACKS / name)
    assert result.verdict is Verdict.REJECTED and result.reason is Reason.SANDBOX_VIOLATION, result.message
    assert needle in result.message and "hook" in result.message, result.message


def test_replacing_the_launch_wrapper_is_caught(harness):
    result = _check(harness, ATTACKS / "runtime_replaces_run.py")
    assert (result.stage, result.reason) == (Stage.SMOKE, Reason.TRACE_TAMPERED), result.message
    assert "run was replaced" in result.message


@pytest.mark.parametrize("n", [3, 10, 40])
def test_a_python_counter_is_caught_whatever_its_threshold(harness, tmp_path, n):
    result = _check(harness, _variant(tmp_path, "runtime_counter.py", n))
    assert (result.stage, result.reason) == (Stage.CORRECTNESS, Reason.STATE_CARRIED), result.message
    assert "keeps state across calls" in result.message and "model.calls" in result.message


def test_a_counter_out_of_sight_is_caught_by_the_soak(harness, tmp_path):
    # 8 calls precede the soak on this task; the soak makes at least 3 more and always verifies its last.
    result = _check(harness, ATTACKS / "runtime_hidden_counter.py")
    assert result.verdict is Verdict.REJECTED
    assert result.stage is Stage.ROBUSTNESS, result.message
    assert "in a row" in result.message, result.message


def test_a_counter_out_of_sight_with_a_small_threshold_fails_earlier(harness, tmp_path):
    result = _check(harness, _variant(tmp_path, "runtime_hidden_counter.py", 3))
    assert result.stage is Stage.CORRECTNESS and result.reason in (Reason.OUTPUT_MISMATCH,
                                                                   Reason.NONFINITE_MISMATCH), result.message


def test_a_counter_in_a_tensor_buffer_reads_scrambled_bytes(harness, tmp_path):
    # Its threshold is never reached in a check; the scrambled counter (random bytes) switches it to its store.
    result = _check(harness, _variant(tmp_path, "runtime_buffer_counter.py", 1000))
    assert result.verdict is Verdict.REJECTED
    assert result.reason in (Reason.OUTPUT_MISMATCH, Reason.NONFINITE_MISMATCH), result.message


def test_inputs_written_inside_the_soak_are_caught_on_the_calls_it_compares(harness, monkeypatch):
    """The soak compares the inputs of its verified calls and of SOAK_INPUT_CHECKS others drawn at random (the copy
    and comparison cost more GPU work than a memory-bound call), not of every call: a kernel that starts writing its
    input inside the soak (after the 8 calls before it) is caught there all the same."""
    from sandbox.stage_runners import SOAK_INPUT_CHECKS

    asked = []
    request = Harness._request

    def seen(self, run, stage, msg, *a, **kw):
        if msg.get("op") == "soak":
            asked.append((msg["start"], msg["stop"], list(msg["checked"]), list(msg["inputs_checked"])))
        return request(self, run, stage, msg, *a, **kw)
    monkeypatch.setattr(Harness, "_request", seen)
    result = _check(harness, ATTACKS / "runtime_late_input_write.py")
    assert (result.stage, result.reason) == (Stage.ROBUSTNESS, Reason.INPUT_MUTATED), result.message
    assert "of the soak" in result.message or "soak call" in result.message, result.message
    asked.clear()
    result = _check(harness, HERE / "candidates" / "rmsnorm_honest.py", seed=2)
    assert result.accepted, result.message
    n = next(s for s in result.stages if s.stage is Stage.ROBUSTNESS).details["soak"]["calls"]
    compared = [k for start, stop, _, ks in asked for k in ks if start <= k < stop]
    verified = [k for _, _, ks, _ in asked for k in ks]
    assert set(verified) <= set(compared) and n - 1 in compared
    assert len(compared) == len(set(compared)) <= len(verified) + SOAK_INPUT_CHECKS
    assert len(compared) == n or len(compared) >= SOAK_INPUT_CHECKS


def test_honest_candidate_is_accepted_with_a_soak(harness):
    result = _check(harness, HERE / "candidates" / "rmsnorm_honest.py")
    assert result.accepted, result.message
    soak = next(s for s in result.stages if s.stage is Stage.ROBUSTNESS).details["soak"]
    assert soak["calls"] >= SOAK_MIN_CALLS and soak["verified"] >= 2
    assert result.costs["calls"] == 8 + soak["calls"]


def test_a_soak_in_slices_is_one_soak(harness, tmp_path, monkeypatch):
    """The soak's calls go to the child one slice at a time (each its own turn at the GPU's gate): a slice of one call
    each here. The child keeps its base sets and its count across slices, so every call is made once and a counter
    that turns to its store inside the soak is still caught."""
    from sandbox import stage_runners

    monkeypatch.setattr(stage_runners, "SOAK_SLICE_S", 1e-9)
    monkeypatch.setattr(stage_runners, "SOAK_SLICES", 1 << 20)
    slices = []
    request = Harness._request

    def counted(self, run, stage, msg, *a, **kw):
        if msg.get("op") == "soak":
            slices.append((msg["start"], msg["stop"], "base" in msg))
        return request(self, run, stage, msg, *a, **kw)
    monkeypatch.setattr(Harness, "_request", counted)
    result = _check(harness, HERE / "candidates" / "rmsnorm_honest.py")
    assert result.accepted, result.message
    soak = next(s for s in result.stages if s.stage is Stage.ROBUSTNESS).details["soak"]
    assert slices == [(k, k + 1, k == 0) for k in range(soak["calls"])]
    assert result.costs["calls"] == 8 + soak["calls"]
    result = _check(harness, _variant(tmp_path, "runtime_hidden_counter.py", 10))  # turns inside the soak
    assert result.stage is Stage.ROBUSTNESS and "in a row" in result.message, result.message
    monkeypatch.setattr(stage_runners, "SOAK_SLICES", 2)  # never more slices than that, however short a call
    slices.clear()
    result = _check(harness, HERE / "candidates" / "rmsnorm_honest.py")
    n = next(s for s in result.stages if s.stage is Stage.ROBUSTNESS).details["soak"]["calls"]
    assert result.accepted and len(slices) == min(2, n) and slices[-1][1] == n


def test_the_calls_of_a_check_are_not_fixed(harness):
    orders = set()
    for seed in (1, 2, 3):
        result = _check(harness, HERE / "candidates" / "rmsnorm_honest.py", seed=seed)
        assert result.accepted, result.message
        orders.add(tuple(next(s for s in result.stages if s.stage is Stage.CORRECTNESS).details["distributions"]))
    assert len(orders) > 1
    lengths = {soak_length(random.Random(seed), 0.004, "cpu") for seed in range(20)}
    assert len(lengths) >= 4 and min(lengths) >= SOAK_MIN_CALLS
    assert max(soak_length(random.Random(seed), 1e-5, "cuda") for seed in range(50)) > 200


def test_the_state_walk_names_what_changed_and_skips_what_triton_injects():
    import types

    import torch

    from sandbox import carry

    class Plan:
        def __init__(self):
            self.sizes = [4, 8]

    model = torch.nn.Linear(2, 2)
    model.plan = Plan()
    module = types.ModuleType("crucible_candidate")
    module.CACHE = {}
    injected = {"np": object()}
    before, _ = carry.snapshot(model, module, "crucible_candidate", injected)
    module.np = injected["np"]  # the interpreter's globals, copied in when a kernel first runs: not state
    assert carry.difference(before, carry.snapshot(model, module, "crucible_candidate", injected)[0]) is None
    model.plan.sizes.append(16)
    assert carry.difference(before, carry.snapshot(model, module, "crucible_candidate")[0]) == \
        "`model.plan.sizes` had 2 entries, now 3"
    module.CACHE["k"] = torch.ones(1)
    after, tensors = carry.snapshot(model, module, "crucible_candidate", injected)
    assert "CACHE['k']" in [p for p, _ in tensors]
    sigs = carry.signatures(tensors)
    model.weight.data.add_(1.0)
    assert [p for p, _ in carry.written(tensors, sigs)] == ["model._parameters['weight']"]
    t = torch.zeros(64, dtype=torch.int32)
    carry.scramble(t, torch.Generator().manual_seed(0))
    assert int((t != 0).sum()) > 60
