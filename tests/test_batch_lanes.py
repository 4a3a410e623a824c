"""`crucible batch --gpus N` on CUDA: N lanes, one task per GPU at a time, driven on the CPU.

The GPUs are pretended (two visible) and the harness is a scripted evaluator; the batch command, the lanes, the
lane executors (`LocalExecutor(gpu_ids=(k,))`), the loop and the archive are the real ones.
"""
import argparse
import collections
import json
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import torch

import agent.commands.batch as batch_mod
import agent.search.loop as loop_mod
from agent.cli import main
from sandbox.records import CheckResult, Reason, Stage, StageResult, Verdict

ROOT = Path(__file__).resolve().parent.parent


class Evaluator:
    """Accepts everything with a scripted timing; the first check on each GPU waits for the other GPU's first check
    (a Barrier that times out when the tasks run one after another)."""

    def __init__(self, lab, task, device, gpu):
        self.lab, self.task, self.gpu = lab, task.path.name, gpu
        with lab.lock:
            lab.made.append((self.task, device, gpu))

    def check(self, path, baselines=None, incumbent_ms=None, retime=False):
        lab = self.lab
        with lab.lock:
            first = self.gpu not in lab.waited
            lab.waited.add(self.gpu)
            lab.checks += 1
            n = lab.checks
        if first:
            lab.barrier.wait()
        if self.task in lab.after:  # held until that task's run has finished (an order, not a race with a sleep)
            assert lab.done[lab.after[self.task]].wait(60), f"{lab.after[self.task]} never finished"
        time.sleep(lab.slow.get(self.task, 0.0))
        timing = {"candidate_ms": 1.0 / n,
                  "baselines": {"eager": {"ms": 1.0, "speedup": 1.0 + n / 100, "ci_low": 1.0, "ci_high": 1.0 + n / 50,
                                          "significant": True}},
                  "roofline": {"pct_of_roofline": 50.0, "bound": "memory"}}
        return CheckResult(task=self.task, candidate=str(path), device="cuda", verdict=Verdict.ACCEPTED,
                           stage=Stage.ROBUSTNESS, reason=Reason.OK, message="ok",
                           stages=(StageResult(Stage.ROBUSTNESS, True, Reason.OK),), seconds=0.01, timed=True,
                           timing=timing, environment={"gpu": f"scripted {self.gpu}"})

    def close(self):
        pass


class Lab:
    def __init__(self):
        self.lock = threading.Lock()
        self.made, self.waited, self.checks = [], set(), 0
        self.barrier = threading.Barrier(2, timeout=20)
        self.slow: dict[str, float] = {}
        self.after: dict[str, str] = {}  # task -> the task whose run must finish before its checks go on
        self.done = collections.defaultdict(threading.Event)  # task -> set once its run_search returned
        self.finished: list[str] = []  # tasks in the order their run_search returned
        self.runs = []  # (task, config.gpus, the lane executor's gpu_ids)
        self.before = None  # called with (task name, kwargs) before the real run_search


@pytest.fixture
def lab(monkeypatch):
    """Two visible GPUs; run_search runs for real on the batch's lane executor with the scripted evaluator."""
    lab = Lab()
    monkeypatch.setattr(batch_mod, "_visible_gpus", lambda device: 2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    real = loop_mod.run_search

    def run_search(config, archive, *, executor=None, **kw):
        name = Path(config.task_path).name
        with lab.lock:
            lab.runs.append((name, config.gpus, executor.gpu_ids))
        if lab.before is not None:
            lab.before(name, kw)
        executor.factory = lambda task, device, gpu: Evaluator(lab, task, device, gpu)
        executor.resolve_device = lambda device: "cuda"
        try:
            return real(config, archive, executor=executor, **kw)
        finally:
            with lab.lock:
                lab.finished.append(name)
            lab.done[name].set()

    monkeypatch.setattr(loop_mod, "run_search", run_search)
    return lab


def folder(tmp_path, *names):
    d = tmp_path / "tasks"
    d.mkdir()
    for name in names:  # real task files: their seeds start the tuner
        (d / name).write_text((ROOT / "tasks" / name).read_text())
    return d


def batch(d, tmp_path, *extra):
    js = tmp_path / "batch.json"
    code = main(["batch", str(d), "--budget", "2", "--archive", str(tmp_path / "a.db"), "--json-out", str(js),
                 *map(str, extra)])
    return code, (json.loads(js.read_text())["tasks"] if js.exists() else None)


def test_two_gpus_run_two_tasks_at_once_one_worker_each(lab, tmp_path, capsys):
    d = folder(tmp_path, "softmax_fwd.py", "layernorm_fwd.py", "rmsnorm_fwd.py")
    lab.after["layernorm_fwd.py"] = "softmax_fwd.py"  # the first task finishes last (0.4 s sleeps lost the race
    # under a loaded CI machine: the other lane's two tasks took longer)
    code, rows = batch(d, tmp_path, "--gpus", "2")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "3 tasks on 2 GPUs: one task per GPU at a time" in out
    assert [Path(r["task"]).name for r in rows] == ["layernorm_fwd.py", "rmsnorm_fwd.py", "softmax_fwd.py"]
    assert all(r["status"] == "done" and r["best_id"] is not None and r["timed"] for r in rows), rows
    assert all(r["proposals"] == 2 and r["final_check"] == "confirmed" for r in rows), rows
    # each task ran once, with one evaluation worker, on its lane's GPU only
    assert sorted(name for name, _, _ in lab.runs) == sorted(Path(r["task"]).name for r in rows)
    assert {gpus for _, gpus, _ in lab.runs} == {1} and {ids for _, _, ids in lab.runs} == {(0,), (1,)}
    lane_of = {name: ids[0] for name, _, ids in lab.runs}
    assert all(device == "cuda" and gpu == lane_of[name] for name, device, gpu in lab.made), lab.made
    assert lane_of["rmsnorm_fwd.py"] == lane_of["softmax_fwd.py"] != lane_of["layernorm_fwd.py"]  # dynamic
    con = sqlite3.connect(tmp_path / "a.db")
    # the archive's `finished` has one-second resolution (ties): the lab records the order the runs returned in
    assert lab.finished[-1] == "layernorm_fwd.py"  # the rows above kept the folder's order nonetheless
    per_run = con.execute("SELECT run_id, COUNT(*), COUNT(DISTINCT source_sha) FROM candidates GROUP BY run_id")
    assert [(n, distinct) for _, n, distinct in per_run] == [(3, 3)] * 3  # seed + 2 proposals, none twice


def test_more_gpus_than_tasks_use_one_lane_per_task_and_a_failure_stays_in_its_row(lab, tmp_path, capsys,
                                                                                   monkeypatch):
    monkeypatch.setattr(batch_mod, "_visible_gpus", lambda device: 4)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    d = folder(tmp_path, "rmsnorm_fwd.py", "softmax_fwd.py")

    def before(name, kw):
        lab.barrier.wait()  # both lanes are in a task when one of them breaks
        if name == "softmax_fwd.py":
            raise RuntimeError("a bug inside the loop\nsecond line")
    lab.before = before
    lab.waited.update({0, 1})  # the evaluators need not meet again
    code, rows = batch(d, tmp_path, "--gpus", "4")
    out = capsys.readouterr().out
    assert "2 tasks on 2 GPUs: one task per GPU at a time" in out
    assert code == 1
    assert [(Path(r["task"]).name, r["status"]) for r in rows] == [("rmsnorm_fwd.py", "done"),
                                                                   ("softmax_fwd.py", "failed")]
    assert rows[0]["best_id"] is not None
    assert rows[1]["note"] == ("crucible failed on this task (RuntimeError: a bug inside the loop); this is a bug in "
                               "crucible, rerun with -v for the traceback")


def test_ctrl_c_stops_the_lanes_and_leaves_later_tasks_not_started(lab, tmp_path, capsys):
    d = folder(tmp_path, "geglu_fwd.py", "layernorm_fwd.py", "rmsnorm_fwd.py", "softmax_fwd.py")

    def before(name, kw):
        lab.barrier.wait()  # the first two tasks have both started
        if name == "geglu_fwd.py":
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # Ctrl-C, to the waiting thread
        assert kw["stop"].wait(10)
    lab.before = before
    lab.waited.update({0, 1})
    code, rows = batch(d, tmp_path, "--gpus", "2")
    assert code == 130
    assert [(Path(r["task"]).name, r["status"], r["note"]) for r in rows] == [
        ("geglu_fwd.py", "interrupted", "interrupted"), ("layernorm_fwd.py", "interrupted", "interrupted"),
        ("rmsnorm_fwd.py", "interrupted", "not started"), ("softmax_fwd.py", "interrupted", "not started")]
    assert all(r["run_id"] for r in rows[:2])  # their runs are in the archive, stopped cleanly


def test_too_many_gpus_is_a_bad_invocation(lab, tmp_path, capsys):
    d = folder(tmp_path, "rmsnorm_fwd.py", "softmax_fwd.py")
    code, rows = batch(d, tmp_path, "--gpus", "3")
    assert code == 2 and rows is None and not lab.runs
    assert "--gpus 3 asks for more GPUs than the 2 visible" in capsys.readouterr().err
    assert batch(d, tmp_path, "--gpus", "0")[0] == 2


def test_lanes_only_for_the_local_executor_on_cuda_with_several_gpus(monkeypatch):
    def args(**over):
        return argparse.Namespace(**{"executor": "local", "gpus": 2, "device": "auto", **over})
    monkeypatch.setattr(batch_mod, "_visible_gpus", lambda device: 0 if device == "cpu" else 8)
    assert batch_mod._lane_count(args(), 5) == 2
    assert batch_mod._lane_count(args(gpus=6), 3) == 3  # no more lanes than tasks
    assert batch_mod._lane_count(args(gpus=1), 5) == 1
    assert batch_mod._lane_count(args(device="cpu"), 5) == 1
    assert batch_mod._lane_count(args(executor="ray"), 5) == 1
    assert batch_mod._lane_count(args(gpus=4), 1) == 1  # one task keeps --gpus evaluation workers


def test_several_gpus_asked_on_the_cpu_say_they_are_ignored(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(batch_mod, "_visible_gpus", lambda device: 0)
    d = folder(tmp_path, "rmsnorm_fwd.py", "softmax_fwd.py")
    code, rows = batch(d, tmp_path, "--gpus", "2", "--device", "cpu", "--budget", "0",
                       "--set", "M=16", "--set", "N=256")  # small: each seed's check takes about 1 s
    out = capsys.readouterr().out
    assert code == 0, out
    assert "no GPU to use here: --gpus 2 is ignored" in " ".join(out.split())
    assert [r["status"] for r in rows] == ["done", "done"]
