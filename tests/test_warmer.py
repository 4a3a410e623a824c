"""The warmer (sandbox/warmer.py): a second process of the candidate makes the robustness stage's first calls ahead
of it, and what it compiled reaches the check's own process. On the CPU the interpreter compiles nothing, so the
round trip is shown by a candidate that writes its stand-in for a compiled kernel into its Triton cache at each shape
and answers wrongly at a shape whose file it does not find: accepted only where the warmer's files were planted."""
from pathlib import Path

import pytest

from sandbox import harness as harness_mod
from sandbox import warmer
from sandbox.harness import CheckOptions, Harness
from sandbox.process import _alive
from sandbox.records import Reason, Stage, StageResult
from tests.conftest import DEVICE, needs_gpu

HERE = Path(__file__).parent
RMSNORM = HERE.parent / "tasks" / "rmsnorm_fwd.py"
HONEST = HERE / "candidates" / "rmsnorm_honest.py"
# The honest RMSNorm, wrong at a shape whose stand-in for a compiled kernel is not yet in its Triton cache (a file it
# writes there on every call; its process's first call, at the task's own shape, is always right). It imports os:
# this module's harness has the static stage off.
CACHED_EDITS = (
    ("import torch\n", "import os\n\nimport torch\n"),
    ("class ModelNew", "_CALLED = []\n\n\nclass ModelNew"),
    ("        x = x.contiguous()\n",
     "        where = os.path.join(os.environ['TRITON_CACHE_DIR'], 'W%dx%d' % tuple(x.shape))\n"
     "        cached = os.path.exists(os.path.join(where, 'kernel.bin')) or not _CALLED\n"
     "        if not _CALLED:\n"
     "            _CALLED.append(True)\n"
     "        os.makedirs(where, exist_ok=True)\n"
     "        with open(os.path.join(where, 'kernel.bin'), 'wb') as f:\n"
     "            f.write(b'compiled')\n"
     "        x = x.contiguous()\n"),
    ("        return y\n", "        return y if cached else torch.zeros_like(y)\n"),
)


def _edited(path: Path, edits: tuple[tuple[str, str], ...]) -> str:
    source = path.read_text()
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return source


@pytest.fixture(scope="module")
def harness():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(harness_mod.static, "check_source", lambda source, name="": None)
        with Harness(DEVICE) as h:
            yield h


def _waited_for(monkeypatch) -> None:
    """On a GPU RMSNorm's check reaches its robustness stage before a warmer has made its CUDA context and compiled
    both shapes: here it is waited for as long as that takes, whatever the check's own first call took."""
    monkeypatch.setattr(warmer, "WAIT_S", 60.0)


def test_the_warmer_s_kernels_reach_the_robustness_stage(harness, tmp_path, monkeypatch):
    _waited_for(monkeypatch)
    cached = tmp_path / "rmsnorm_cached_shapes.py"
    cached.write_text(_edited(HONEST, CACHED_EDITS))
    without = harness.check(RMSNORM, cached, CheckOptions(device=DEVICE, timing=False, timeout_s=120, warm=False))
    assert not without.accepted and without.stage is Stage.ROBUSTNESS
    assert without.reason is Reason.OUTPUT_MISMATCH  # a shape it had not "compiled" before its own first call there
    warmed = harness.check(RMSNORM, cached, CheckOptions(device=DEVICE, timing=False, timeout_s=120, warm=True))
    assert warmed.accepted, warmed.message
    details = warmed.stages[-1].details
    assert details["warmed"] == len(details["shapes"]) == 2
    assert details["planted"] == warmed.costs["warmer_files"] == 2 if DEVICE == "cpu" else details["planted"] > 2


def test_the_warmer_is_dead_before_the_robustness_stage_s_first_call_and_leaves_nothing(harness, monkeypatch):
    seen = []
    finish = warmer.Warmer.finish

    def finishing(self):
        files = finish(self)
        seen.append((self.run.child.pid, _alive(self.run.child.pid), self.run.child.scratch.exists(),
                     self.thread.is_alive()))
        return files
    monkeypatch.setattr(warmer.Warmer, "finish", finishing)
    result = harness.check(RMSNORM, HONEST, CheckOptions(device=DEVICE, timing=False, timeout_s=120, warm=True))
    assert result.accepted, result.message
    [(pid, alive, scratch, thread)] = seen
    assert not alive and not scratch and not thread


def test_a_warmer_that_never_returns_costs_the_check_nothing(harness, tmp_path):
    """A candidate that spins forever where its process's first call is at the first robustness shape: only the
    warmer's first call is (the check's own process starts at the task's shape). The warmer is ended where the
    robustness stage begins, and the check is accepted as without it."""
    first_shape = harness._variant_tasks(harness.load(RMSNORM))[0][0]["M"]
    spin = tmp_path / "rmsnorm_spins_in_the_warmer.py"
    spin.write_text(_edited(HONEST, (
        ("class ModelNew", "_FIRST_ROWS = []\n\n\nclass ModelNew"),
        ("        x = x.contiguous()\n",
         "        if not _FIRST_ROWS:\n            _FIRST_ROWS.append(x.shape[0])\n"
         f"        while _FIRST_ROWS[0] == {first_shape}:\n            pass\n        x = x.contiguous()\n"))))
    result = harness.check(RMSNORM, spin, CheckOptions(device=DEVICE, timing=False, timeout_s=60, warm=True))
    assert result.accepted, result.message
    assert result.stages[-1].details["warmed"] == 0  # its first warm call never returned
    assert result.costs["warm_wait_s"] < warmer.WAIT_S + 1.0
    plain = harness.check(RMSNORM, spin, CheckOptions(device=DEVICE, timing=False, timeout_s=60, warm=False))
    assert plain.accepted, plain.message


def test_a_warmer_is_started_where_the_task_s_first_calls_compile_for_long(harness, monkeypatch):
    task = harness.load(RMSNORM)
    run = type("Run", (), {})()
    run.task, run.device, run.stages, run.warmer = task, "cuda:0", [], None
    run.options = CheckOptions()
    monkeypatch.setattr(warmer, "_COMPILE_S", {})
    assert not warmer.wanted(run)  # nothing known of the task yet
    warmer.note_first_call(run, warmer.WARM_AFTER_S + 0.5)
    assert warmer.wanted(run)
    run.stages = [StageResult(Stage.COMPILE, True, Reason.OK, details={"planted_files": 3})]
    warmer.note_first_call(run, warmer.WARM_AFTER_S / 4)
    assert warmer.wanted(run)  # that call began with its source's kept kernels: it compiled nothing
    run.stages = []
    warmer.note_first_call(run, warmer.WARM_AFTER_S / 4)
    assert not warmer.wanted(run)  # the last first call compiled fast
    run.options = CheckOptions(warm=True)
    assert warmer.wanted(run)
    run.options = CheckOptions(warm=True, retime=True)
    assert not warmer.wanted(run)  # a re-time runs no robustness shapes
    run.device, run.options = "cpu", CheckOptions()
    warmer.note_first_call(run, 60.0)
    assert not warmer.wanted(run)  # the interpreter compiles nothing: on the CPU only when asked


@needs_gpu
def test_on_a_gpu_the_warmer_s_triton_kernels_are_planted(harness, monkeypatch, tmp_path):
    """Run with CRUCIBLE_TEST_DEVICE=cuda: the honest RMSNorm takes a kernel of its own at each robustness shape (its
    block is the width's next power of two), which the warmer compiles and the check's process is given."""
    if DEVICE != "cuda":
        pytest.skip("the harness of this module runs on the CPU: set CRUCIBLE_TEST_DEVICE=cuda")
    _waited_for(monkeypatch)
    fresh = tmp_path / "rmsnorm_fresh.py"  # a source of its own: no kept kernels of an earlier check planted
    fresh.write_text(HONEST.read_text() + "\n# a source no earlier check of this module verified\n")
    result = harness.check(RMSNORM, fresh, CheckOptions(device=DEVICE, timing=False, timeout_s=120, warm=True))
    assert result.accepted, result.message
    details = result.stages[-1].details
    assert details["warmed"] == 2 and details["planted"] > 0
