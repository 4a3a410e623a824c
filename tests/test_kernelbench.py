"""KernelBench's own task files (a handful, tests/data/kernelbench, with KernelBench's license): the CPU rescaling
keeps them consistent, backs off where it must and says so, --set and --no-rescale hold, and a task that is
degenerate at its own size is refused as the task's own fault."""
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
    check_task(task, "cpu")


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
