"""`crucible check`: exit codes, exactly one JSON object with --json, one clear sentence for bad input."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def crucible(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_accepted_candidate_exits_0_with_one_json_object():
    proc = crucible("check", "tasks/rmsnorm_fwd.py", "tests/candidates/rmsnorm_honest.py", "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # exactly one object: json.loads fails on trailing output
    assert result["verdict"] == "accepted" and result["reason"] == "ok" and result["timed"] is False
    assert [s["stage"] for s in result["stages"]] == ["static", "compile", "smoke", "correctness", "robustness"]


def test_set_checks_the_task_at_another_size():
    proc = crucible("check", "tasks/rmsnorm_fwd.py", "tests/candidates/rmsnorm_honest.py", "--device", "cpu", "--json",
                    "--set", "N=96", "--set", "M=16")  # M small too: the rescaled M at N=96 is a slow check
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["environment"]["constants"]["N"] == 96
    bad = crucible("check", "tasks/rmsnorm_fwd.py", "tests/candidates/rmsnorm_honest.py", "--device", "cpu",
                   "--set", "N=ninety")
    assert bad.returncode == 2 and "write NAME=INTEGER" in bad.stderr and "Traceback" not in bad.stderr


def test_rejected_candidate_exits_1_with_stage_reason_and_report():
    proc = crucible("check", "tasks/rmsnorm_fwd.py", "tests/candidates/cheats/uninitialised.py", "--device", "cpu",
                    "--json")
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["verdict"], result["stage"], result["reason"]) == ("rejected", "correctness", "nonfinite_mismatch")
    assert result["stages"][-1]["mismatch"]["nonfinite_got"] > 0


def test_missing_files_get_one_sentence_and_exit_2():
    proc = crucible("check", "tasks/no_such_task.py", "x.py", "--device", "cpu")
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    proc = crucible("check", "tasks/rmsnorm_fwd.py", "no_such_candidate.py", "--device", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "candidate file no_such_candidate.py does not exist" in " ".join(proc.stderr.split())


def test_a_file_that_is_no_candidate_is_a_bad_invocation(tmp_path):
    """Empty, or no ModelNew at all: exit 2 with a sentence, not a rejected kernel (exit 1)."""
    for name, text, says in (("empty.py", "\n", "is empty"), ("plain.py", "x = 1\n", "defines no ModelNew")):
        (tmp_path / name).write_text(text)
        proc = crucible("check", "tasks/rmsnorm_fwd.py", str(tmp_path / name), "--device", "cpu", "--json")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        reply = json.loads(proc.stdout)
        assert reply["reason"] == "bad_invocation" and says in reply["message"]


def test_version():
    proc = crucible("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("crucible ")


def test_broken_task_is_refused_with_exit_2(tmp_path):
    bad = tmp_path / "bad_task.py"
    bad.write_text("import torch\nclass Model(torch.nn.Module):\n    pass\n")
    proc = crucible("check", str(bad), "--reference", "--device", "cpu")
    assert proc.returncode == 2 and "get_inputs" in proc.stderr and "Traceback" not in proc.stderr


def test_degenerate_task_is_refused(tmp_path):
    task = tmp_path / "constant_task.py"
    task.write_text(
        "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.ones(4)\n"
        "def get_inputs():\n    return [torch.randn(64)]\ndef get_init_inputs():\n    return []\n")
    proc = crucible("check", str(task), "--reference", "--device", "cpu", "--json")
    assert proc.returncode == 2
    assert "same output for different inputs" in json.loads(proc.stdout)["message"]


def test_reference_check_of_a_real_task():
    proc = crucible("check", "tasks/rmsnorm_fwd.py", "--reference", "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["verdict"] == "usable" and summary["float64_reference"] is True


def test_a_crash_inside_crucible_is_one_sentence_and_the_traceback_is_on_v(monkeypatch, capsys):
    import agent.commands.seeds as seeds_cmd
    from agent import cli

    def boom(args):
        raise RuntimeError("CUDA out of memory in a place nobody guarded")

    monkeypatch.setattr(seeds_cmd, "run", boom)
    assert cli.main(["seeds", "list"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "crucible failed inside `seeds`: RuntimeError: CUDA out of memory" in err and "rerun with -v" in err
    assert "Traceback" not in err
    with pytest.raises(RuntimeError):
        cli.main(["-v", "seeds", "list"])
