"""Attacks on the harness from a determined candidate, through the whole pipeline (static stage included), each of
which the harness must reject for the reason named: compute outside Triton by routes the allow-list does not name
(operators, in-place methods, builtins iterating tensors, submodules, nn.functional through the module handle, Python
scalar loops), state carried in class attributes and default arguments, a forged verdict on stdout, a malformed
result structure, a kernel body that never ends; torch tensors handed to the interpreter's kernel body as themselves,
and candidate code run by the state walk after the forward; standard-library modules (builtins among them) reached
through torch attributes the deny-list did not name."""
import importlib
import types
import warnings
from pathlib import Path

import pytest

from sandbox.allowlist import ALLOWED_IMPORTS, FORBIDDEN_ATTRS, FORBIDDEN_PATHS
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
    # Once accepted: builtins (and its exec) reached as torch.glob.re.enum.bltns; torch.load as nn.functional.torch.load
    "redteam_builtins_via_torch_glob.py": (RMSNORM, Stage.STATIC, Reason.FORBIDDEN_CALL, "torch.glob"),
    "redteam_torch_alias_path.py": (RMSNORM, Stage.STATIC, Reason.FORBIDDEN_CALL, ".torch"),
    # A module's hook table written directly (no register_* name): every `*hook*` attribute is refused
    "redteam_hook_table.py": (RMSNORM, Stage.STATIC, Reason.FORBIDDEN_CALL, "_forward_hooks"),
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


def test_no_module_outside_torch_and_triton_is_reachable_by_allowed_attribute_names():
    """Walk every public attribute a candidate may name, from the allowed torch, Triton and math modules through
    their submodules and classes: none may be a module of anything else (builtins, multiprocessing, json...), whose
    attributes the static stage's deny-list was never written for."""
    ours = ("torch", "triton", "math")
    todo = [(m, importlib.import_module(m)) for m in sorted(ALLOWED_IMPORTS) if m.split(".")[0] in ours]
    seen, reached = set(), {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while todo:
            path, obj = todo.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            for name in dir(obj) if isinstance(obj, types.ModuleType) else list(vars(obj)):
                full = f"{path}.{name}"
                if name.startswith("_") or name in FORBIDDEN_ATTRS or \
                        any(full == p or full.startswith(p + ".") for p in FORBIDDEN_PATHS):
                    continue
                try:
                    value = getattr(obj, name)
                except Exception:  # noqa: BLE001 - an attribute that cannot be read is not reachable either
                    continue
                if isinstance(value, types.ModuleType):
                    if value.__name__.split(".")[0] in ours:
                        todo.append((full, value))
                    else:
                        reached.setdefault(full, value.__name__)
                elif isinstance(value, type) and (value.__module__ or "").split(".")[0] in ours:
                    todo.append((full, value))
    assert not reached, f"modules reachable by names the static stage allows: {reached}"
