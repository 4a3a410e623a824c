"""A batch as the archive keeps it: `crucible archive report` rebuilds its KernelBench table (per task and fast_p)
from the archived rows alone, as HTML, 80-column text and JSON, and `batch --resume` keeps the tasks it finished."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from agent.archive import batch_summary
from agent.archive.records import Batch
from agent.archive.store import Archive
from agent.cli import main
from agent.commands.batch import open_batch

LONG = "8_Matmul_with_irregular_shapes_and_a_name_longer_than_its_column"


def _row(name: str, status: str = "done", eager=None, comp=None, tokens=0, cost=None, **kw) -> dict:
    row = batch_summary.empty_row(Path(f"/kb/level1/{name}.py"), status, note=kw.pop("note", "budget spent"))
    if eager is not None:
        row.update(correct=True, timed=True, best_id=1, speedup_eager=eager[0], eager_ci_low=eager[1],
                   eager_ci_high=eager[2], speedup_compile=comp[0], compile_ci_low=comp[1], compile_ci_high=comp[2])
    row.update(tokens=tokens, cost_usd=cost, **kw)
    return row


ROWS = [_row("19_ReLU", eager=(2.5, 2.4, 2.6), comp=(1.1, 1.05, 1.2), tokens=3000, cost=0.03, run_id="r1"),
        _row(LONG, eager=(12.34, 12.1, 12.6), comp=(0.5, 0.45, 0.55), tokens=1000, cost=0.01, run_id="r2"),
        _row("23_Softmax", eager=(0.8, 0.7, 0.9), comp=(0.6, 0.5, 0.7), tokens=2000, cost=0.02, run_id="r3"),
        _row("100_HingeLoss", "not started", note="")]


@pytest.fixture
def db(tmp_path) -> Path:
    path = tmp_path / "a.db"
    with Archive(path) as a:
        a.add_batch(Batch(id="batch-1", folder="/kb/level1", device="cuda", started="2026-01-01T00:00:00+00:00",
                          config={"model": "openai:m", "budget": 5, "from": None, "reference_only": False}))
        for i, row in reversed(list(enumerate(ROWS))):  # written in any order: read back in the folder's order
            a.set_batch_row("batch-1", i, row)
    return path


def test_the_kernelbench_table_fits_80_columns_and_cuts_nothing():
    m = batch_summary.metrics(ROWS)
    lines = batch_summary.kernelbench_lines(ROWS, m)
    assert all(len(ln) <= 80 for ln in lines), [ln for ln in lines if len(ln) > 80]
    assert LONG in lines  # too long for its column: on a line of its own, whole
    numbers = lines[lines.index(LONG) + 1]
    assert "12.34x [12.10,12.60]" in numbers and "0.50x [0.45,0.55]" in numbers and numbers.startswith(" ")
    relu = next(ln for ln in lines if ln.startswith("19_ReLU "))
    assert "yes" in relu and "2.50x [2.40,2.60]" in relu and "1.10x [1.05,1.20]" in relu
    assert "not started" in next(ln for ln in lines if ln.startswith("100_HingeLoss "))
    # fast_p over all 4 tasks: eager > 1 for 2 (> 2 for 2), compile > 1 for 1, > 2 for none
    assert next(ln for ln in lines if ln.startswith("vs eager ")).split()[-3:] == ["75%", "50%", "50%"]
    assert next(ln for ln in lines if ln.startswith("vs compile ")).split()[-3:] == ["75%", "25%", "0%"]
    assert "tokens: 6,000, 2,000 per correct kernel; $0.0200 per correct kernel" in lines


def test_archive_report_rebuilds_the_batch_table_from_the_archive(db, tmp_path, capsys):
    assert main(["archive", "report", "--json", "--archive", str(db)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["batch"]["id"] == "batch-1" and [r["task"] for r in got["tasks"]] == [r["task"] for r in ROWS]
    assert got["metrics"] == batch_summary.metrics(ROWS)

    assert main(["archive", "report", "--kernelbench", "--archive", str(db)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == ["KernelBench: /kb/level1", "batch batch-1: 4 tasks on cuda", "model openai:m, budget 5",
                       "started 2026-01-01T00:00:00+00:00, not finished"]
    assert LONG in out and all(len(ln) <= 80 for ln in out)

    page = tmp_path / "r.html"
    assert main(["archive", "report", "-o", str(page), "--archive", str(db)]) == 0
    html = page.read_text()
    section = html[html.index("<section class='kernelbench'"):]
    assert "KernelBench: /kb/level1" in section and "12.34x [12.10,12.60]" in section
    assert "<tr><td>vs eager</td><td class='num'>75%</td><td class='num'>50%</td><td class='num'>50%</td>" in section


def test_report_says_what_is_missing_in_one_sentence(db, tmp_path, capsys):
    assert main(["archive", "report", "--kernelbench", "--batch", "nope", "--archive", str(db)]) == 2
    assert "no batch matches 'nope'" in capsys.readouterr().err
    assert main(["archive", "report", "--archive", str(db)]) == 2
    assert "-o FILE.html" in capsys.readouterr().err
    Archive(tmp_path / "empty.db").close()
    assert main(["archive", "report", "--kernelbench", "--archive", str(tmp_path / "empty.db")]) == 2
    err = capsys.readouterr().err
    assert "holds no batch" in err and "Traceback" not in err


def test_resume_keeps_the_tasks_a_batch_finished(tmp_path):
    folder = tmp_path / "level1"
    folder.mkdir()
    tasks = [folder / f"{n}.py" for n in ("1_A", "2_B", "3_C", "4_D")]
    args = argparse.Namespace(dir=folder, resume_all=False, budget=None, model=None, from_dir=None,
                              reference_only=False, device="cpu")
    with Archive(tmp_path / "a.db") as a:
        first = open_batch(a, args, tasks, searchable=set(tasks[:3]), reference_only=False)
        assert [r["status"] for r in a.batch_rows(first.id)] == ["not started"] * 4  # every task counts at once
        first.record(tasks[0], _row("1_A", proposals=5))
        first.record(tasks[1], _row("2_B", "interrupted", note="interrupted", proposals=2))
        first.record(tasks[2], _row("3_C", proposals=3))
        first.record(tasks[3], _row("4_D", "usable", note=""))  # nothing to search it from: its reference only
        resumed = open_batch(a, argparse.Namespace(**{**vars(args), "resume_all": True}), tasks,
                             searchable=set(tasks[:3]), reference_only=False)
        assert resumed.id == first.id and set(resumed.kept) == {tasks[0], tasks[2], tasks[3]}
        assert a.batch_rows(first.id)[1]["status"] == "not started"  # it runs again
        more = open_batch(a, argparse.Namespace(**{**vars(args), "resume_all": True, "budget": 4}), tasks,
                          searchable=set(tasks), reference_only=False)  # a bigger budget; 4_D now has a kernel
        assert set(more.kept) == {tasks[0]}
        fresh = open_batch(a, args, tasks, searchable=set(tasks), reference_only=False)
        assert fresh.id != first.id and not fresh.kept
        assert [b.id for b in a.batches(folder=str(folder.resolve()))] == [first.id, fresh.id]


def test_the_run_summary_keeps_paths_and_the_resume_command_whole_in_a_pipe(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from agent.archive.records import Candidate
    from agent.commands import run as run_cmd
    from agent.search.runs import Progress, RunSummary

    deep = tmp_path / ("d" * 70) / "runs"
    best = Candidate(task_path="/kb/level1/19_ReLU.py", task_hash="h", origin="seed", proposer="seed",
                     verdict="accepted", reason="ok", id=1, source="x")
    summary = RunSummary(run_id="20260101-000000-19_ReLU-abcd", task_path=f"{deep}/19_ReLU.py", device="cpu",
                         timed=False, proposer="tuner", stop_reason="budget spent", progress=Progress(budget=1),
                         start=best, best=best, best_path=deep / "r" / "best.py", run_dir=deep / "r")
    buf = io.StringIO()
    monkeypatch.setattr(run_cmd, "console", Console(file=buf, width=80, force_terminal=False))
    run_cmd.render_summary(summary, deep / "a.db")
    lines = buf.getvalue().splitlines()
    assert f"  {deep / 'r' / 'best.py'}" in lines and f"  {deep / 'a.db'}" in lines
    assert (f"  crucible run {deep}/19_ReLU.py --resume 20260101-000000-19_ReLU-abcd --archive {deep / 'a.db'}"
            in lines)
    assert all(len(ln) <= 80 for ln in lines if str(deep) not in ln)
