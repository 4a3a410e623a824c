"""`crucible batch --executor ray` on a local Ray cluster of CPU workers, evaluating through Triton's interpreter.

Needs the [ray] extra (`pip install -e '.[test,ray]'`); skipped without it, except the one test that checks what a user
without Ray is told. The cluster is started once for the module (3 CPU workers); each test makes its own executor,
whose actors are gone when it closes, so the next test can place its own.
"""
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agent.archive.store import Archive
from agent.cli import main
from agent.search.loop import RunConfig, run_search
from tests.llm_server import ScriptedServer, json_reply, openai_completion
from tests.test_loop import GOOD, TASK, WRONG, fenced

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 3


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    # Workers import crucible from this checkout even where it is not pip-installed (CI installs it).
    ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    yield ray
    ray.shutdown()


def tasks(folder: Path, sizes: dict[str, int]) -> list[Path]:
    """Copies of the y = 2x + 1 task, one per size, so that one kernel fits them all."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, n in sizes.items():
        path = folder / f"{name}.py"
        path.write_text(TASK.replace("N = 4096", f"N = {n}"))
        paths.append(path)
    return paths


def block(size: int) -> str:
    return GOOD.replace("BLOCK_SIZE = 1024", f"BLOCK_SIZE = {size}")


@pytest.fixture
def served(monkeypatch):
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "CRUCIBLE_MODEL", "CRUCIBLE_ARCHIVE",
                "CRUCIBLE_PRICES", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    with ScriptedServer() as server:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        yield server


def test_batch_on_a_ray_cluster_records_every_candidate(cluster, served, tmp_path, capsys):
    folder = tmp_path / "tasks"
    tasks(folder, {"scale_a": 4096, "scale_b": 1000, "scale_c": 3001})
    # Tasks run one after another, each asking for its two kernels at once: one verified, one wrong.
    for i, size in enumerate((512, 256, 128)):
        served.add(json_reply(openai_completion(fenced(block(size), f"good {i}"))),
                   json_reply(openai_completion(fenced(WRONG.replace("1024", str(size)), f"wrong {i}"))))
    db, js = tmp_path / "a.db", tmp_path / "batch.json"
    code = main(["batch", str(folder), "--executor", "ray", "--model", "openai:served", "--budget", "2", "--polish",
                 "0", "--device", "cpu", "--archive", str(db), "--json-out", str(js)])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert "Ray cluster: no GPU, 3 CPU(s)" in out.out
    report = {Path(r["task"]).stem: r for r in json.loads(js.read_text())["tasks"]}
    assert {k: (r["status"], r["proposals"], r["accepted"], r["rejected"]) for k, r in report.items()} == {
        name: ("done", 2, 1, 1) for name in ("scale_a", "scale_b", "scale_c")}
    with Archive(db) as archive:
        for name, row in report.items():
            got = sorted((c.reply.split("\n")[0].split()[0], c.verdict, c.reason)
                         for c in archive.candidates(run_id=row["run_id"]))
            assert got == [("good", "accepted", "ok"), ("wrong", "rejected", "output_mismatch")], name
            wrong = next(c for c in archive.candidates(run_id=row["run_id"]) if c.reason == "output_mismatch")
            # the verdict came from a worker, but names the driver's files
            assert wrong.diagnostics["candidate"].startswith(str(tmp_path))
            assert wrong.diagnostics["task"] == str(folder / f"{name}.py")
            assert wrong.diagnostics["stages"][-1]["mismatch"]["mismatched"] > 0
    assert len(served.requests) == 6  # every LLM request came from this process (the driver)


def test_a_worker_killed_mid_check_loses_no_record(cluster, tmp_path):
    from agent.search.ray_executor import RayExecutor

    task, = tasks(tmp_path, {"scale": 4096})
    kernel = tmp_path / "start.py"
    kernel.write_text(GOOD)
    killed: list = []

    def kill_the_first_busy_worker(executor: RayExecutor, done: threading.Event) -> None:
        while not done.is_set():
            busy = executor.busy_actors()
            if busy:
                cluster.kill(busy[0])  # as a lost node or an OOM kill would
                killed.append(busy[0])
                return
            time.sleep(0.02)

    done = threading.Event()
    with RayExecutor() as executor, Archive(tmp_path / "a.db") as archive:
        killer = threading.Thread(target=kill_the_first_busy_worker, args=(executor, done), daemon=True)
        killer.start()
        try:
            s = run_search(RunConfig(task_path=task, budget=3, device="cpu", start_from=kernel), archive,
                           executor=executor)
        finally:
            done.set()
        rows = archive.candidates(run_id=s.run_id)
        pool = executor.pools["cpu"]
        assert killed and killed[0] not in pool.actors and pool.live == WORKERS  # replaced
        lost = executor.retried
    assert s.stop_reason == "budget spent" and s.progress.proposals == 3
    assert [(c.origin, c.verdict, c.reason) for c in rows] == [("seed", "accepted", "ok")] + [
        ("tuner", "accepted", "ok")] * 3
    # the candidate that was on the killed worker was checked again elsewhere and recorded once
    assert len(lost) == 1
    assert lost[0][0] in {f"{c.source_sha[:16]}.py" for c in rows}
    assert len({c.source_sha for c in rows}) == 4


def test_a_killed_driver_resumes_from_the_archive(cluster, served, tmp_path):
    folder = tmp_path / "tasks"
    tasks(folder, {"scale_a": 4096, "scale_b": 1000})
    for i, size in enumerate((512, 256, 2048, 4096, 128, 8192, 64, 32)):  # more than needed: a killed driver may
        reply = json_reply(openai_completion(fenced(block(size), f"block {size}")))  # lose a reply
        # After the first, each reply takes a while: the driver is killed while its first run is surely unfinished.
        served.add(replace(reply, delay_s=1.5) if i else reply)
    db = tmp_path / "a.db"
    args = ["batch", str(folder), "--executor", "ray", "--address", cluster.get_runtime_context().gcs_address,
            "--model", "openai:served", "--budget", "2", "--polish", "0", "--concurrency", "1", "--device", "cpu",
            "--archive", str(db)]
    env = {**os.environ, "COLUMNS": "200"}
    log = tmp_path / "driver.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "agent.cli", *args], cwd=ROOT, env=env,
                                start_new_session=True, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None and committed(db) < 1:
            time.sleep(0.05)
        assert proc.poll() is None, log.read_text()
        os.killpg(proc.pid, signal.SIGKILL)  # the driver dies without a word; its Ray job ends with it
    finally:
        proc.wait(timeout=30)
    with Archive(db) as archive:
        before = [(c.id, c.uid, c.run_id) for c in archive.candidates()]
        first_run = before[0][2]
        assert archive.get_run(first_run).finished is None
    assert len(before) >= 1

    code = main([*args[:4], *args[6:], "--resume"])  # this process's cluster: no --address
    assert code == 0
    with Archive(db) as archive:
        after = archive.candidates()
        assert [(c.id, c.uid, c.run_id) for c in after[:len(before)]] == before  # nothing lost or rewritten
        runs = {c.run_id for c in after}
        assert first_run in runs and len(runs) == 2  # the first task's run was continued, not started again
        for run_id in runs:
            assert archive.run_usage(run_id)["proposals"] == 2
            assert archive.get_run(run_id).stop_reason == "budget spent"
        assert all(c.verdict in ("accepted", "rejected") for c in after)


def committed(db: Path) -> int:
    import sqlite3
    if not db.exists():
        return 0
    try:
        con = sqlite3.connect(db)
        try:
            return con.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
        finally:
            con.close()
    except sqlite3.OperationalError:
        return 0


def test_without_ray_the_user_is_told_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as it does where Ray is not installed
    tasks(tmp_path / "tasks", {"scale": 4096})
    code = main(["batch", str(tmp_path / "tasks"), "--executor", "ray", "--device", "cpu", "--archive",
                 str(tmp_path / "a.db")])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'kernel-crucible[ray]'" in err and "Traceback" not in err
    assert main(["batch", str(tmp_path / "tasks"), "--address", "10.0.0.1:6379"]) == 2
    assert "use it with --executor ray" in capsys.readouterr().err
