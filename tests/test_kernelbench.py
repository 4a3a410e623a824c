"""KernelBench's own task files (a handful, tests/data/kernelbench, with KernelBench's license): the CPU rescaling
keeps them consistent, backs off where it must and says so, halves tied constants together (HingeLoss's batch_size and
input_shape[0]), --set and --no-rescale hold, also on a tuple's element, and a task that is degenerate at its own size
is refused as the task's own fault."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.reference import check_task
from sandbox.task import CPU_ELEMENT_BUDGET, TaskError, load_task

ROOT = Path(__file__).resolve().parent.parent
KB = ROOT / "tests" / "data" / "kernelbench"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_rescaled_values_derived_at_import_follow_their_constants():
    # bias_shape = (out_channels, 1, 1) is computed when the file runs: it must follow the rescaled out_channels
    task = load_task(KB / "level2" / "1_Conv2D_ReLU_BiasAdd.py").scaled_for_cpu()
    assert task.overrides["out_channels"] < 128
    assert task.module.bias_shape == (task.module.out_channels, 1, 1)
    assert max(x.numel() for x in task.module.get_inputs()) <= CPU_ELEMENT_BUDGET
    assert check_task(task, "cpu")["outputs"][0]["shape"][1] == task.module.out_channels
    assert task.rescale_note == ""


def test_rescaling_backs_off_where_the_smaller_task_breaks_and_says_so():
    # GroupNorm(8, out_channels): halving out_channels 96 -> 12 breaks divisibility by 8
    task = load_task(KB / "level2" / "23_Conv3d_GroupNorm_Mean.py").scaled_for_cpu()
    assert task.module.out_channels % 8 == 0
    assert "out_channels=12" in task.rescale_note and "divisible" in task.rescale_note
    assert f"keeps out_channels={task.module.out_channels}" in task.rescale_note
    # D equals out_channels at the task's own size (24), by chance: the lone halving of out_channels that broke the
    # task is retried with D halved along, which breaks too, so D goes on being halved alone
    assert task.module.D < task.constants["D"] == task.constants["out_channels"]
    assert "together" not in task.rescale_note
    check_task(task, "cpu")


def test_tuple_elements_are_constants_and_tied_ones_are_halved_together():
    # torch.rand(batch_size, *input_shape) times a (batch_size,) vector: it runs only while the two are equal, and
    # at its own size (32768 x 32768) it is beyond the CPU
    task = load_task(KB / "level1" / "100_HingeLoss.py")
    assert task.constants == {"batch_size": 32768, "input_shape[0]": 32768, "dim": 1}
    assert set(task.scalable()) == {"batch_size", "input_shape[0]"}
    small = task.scaled_for_cpu()
    assert small.module.input_shape == (small.module.batch_size,) and small.module.batch_size < 32768
    assert max(x.numel() for x in small.module.get_inputs()) <= CPU_ELEMENT_BUDGET
    assert "alone" in small.rescale_note and "halves batch_size and input_shape[0] together" in small.rescale_note
    check_task(small, "cpu")


def test_a_tuple_element_is_replaced_where_the_file_assigns_it_and_what_follows_it_follows(tmp_path):
    path = tmp_path / "shape.py"  # a (C, H, W) tuple, a value derived from it, and a tuple derived from a constant
    path.write_text("import torch\nimport torch.nn as nn\nB = 64\nshape = (3, 40, 48)\nflat = shape[1] * shape[2]\n"
                    "bias_shape = (B, 1)\n"
                    "class Model(nn.Module):\n    def forward(self, x):\n        return x.flatten(1) * 2\n"
                    "def get_inputs():\n    return [torch.randn(B, *shape)]\ndef get_init_inputs():\n    return []\n")
    task = load_task(path, {"shape[1]": 20})
    assert task.module.shape == (3, 20, 48) and task.module.flat == 20 * 48
    assert set(load_task(path).scalable()) == {"B", "shape[1]", "shape[2]"}  # shape[0] = 3 is below MIN_SCALABLE
    assert set(task.scalable()) == {"B", "shape[2]"}  # shape[1] is the user's: pinned
    assert {"flat", "bias_shape[0]", "bias_shape[1]"} <= task.derived  # computed from other names: they follow
    assert task.scaled_for_cpu().module.shape[1] == 20
    with pytest.raises(TaskError, match=r"no integer constant named shape\[3\]"):
        load_task(path, {"shape[3]": 5})


def test_set_pins_a_constant_and_no_rescale_keeps_the_size():
    task = load_task(KB / "level2" / "1_Conv2D_ReLU_BiasAdd.py", {"out_channels": 24}).scaled_for_cpu()
    assert task.module.out_channels == 24 and task.module.bias_shape == (24, 1, 1)
    assert task.module.batch_size < 128  # the others are still rescaled
    same = load_task(KB / "level1" / "19_ReLU.py", {"batch_size": 2, "dim": 40}, rescale=False)
    assert same.scaled_for_cpu().current_constants() == {"batch_size": 2, "dim": 40}
    with pytest.raises(TaskError, match="no integer constant named nope"):
        load_task(KB / "level1" / "19_ReLU.py", {"nope": 3})


def test_constants_the_file_derives_are_never_rescaled_alone(tmp_path):
    path = tmp_path / "derived.py"
    path.write_text("import torch\nimport torch.nn as nn\nN = int(1e6)\nD = 1024\nH = 4 * D\n"
                    "class Model(nn.Module):\n    def forward(self, x):\n        return x * 2\n"
                    "def get_inputs():\n    return [torch.randn(H, 64)]\ndef get_init_inputs():\n    return []\n")
    task = load_task(path)
    assert task.derived == frozenset({"H"}) and set(task.scalable()) == {"N", "D"}
    small = task.scaled_for_cpu()
    assert small.module.H == 4 * small.module.D and "H" not in small.overrides


def test_a_task_degenerate_at_its_own_size_is_refused_as_its_own_fault(tmp_path):
    path = tmp_path / "constant.py"  # softmax over a dimension of size 1: 1.0 whatever the input
    path.write_text("import torch\nimport torch.nn as nn\nB = 64\n"
                    "class Model(nn.Module):\n    def forward(self, x):\n        return torch.softmax(x, dim=1)\n"
                    "def get_inputs():\n    return [torch.randn(B, 1)]\ndef get_init_inputs():\n    return []\n")
    out = _cli("check", str(path), "--reference", "--device", "cpu", "--json")
    assert out.returncode == 2, out.stderr
    message = json.loads(out.stdout)["message"]
    assert "same output for different inputs" in message and "1.0 everywhere" in message


def test_check_reference_reports_the_rescaling_and_the_note():
    out = _cli("check", str(KB / "level2" / "23_Conv3d_GroupNorm_Mean.py"), "--reference", "--device", "cpu",
               "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out.stdout)
    assert got["verdict"] == "usable" and got["constants"]["out_channels"] % 8 == 0 and got["rescaled"]
    assert "keeps out_channels=" in got["note"]


def test_set_on_a_tuple_element_from_the_command_line():
    out = _cli("check", str(KB / "level1" / "100_HingeLoss.py"), "--reference", "--device", "cpu", "--json",
               "--set", "batch_size=96", "--set", "input_shape[0]=96")
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out.stdout)
    assert got["verdict"] == "usable" and got["constants"] == {"batch_size": 96, "input_shape[0]": 96, "dim": 1}
    assert not got["rescaled"]
    # only one of the two: the task's own shapes disagree, and the sentence says so (no traceback)
    out = _cli("check", str(KB / "level1" / "100_HingeLoss.py"), "--reference", "--device", "cpu", "--json",
               "--set", "batch_size=96", "--set", "input_shape[0]=64")
    assert out.returncode == 2 and "Traceback" not in out.stdout + out.stderr
    assert "must match" in json.loads(out.stdout)["message"]
