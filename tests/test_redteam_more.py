"""More attacks on the harness from a determined candidate, through the whole pipeline (static stage included) on the
CPU interpreter: values read into Python through text, and counters kept where the state walk had not looked. Each
test asserts the attack is rejected, and each failed while its hole was open."""
import types
from pathlib import Path

import pytest
import torch
import triton

from sandbox import carry
from sandbox.harness import CheckOptions, Harness
from sandbox.records import Reason, Stage, Verdict

HERE = Path(__file__).parent
ATTACKS = HERE / "candidates" / "attacks_more"
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
