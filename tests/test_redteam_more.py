"""More attacks on the harness from a determined candidate, through the whole pipeline (static stage included) on the
CPU interpreter: values read into Python through text, and counters and stored outputs kept where the state walk had
not looked (tests/candidates/attacks_more, attacks_walk). Each test asserts the attack is rejected, and each failed
while its hole was open."""
import functools
import importlib.util
import types
from pathlib import Path

import pytest
import torch
import triton

from sandbox import carry
from sandbox.harness import CheckOptions, Harness
from sandbox.records import Reason, Stage, Verdict
from sandbox.static import check_source

HERE = Path(__file__).parent
ATTACKS = HERE / "candidates" / "attacks_more"
WALK_ATTACKS = HERE / "candidates" / "attacks_walk"
SEED = 1234

# tests/tasks/row_mean.py at a size where a Python loop over every element costs milliseconds a call.
ROW_MEAN = HERE / "tasks" / "row_mean.py"


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


# f"{t}" (Tensor.__format__) reads a value into Python through an .item() the function mode does not see (it runs
# with the mode popped), and `y[r] = float` writes it back as glue: the whole output computed in Python. Every value
# read into Python runs the aten op `_local_scalar_dense`, which the dispatch mode counts (sandbox/trace.py).
def test_python_compute_through_fstrings_is_refused(harness, small_task):
    result = _check(harness, small_task, ATTACKS / "fstring_python_compute.py")
    assert result.verdict is Verdict.REJECTED, result.message
    assert result.reason is Reason.FOREIGN_COMPUTE, (result.reason, result.message)


# str() of an integer tensor (Tensor.__repr__) prints up to 1000 values and runs no compute op and no scalar op; a
# float row read as its int32 bits is decoded in Python. Text of a tensor counts each of its elements as a read.
def test_python_compute_through_repr_is_refused(harness, small_task):
    result = _check(harness, small_task, ATTACKS / "repr_python_compute.py")
    assert result.verdict is Verdict.REJECTED, result.message
    assert result.reason is Reason.FOREIGN_COMPUTE, (result.reason, result.message)


# A counter and a stored output kept where the state walk had not looked, through the static stage: in a dict reachable
# only as the `__self__` of a bound builtin method (`{...}.get`), or in a Triton object's attributes
# (triton.Config(...).kwargs). The walk now follows a builtin method to its object and walks Triton's objects other
# than its launchers like any object (sandbox/carry.py).
@pytest.mark.parametrize("name", ["method_hidden_store.py", "config_hidden_store.py"])
def test_a_counter_hidden_from_the_state_walk_is_refused(harness, small_task, name):
    result = _check(harness, small_task, ATTACKS / name)
    assert result.verdict is Verdict.REJECTED, result.message
    assert result.reason is Reason.STATE_CARRIED, (result.reason, result.message)


# More counters the walk had not seen, through the static stage: an iterator's position, an attribute set on the
# candidate's own Triton kernel, a torch generator's seed; a generator's position is refused outright.
@pytest.mark.parametrize("name", ["iterator_hidden_store.py", "kernel_attr_hidden_store.py",
                                  "torch_generator_hidden_store.py"])
def test_a_counter_in_an_interpreter_or_library_object_is_refused(harness, small_task, name):
    result = _check(harness, small_task, ATTACKS / name)
    assert result.verdict is Verdict.REJECTED, result.message
    assert result.reason is Reason.STATE_CARRIED, (result.reason, result.message)


def test_a_generator_in_the_state_is_refused(harness, small_task):
    result = _check(harness, small_task, ATTACKS / "generator_hidden_store.py")
    assert result.verdict is Verdict.REJECTED, result.message
    assert "holds a generator" in result.message, (result.reason, result.message)


def test_an_attribute_set_on_an_imported_module_is_refused_statically(harness, small_task):
    result = _check(harness, small_task, ATTACKS / "module_attr_hidden_store.py")
    assert result.verdict is Verdict.REJECTED, result.message
    assert result.stage is Stage.STATIC and "setting `torch.crucible_calls`" in result.message, result.message


def test_a_counter_set_on_a_state_tensor_is_refused(harness, small_task):
    result = _check(harness, small_task, ATTACKS / "tensor_attr_hidden_store.py")
    assert result.verdict is Verdict.REJECTED, result.message
    assert result.reason is Reason.STATE_CARRIED and "scale.calls" in result.message, (result.reason, result.message)


# The state walk on its own, for stores a candidate can build from the interpreter's objects: each one's contents
# must show in the snapshot, so that changing them between calls is a change of state.
STORES = '''
_box = {"n": 0}.get
_iter = iter(range(1 << 20))
_slice = slice(0, 1, {"n": 0})
_prop = property(lambda d={"n": 0}: d)
_map = map(int, range(1 << 20))
_config = triton.Config({"n": 0})
_gen = torch.Generator()


def step(which):
    if which == "method":
        _box("n")
        _box.__self__["n"] += 1
    elif which == "iterator":
        next(_iter)
    elif which == "slice":
        _slice.step["n"] += 1
    elif which == "property":
        _prop.fget()["n"] += 1
    elif which == "map":
        next(_map)
    elif which == "config":
        _config.kwargs["n"] += 1
    elif which == "generator":
        _gen.manual_seed(_gen.initial_seed() + 1)
'''


@pytest.mark.parametrize("which", ["method", "iterator", "slice", "property", "map", "config", "generator"])
def test_the_state_walk_sees_inside_the_interpreter_s_and_the_libraries_objects(which):
    module = types.ModuleType("candidate_stores")
    module.__dict__.update(torch=torch, triton=triton)
    exec(compile(STORES, "candidate_stores.py", "exec"), module.__dict__)
    model = torch.nn.Module()
    before, _ = carry.snapshot(model, module, "candidate_stores")
    assert carry.difference(before, carry.snapshot(model, module, "candidate_stores")[0]) is None
    module.step(which)
    assert carry.difference(before, carry.snapshot(model, module, "candidate_stores")[0]) is not None


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
def test_a_store_hidden_from_the_state_walk_is_refused(harness, small_task, name):
    path = WALK_ATTACKS / name
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
    spec = importlib.util.spec_from_file_location("late_kernel_module", WALK_ATTACKS / "late_kernel_module.py")
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
