"""Attacks on the harness from a determined candidate, through the whole pipeline (static stage included), each of
which the harness must reject for the reason named: compute outside Triton by routes the allow-list does not name
(operators, in-place methods, builtins iterating tensors, submodules, nn.functional through the module handle, Python
scalar loops), state carried in class attributes and default arguments, a forged verdict on stdout, a malformed
result structure, a kernel body that never ends; torch tensors handed to the interpreter's kernel body as themselves,
and candidate code run by the state walk after the forward."""
from pathlib import Path

import pytest

from sandbox.harness import CheckOptions, Harness
from sandbox.records import Reason, Stage, Verdict

HERE = Path(__file__).parent
ATTACKS = HERE / "candidates" / "attacks"
TASKS = HERE.parent / "tasks"
RMSNORM = TASKS / "rmsnorm_fwd.py"
SOFTMAX = TASKS / "softmax_fwd.py"
SEED = 1234

# file -> (task, stage, reason, words the message must hold)
EXPECTED = {
    "redteam_operator_compute.py": (RMSNORM, Stage.SMOKE, Reason.TORCH_COMPUTE, "mean"),
    "redteam_inplace.py": (RMSNORM, Stage.SMOKE, Reason.TORCH_COMPUTE, "rsqrt_"),
    "redteam_builtin_sum.py": (RMSNORM, Stage.SMOKE, Reason.TORCH_COMPUTE, "pow"),
    "redteam_submodule.py": (RMSNORM, Stage.SMOKE, Reason.TORCH_COMPUTE, "rsqrt"),
    "redteam_functional_module.py": (SOFTMAX, Stage.SMOKE, Reason.TORCH_COMPUTE, "_softmax"),
    "redteam_fake_verdict_output.py": (RMSNORM, Stage.SMOKE, Reason.TORCH_COMPUTE, "compute ops"),
    "redteam_scalar_loop.py": (SOFTMAX, Stage.SMOKE, Reason.FOREIGN_COMPUTE, "into Python"),
    "redteam_map_float.py": (SOFTMAX, Stage.SMOKE, Reason.FOREIGN_COMPUTE, "into Python"),
    "redteam_class_attr_counter.py": (RMSNORM, Stage.CORRECTNESS, Reason.STATE_CARRIED, "ModelNew.memo"),
    "redteam_default_arg_store.py": (RMSNORM, Stage.CORRECTNESS, Reason.OUTPUT_MISMATCH, "wrong result"),
    "redteam_many_outputs.py": (RMSNORM, Stage.SMOKE, Reason.SANDBOX_VIOLATION, "malformed reply"),
    "redteam_kernel_spins.py": (RMSNORM, Stage.SMOKE, Reason.TIMEOUT, "did not finish"),
    # Once accepted: a torch tensor the interpreter hands to the kernel body as itself (a tl.constexpr, a list)
    "redteam_constexpr_tensor.py": (RMSNORM, Stage.SMOKE, Reason.FOREIGN_COMPUTE, "tl.constexpr or in a list"),
    "redteam_list_of_tensors.py": (RMSNORM, Stage.SMOKE, Reason.FOREIGN_COMPUTE, "tl.constexpr or in a list"),
    # Once accepted: a `cache_info` property the state walk called after the forward, outside the trace; now the walk
    # runs none of the candidate's code and the poisoned output it returned is what the parent sees
    "redteam_cache_info_property.py": (RMSNORM, Stage.CORRECTNESS, Reason.NONFINITE_MISMATCH, "NaN"),
}


@pytest.fixture(scope="module")
def harness():
    with Harness("cpu") as h:
        yield h


def test_every_redteam_file_has_an_expectation():
    assert sorted(p.name for p in ATTACKS.glob("redteam_*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_attack_is_rejected_for_the_right_reason(harness, name):
    task, stage, reason, needle = EXPECTED[name]
    timeout = 5 if reason is Reason.TIMEOUT else 60
    result = harness.check(task, ATTACKS / name, CheckOptions(timeout_s=timeout, seed=SEED))
    assert result.verdict is Verdict.REJECTED, result.message
    assert (result.stage, result.reason) == (stage, reason), result.message
    assert needle in result.message, result.message
