"""Attacks on the state walk (sandbox/carry.py) and the static stage's module-attribute rule, through the whole
pipeline on the CPU interpreter: a counter and a stored output kept where the walk does not look. Each test asserts
the attack is rejected; each failed while its hole was open."""
import functools
import importlib.util
from pathlib import Path

import pytest
import torch

from sandbox import carry
from sandbox.harness import CheckOptions, Harness
from sandbox.records import Reason, Verdict
from sandbox.static import check_source

HERE = Path(__file__).parent
ATTACKS = HERE / "candidates" / "attacks_walk"
ROW_MEAN = HERE / "tasks" / "row_mean.py"
SEED = 1234


@pytest.fixture(scope="module")
def harness():
    with Harness("cpu") as h:
        yield h


@pytest.fixture(scope="module")
def small_task(tmp_path_factory):
    path = tmp_path_factory.mktemp("tasks") / "small_row_mean.py"
    source = ROW_MEAN.read_text(encoding="utf-8")
    assert "M = 64\nN = 512\n" in source
    path.write_text(source.replace("M = 64\nN = 512\n", "M = 16\nN = 64\n"), encoding="utf-8")
    return path


def _check(harness, task, candidate, timeout=120):
    return harness.check(task, candidate, CheckOptions(timeout_s=timeout, seed=SEED))


# Each store, and how it is stopped now: STATE_CARRIED by the walk, refused by the static stage, or rejected some
# other way (a counter in scrambled bytes reads garbage).
HIDDEN = {
    "dict_key_hidden_store.py": "state",           # an object used as a dict key: walked as state
    "deep_hidden_store.py": "state",               # 14 lists deep: within the walk's limits now
    "long_hidden_store.py": "state",               # item 513 of a list: likewise
    "entries_hidden_store.py": "state",            # after 20000 paths of padding: likewise
    "kernel_dict_hidden_store.py": "state",        # a dict set on the candidate's kernel: walked
    "kernel_own_name_hidden_store.py": "state",    # `best_config` set on a plain jit kernel: not Triton's own there
    "dict_view_hidden_store.py": "state",          # kept only through `{...}.values()`: the view is walked
    "library_class_hidden_store.py": "static",     # `type(x).box = ...` on torch.Tensor
    "module_alias_hidden_store.py": "static",      # `_lib = torch; _lib.box = ...`
    "generator_subclass_hidden_store.py": "state",  # a torch.Generator subclass's seed
    "empty_view_hidden_store.py": "rejected",      # the storage behind a zero-element view: compared and scrambled
}


@pytest.mark.parametrize("name", sorted(HIDDEN))
def test_a_counter_hidden_from_the_state_walk_is_refused(harness, small_task, name):
    path = ATTACKS / name
    static = check_source(path.read_text(encoding="utf-8"))
    if HIDDEN[name] == "static":
        assert static is not None
        return
    assert static is None  # the attack passes the static stage
    result = _check(harness, small_task, path)
    assert result.verdict is Verdict.REJECTED, (result.verdict, result.message)
    if HIDDEN[name] == "state":
        assert result.reason is Reason.STATE_CARRIED, (result.reason, result.message)


@pytest.mark.parametrize("state, words", [
    ("[0] * (carry.MAX_ITEMS + 1)", "items"),
    ("functools.reduce(lambda a, _: [a], range(carry.MAX_DEPTH + 2), [])", "levels deep"),
    ("[[0] * 1000 for _ in range(carry.MAX_ENTRIES // 1000 + 1)]", "values"),
])
def test_state_past_the_walk_s_limits_is_refused_not_left_unseen(state, words):
    """Past its limits the walk refuses the model, saying so, rather than leave the rest unseen."""
    model = torch.nn.Module()
    model.table = eval(state, {"carry": carry, "functools": functools})
    with pytest.raises(carry.StateRefused, match=words):
        carry.snapshot(model, None, "candidate")


# No false positive on the GPU: JITFunction.create_binder (triton/runtime/jit.py), run at a kernel's first launch on
# a device, sets `CompiledKernel` and `ASTSource` on the kernel; an honest model whose kernel is first launched on its
# second call or later must not show a change (carry.launcher_own reads the names Triton sets from its source).
def test_a_kernel_first_launched_on_a_later_call_is_not_state():
    if not torch.cuda.is_available():
        pytest.skip("JITFunction (not the interpreter) needs a GPU")
    spec = importlib.util.spec_from_file_location("late_kernel_module", ATTACKS / "late_kernel_module.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = torch.nn.Module()
    before, _ = carry.snapshot(model, module, "late_kernel_module")
    x = torch.randn(1000, device="cuda")
    y = torch.empty_like(x)
    module._copy[(8,)](x, y, 1000, BLOCK=128)
    torch.cuda.synchronize()
    after, _ = carry.snapshot(model, module, "late_kernel_module")
    assert carry.difference(before, after) is None
