"""`crucible run / batch / archive / seeds` as a user runs them: subprocesses, no key, no GPU."""
import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_loop import GOOD, TASK

ROOT = Path(__file__).resolve().parent.parent


def crucible(*args, env_extra=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", *map(str, args)], cwd=ROOT, env=_env(env_extra),
                          capture_output=True, text=True, timeout=timeout)


def _env(extra=None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "CRUCIBLE_MODEL", "CRUCIBLE_ARCHIVE")}
    env["COLUMNS"] = "200"
    env.update(extra or {})
    return env


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "tasks").mkdir()
    task = tmp_path / "tasks" / "scale.py"
    task.write_text(TASK)
    kernel = tmp_path / "start.py"
    kernel.write_text(GOOD)
    return task, kernel


def committed(db: Path) -> int:
    """Candidates committed so far; 0 while the archive is still being created."""
    try:
        return len(rows(db)) if db.exists() else 0
    except sqlite3.OperationalError:
        return 0


def rows(db: Path) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT id, uid, run_id, source_sha, verdict, reason, origin FROM candidates "
                           "ORDER BY id").fetchall()
    finally:
        con.close()


def test_run_on_a_repo_task_without_key_or_gpu_uses_the_tuner(tmp_path):
    db = tmp_path / "archive.db"
    # at a small --set size: each interpreter check takes about 1 s instead of 5 (what is checked is the same)
    out = crucible("run", "tasks/rmsnorm_fwd.py", "--budget", "3", "--set", "M=16", "--set", "N=256", "--device", "cpu",
                   "--archive", db)
    assert out.returncode == 0, out.stderr + out.stdout
    text = out.stdout
    assert "offline tuner proposes" in text and "nothing is timed" in text
    assert "not timed" in text and "not measured" in text and "roofline" in text
    found = rows(db)
    assert [r[6] for r in found] == ["seed", "tuner", "tuner", "tuner"]
    assert all(r[4] in ("accepted", "rejected") for r in found) and found[0][4] == "accepted"
    run_id = found[0][2]
    best = db.parent / run_id / "best.py"
    assert best.is_file() and "ModelNew" in best.read_text() and str(best) in text.replace("\n", "")

    listed = json.loads(crucible("archive", "list", "--json", "--archive", db).stdout)
    assert [r["id"] for r in listed] == [r[0] for r in found]
    assert set(listed[0]) == {"id", "task", "verdict", "stage", "reason", "proposer", "speedup", "created"}
    assert all(r["speedup"] is None for r in listed)
    assert json.loads(crucible("archive", "list", "--task", "other.py", "--json", "--archive", db).stdout) == []
    shown = json.loads(crucible("archive", "show", str(found[1][0]), "--json", "--archive", db).stdout)
    assert "ModelNew" in shown["source"] and shown["proposer"] == "tuner" and shown["parent_id"] == found[0][0]


def test_kill_then_resume_loses_no_committed_record(tmp_path, tiny):
    task, kernel = tiny
    db = tmp_path / "archive.db"
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", str(task), "--from", str(kernel), "--budget",
                             "40", "--device", "cpu", "--archive", str(db)], cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if committed(db) >= 3:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("the run committed fewer than 3 records in 240 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run and its harness workers, all at once
        proc.wait(timeout=30)
    before = rows(db)
    assert len(before) >= 3 and len({r[2] for r in before}) == 1
    done = sum(1 for r in before if r[6] != "seed")
    out = crucible("run", task, "--resume", "--budget", done + 2, "--device", "cpu", "--archive", db)
    assert out.returncode == 0, out.stderr + out.stdout
    assert f"resuming run {before[0][2]}" in out.stdout.replace("\n", " ")
    after = rows(db)
    assert after[:len(before)] == before  # every committed record is still there, unchanged
    assert len(after) == len(before) + 2 and {r[2] for r in after} == {before[0][2]}
    assert len({r[3] for r in after}) == len(after)  # no source evaluated twice


def test_bad_invocations_exit_2_with_one_sentence(tmp_path, tiny):
    task, _ = tiny
    db = tmp_path / "archive.db"
    garbage = tmp_path / "garbage.db"
    garbage.write_text("not a database")
    cases = [
        (["run", tmp_path / "missing.py", "--archive", db], "does not exist"),
        (["run", task, "--device", "cpu", "--archive", db], "tuner needs a kernel"),
        (["run", task, "--model", "bogus", "--archive", db], "PROVIDER:MODEL"),
        (["run", task, "--from", tmp_path / "nope.py", "--archive", db], "no such file"),
        (["run", task, "--resume", "--device", "cpu", "--archive", db], "no earlier run"),
        (["archive", "show", "12345", "--archive", db], "no candidate #12345"),
        (["archive", "list", "--archive", tmp_path / "none.db"], "no archive at"),
        (["batch", tmp_path / "nodir"], "not a folder"),
        (["run", task, "--archive", tmp_path / "nodir" / "a.db"], "does not exist"),
        (["run", task, "--baselines", "eager,magic", "--archive", db], "unknown baseline"),
        (["run", task, "--final-baselines", "", "--archive", db], "unknown baseline"),
        (["batch", task.parent, "--baselines", "liger,cudnn", "--archive", db], "unknown baseline"),
        (["archive", "list", "--archive", garbage], "cannot read the archive"),
        (["batch", task.parent, "--archive", garbage], "cannot open the archive"),
    ]
    import torch
    if not torch.cuda.is_available():
        cases.append((["run", task, "--device", "cuda", "--from", tiny[1], "--archive", db], "no CUDA GPU"))
    for args, sentence in cases:
        out = crucible(*args, timeout=120)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert sentence in " ".join(out.stderr.split()), (args, out.stderr)
        assert "Traceback" not in out.stderr


def test_seeds_list_json():
    out = crucible("seeds", "list", "--json")
    assert out.returncode == 0
    listed = json.loads(out.stdout)
    assert {"name": "rmsnorm", "task": "rmsnorm_fwd.py", "path": str(ROOT / "seeds" / "rmsnorm.py")} in listed


def test_batch_runs_each_task_and_writes_reports(tmp_path, tiny):
    task, _ = tiny
    folder = task.parent
    # has a seed; at a size the interpreter checks in about 1 s (the rescaled one takes 5)
    (folder / "rmsnorm_fwd.py").write_text((ROOT / "tasks" / "rmsnorm_fwd.py").read_text()
                                           .replace("M = 16384", "M = 16").replace("N = 4096", "N = 256"))
    (folder / "notes.py").write_text("x = 1\n")  # not a task: ignored
    db, js, cs = tmp_path / "a.db", tmp_path / "out" / "batch.json", tmp_path / "out" / "batch.csv"
    out = crucible("batch", folder, "--budget", "1", "--device", "cpu", "--archive", db, "--json-out", js,
                   "--csv", cs)
    assert out.returncode == 1, out.stdout + out.stderr  # one task could not start: not a full success
    report = {Path(r["task"]).name: r for r in json.loads(js.read_text())["tasks"]}
    assert set(report) == {"rmsnorm_fwd.py", "scale.py"}
    assert report["rmsnorm_fwd.py"]["status"] == "done" and report["rmsnorm_fwd.py"]["proposals"] == 1
    assert report["rmsnorm_fwd.py"]["best_id"] is not None and report["rmsnorm_fwd.py"]["timed"] is False
    assert report["scale.py"]["status"] == "usable" and "reference checked only" in report["scale.py"]["note"]
    with cs.open() as fh:
        assert {r["task"].rsplit("/", 1)[-1] for r in csv.DictReader(fh)} == {"rmsnorm_fwd.py", "scale.py", "ALL"}


def test_sigterm_stops_cleanly(tmp_path, tiny):
    task, kernel = tiny
    db = tmp_path / "archive.db"
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", str(task), "--from", str(kernel), "--budget",
                             "40", "--device", "cpu", "--archive", str(db)], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while committed(db) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, "the run ended before it could be stopped"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, stdout, stderr)
    found = rows(db)
    assert all(r[4] in ("accepted", "rejected", "interrupted") for r in found)
    con = sqlite3.connect(db)
    stop_reason = con.execute("SELECT stop_reason FROM runs").fetchone()[0]
    con.close()
    assert stop_reason == "interrupted" and "interrupted" in stdout
    assert len(found) - 1 < 40  # it stopped well before its budget


def test_rejected_key_exits_2_with_one_sentence(tmp_path, tiny):
    from tests.llm_server import ScriptedServer, json_reply

    task, _ = tiny
    with ScriptedServer() as server:
        server.add(*[json_reply({"error": {"message": "invalid api key", "type": "invalid_request_error"}},
                                status=401) for _ in range(4)])
        env = {"OPENAI_API_KEY": "sk-wrong", "OPENAI_BASE_URL": server.url + "/v1"}
        out = crucible("run", task, "--model", "openai:served", "--budget", "6", "--device", "cpu",
                       "--archive", tmp_path / "a.db", env_extra=env, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "OPENAI_API_KEY" in " ".join(out.stderr.split()) and "Traceback" not in out.stderr
    assert {r[5] for r in rows(tmp_path / "a.db")} == {"provider_error"}  # recorded, then it stopped at once
