"""`crucible batch` over KernelBench folders: kernels matched by name (--from DIR), the reference-only mode when
there is nothing to search with, KernelBench's fast_p metrics, and output that survives a pipe."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from agent.archive import batch_summary
from agent.commands.batch import match_kernels

ROOT = Path(__file__).resolve().parent.parent
KB = ROOT / "tests" / "data" / "kernelbench"
KERNELS = ROOT / "tests" / "data" / "kernelbench_kernels"


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # PYTHONPATH: this checkout's crucible, whatever checkout the environment was installed from
    env = {**__import__("os").environ, "CRUCIBLE_MODEL": "", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=240, env=env)


def test_kernels_match_tasks_by_name(tmp_path):
    level = tmp_path / "level1"
    level.mkdir()
    tasks = [level / n for n in ("19_ReLU.py", "1_Square_matrix_multiplication_.py", "23_Softmax.py", "9_X.py")]
    kernels = tmp_path / "kernels"
    (kernels / "sub").mkdir(parents=True)
    body = "class ModelNew:\n    pass\n"
    (kernels / "19_ReLU.py").write_text(body)
    (kernels / "19_ReLU_v2.py").write_text(body)  # exact name wins over a prefixed one
    (kernels / "sub" / "level_1_problem_1_sample_0_kernel.py").write_text(body)
    (kernels / "level_2_problem_23_sample_0_kernel.py").write_text(body)  # another level's problem 23
    (kernels / "23_Softmax_notes.py").write_text("x = 1\n")  # no ModelNew: not a kernel
    (kernels / "19_X.py").write_text(body)  # 9_X must not take 19_X
    found = match_kernels(tasks, kernels)
    assert found == {tasks[0]: kernels / "19_ReLU.py",
                     tasks[1]: kernels / "sub" / "level_1_problem_1_sample_0_kernel.py"}


def test_fast_p_as_kernelbench_defines_it():
    rows = [batch_summary.empty_row(Path(f"t{i}.py"), "done") for i in range(5)]
    for row, (eager, comp) in zip(rows, [(3.0, 1.5), (1.2, 0.8), (0.5, 0.4), (None, None)]):
        row.update(correct=True, timed=eager is not None, speedup_eager=eager, speedup_compile=comp, tokens=1000)
    m = batch_summary.metrics(rows)  # the fifth task has no correct kernel
    assert m["fast_0_eager"] == pytest.approx(4 / 5)
    assert m["fast_1_eager"] == pytest.approx(2 / 5) and m["fast_2_eager"] == pytest.approx(1 / 5)
    assert m["fast_1_compile"] == pytest.approx(1 / 5) and m["fast_2_compile"] == 0.0
    assert m["geomean_eager"] == pytest.approx((3.0 * 1.2 * 0.5) ** (1 / 3))
    assert m["tokens_per_correct"] == pytest.approx(4000 / 4) and m["cost_per_correct"] is None
    untimed = batch_summary.metrics([{**rows[3]}])
    assert untimed["fast_0_eager"] == 1.0 and untimed["fast_1_eager"] is None and untimed["geomean_eager"] is None


def test_summary_fits_80_columns_off_a_terminal():
    row = batch_summary.empty_row(Path("/x/8_Conv3d_Divide_Max_GlobalAvgPool_BiasAdd_Sum.py"), "done")
    best = "/a/very/long/path/" + "d" * 90 + "/best.py"
    row.update(correct=True, timed=True, best_id=12, speedup_eager=1.234, eager_ci_low=1.2, eager_ci_high=1.3,
               speedup_compile=0.9, compile_ci_low=0.85, compile_ci_high=0.95, best_path=best)
    buf = io.StringIO()
    console = Console(file=buf, width=80, force_terminal=False)
    batch_summary.render(console, [row], batch_summary.metrics([row]), reference_only=False)
    lines = buf.getvalue().splitlines()
    assert "8_Conv3d_Divide_Max_GlobalAvgPool_BiasAdd_Sum.py" in lines
    assert any("1.23x [1.20,1.30]" in ln and "0.90x [0.85,0.95]" in ln for ln in lines)
    assert f"  {best}" in lines  # the whole path on its own line
    assert all(len(ln) <= 80 for ln in lines if best not in ln)


def test_batch_with_nothing_to_search_with_checks_every_reference(tmp_path):
    folder = tmp_path / "level1"  # none of these has a seed
    folder.mkdir()
    for name in ("19_ReLU.py", "2_Standard_matrix_multiplication_.py"):
        shutil.copy(KB / "level1" / name, folder / name)
    shutil.copy(KB / "level2" / "23_Conv3d_GroupNorm_Mean.py", folder / "23_Conv3d_GroupNorm_Mean.py")
    out = _cli("batch", str(folder), "--device", "cpu", "--json", "--archive", str(tmp_path / "a.db"), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out.stdout)
    assert [Path(r["task"]).name for r in got["tasks"]] == ["2_Standard_matrix_multiplication_.py", "19_ReLU.py",
                                                           "23_Conv3d_GroupNorm_Mean.py"]
    assert all(r["status"] == "usable" for r in got["tasks"])
    assert "keeps out_channels=" in got["tasks"][2]["note"]
    assert got["metrics"]["tasks"] == 3 and got["metrics"]["correct"] == 0
    assert "--from DIR" in out.stderr and "--model" in out.stderr


def test_batch_from_a_folder_of_kernels(tmp_path, capsys):
    from agent.archive.store import Archive
    from agent.cli import main

    folder = tmp_path / "level1"
    folder.mkdir()
    shutil.copy(KB / "level1" / "19_ReLU.py", folder / "19_ReLU.py")
    shutil.copy(KB / "level2" / "1_Conv2D_ReLU_BiasAdd.py", folder / "1_Conv2D_ReLU_BiasAdd.py")
    db = tmp_path / "a.db"
    out = _cli("batch", str(folder), "--from", str(KERNELS), "--device", "cpu", "--budget", "0",
               "--archive", str(db), "--json-out", str(tmp_path / "s.json"),
               "--csv", str(tmp_path / "s.csv"), cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr  # the conv had no kernel: checked, not searched
    got = json.loads((tmp_path / "s.json").read_text())
    conv, relu = got["tasks"]
    assert relu["correct"] is True and relu["start_from"] == str(KERNELS / "19_ReLU.py")
    assert conv["status"] == "usable" and conv["correct"] is False
    assert got["metrics"]["fast_0_eager"] == 0.5 and got["metrics"]["fast_1_eager"] is None
    assert "correct: 1 of 2 (fast_0 50%)" in out.stdout
    assert "ALL,fast_0_eager" in (tmp_path / "s.csv").read_text()

    # The archive alone gives the same table back, and --resume keeps both tasks: they are finished.
    assert main(["archive", "report", "--json", "--archive", str(db)]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["tasks"] == got["tasks"] and again["metrics"] == got["metrics"]
    with Archive(db) as a:
        runs = len(a.runs())
    assert main(["batch", str(folder), "--from", str(KERNELS), "--device", "cpu", "--budget", "0", "--resume",
                 "--archive", str(db)]) == 1
    assert "2 of 2 tasks finished before are kept" in capsys.readouterr().out
    with Archive(db) as a:
        assert len(a.runs()) == runs and len(a.batches()) == 1
