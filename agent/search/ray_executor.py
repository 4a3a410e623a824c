"""Evaluating candidates across a Ray cluster: one evaluation actor per GPU, fed from one queue.

`RayExecutor` keeps one evaluation actor per GPU of the cluster (`num_gpus=1`; one per CPU with `num_cpus=1` on a
cluster without GPUs). A candidate whose actor dies (a killed worker, a lost node) goes back to the head of the queue
for another actor while the dead one is replaced. The search, the LLM requests and every archive write stay in the
driver: workers receive a task's text and a candidate's text and send back the harness's CheckResult. The session
protocol it serves is the local executor's (agent/search/executors.py).
"""
from __future__ import annotations

import concurrent.futures as cf
import importlib.metadata
import logging
import os
import shutil
import tempfile
import threading
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.search.executors import ExecutorError
from sandbox.records import CheckResult
from sandbox.task import Task

if TYPE_CHECKING:
    from agent.search.runs import RunConfig

log = logging.getLogger(__name__)


class EvaluationLost(Exception):
    """A candidate's evaluation was lost with its worker more times than the executor retries."""


@dataclass
class _Job:
    payload: dict[str, Any]
    future: cf.Future
    session: "RaySession"
    attempts: int = 0
    workers: list[str] = field(default_factory=list)  # where it was tried: "node pid" of each actor


class _EvaluationActor:
    """Runs on a worker: a warm harness on the GPU Ray assigned it (index 0 of CUDA_VISIBLE_DEVICES), or the CPU.

    It gets texts, not paths (the driver's files are not on this host), writes them under a scratch folder and
    returns the CheckResult; it never sees the archive.
    """

    def __init__(self, device: str):
        self.device = device
        root = Path(tempfile.gettempdir()) / "crucible-ray"
        self.workdir = root / "sandbox"  # shared by the actors of a node: one Triton driver stub, one cache
        self.scratch = root / f"actor-{os.getpid()}"
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.harness = None

    def where(self) -> str:
        import ray
        return f"{ray.util.get_node_ip_address()} pid {os.getpid()}"

    def check(self, job: dict[str, Any]) -> CheckResult:
        from sandbox.harness import CheckOptions, Harness
        task = self.scratch / "tasks" / job["task_hash"][:16] / job["task_name"]
        if not task.exists():
            task.parent.mkdir(parents=True, exist_ok=True)
            task.write_text(job["task_source"], encoding="utf-8")
        candidate = self.scratch / "candidates" / job["candidate_name"]
        candidate.parent.mkdir(parents=True, exist_ok=True)
        candidate.write_text(job["candidate_source"], encoding="utf-8")
        options = CheckOptions(device=self.device, timing=self.device == "cuda", timeout_s=job["timeout_s"],
                               gpu=0, baselines=tuple(job["baselines"]), incumbent_ms=job.get("incumbent_ms"),
                               retime=bool(job.get("retime")))
        try:
            if self.harness is None:
                self.harness = Harness(self.device, workdir=self.workdir)
            if job.get("constants") or not job.get("rescale", True):
                from sandbox.task import load_task
                loaded = load_task(task, job.get("constants") or None, rescale=job.get("rescale", True))
                return self.harness.check(loaded, candidate, options)
            return self.harness.check(task, candidate, options)
        except BaseException:
            self._drop_harness()  # as the local executor does: the next candidate gets a fresh one
            raise
        finally:
            candidate.unlink(missing_ok=True)

    def _drop_harness(self) -> None:
        harness, self.harness = self.harness, None
        if harness is not None:
            try:
                harness.close()
            except Exception as exc:  # noqa: BLE001 - a broken harness may fail to close; it is dropped anyway
                log.warning("closing a failed harness: %s", exc)

    def close(self) -> None:
        self._drop_harness()
        shutil.rmtree(self.scratch, ignore_errors=True)


class _Pool:
    """Actors of one device kind, each served by a driver thread that takes jobs from one shared queue."""

    def __init__(self, device: str, size: int, *, attempts: int, placement_timeout_s: float):
        import ray
        self.ray = ray
        self.device, self.attempts, self.placement_timeout_s = device, attempts, placement_timeout_s
        resources = {"num_gpus": 1} if device == "cuda" else {"num_cpus": 1}
        self.actor_class = ray.remote(max_restarts=0, **resources)(_EvaluationActor)
        self.queue: deque[_Job] = deque()
        self.cond = threading.Condition()
        self.closed = False
        self.actors: list[Any] = [None] * size
        self.names: dict[int, str] = {}  # "node pid" of each live actor, for logs and retries
        self.busy: dict[int, _Job] = {}
        self.live = 0
        self.retried: list[tuple[str, str]] = []  # (candidate, the worker that was lost)
        self.failures: list[str] = []
        started = [(i, self._new_actor()) for i in range(size)]  # placed and started in parallel
        self.live = sum(self._await_actor(i, actor) for i, actor in started)
        if not self.live:
            raise ExecutorError(f"no {device} evaluation worker could start on the Ray cluster: "
                                f"{self.failures[0]}; check `ray status`, and that every node has crucible installed")
        self.threads = [threading.Thread(target=self._serve, args=(i,), daemon=True, name=f"crucible-ray-{i}")
                        for i in range(size) if self.actors[i] is not None]
        for t in self.threads:
            t.start()

    def _new_actor(self) -> Any:
        return self.actor_class.remote(self.device)

    def _start_actor(self, i: int) -> bool:
        """A fresh actor in slot i; False when the cluster cannot place one in time (the slot then retires)."""
        return self._await_actor(i, self._new_actor())

    def _await_actor(self, i: int, actor: Any) -> bool:
        from ray.exceptions import GetTimeoutError
        try:
            where = self.ray.get(actor.where.remote(), timeout=self.placement_timeout_s)
        except Exception as exc:  # noqa: BLE001 - not placed in time, or died starting (crucible not importable there)
            why = (f"not placed within {self.placement_timeout_s:.0f} s" if isinstance(exc, GetTimeoutError) else
                   _last_line(exc))
            log.warning("evaluation worker %d could not start: %s", i, why)
            self.failures.append(why)
            self.ray.kill(actor)
            self.actors[i] = None
            return False
        log.info("evaluation worker %d on %s (%s)", i, where, self.device)
        self.actors[i] = actor
        self.names[i] = where
        return True

    def submit(self, job: _Job) -> None:
        with self.cond:
            if not self.live:
                _settle(job.future, error=EvaluationLost("no Ray evaluation worker is left; check `ray status`"))
                return
            self.queue.append(job)
            self.cond.notify()

    def _take(self) -> _Job | None:
        with self.cond:
            while not self.queue and not self.closed:
                self.cond.wait()
            return None if self.closed else self.queue.popleft()

    def _serve(self, i: int) -> None:
        from ray.exceptions import RayActorError, RayTaskError, WorkerCrashedError
        while True:
            job = self._take()
            if job is None:
                return
            if job.future.cancelled():
                continue  # its run stopped before a worker was free
            actor, where = self.actors[i], self.names.get(i, "?")
            job.attempts += 1
            job.workers.append(where)
            with self.cond:
                self.busy[i] = job
            try:
                result = self.ray.get(actor.check.remote(job.payload))
            except (RayActorError, WorkerCrashedError) as exc:
                if self.closed:  # killed by close(): its run is over
                    _settle(job.future, error=EvaluationLost("the executor closed during the evaluation"))
                    return
                self._lost(i, job, exc)
                if not self._replace(i):
                    return
                continue
            except RayTaskError as exc:  # the harness itself raised: the loop records a harness error
                _settle(job.future, error=exc.cause if isinstance(exc.cause, BaseException) else exc)
            except Exception as exc:  # noqa: BLE001 - an object lost with its node, a system error: the loop records
                _settle(job.future, error=exc)
            else:
                _settle(job.future, result=replace(result, task=job.payload["task_path"],
                                                   candidate=job.payload["candidate_path"]))
            finally:
                with self.cond:
                    self.busy.pop(i, None)

    def _lost(self, i: int, job: _Job, exc: BaseException) -> None:
        name = job.payload["candidate_name"]
        log.warning("evaluation worker %d (%s) was lost while checking %s: %s", i, job.workers[-1], name,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        with self.cond:
            self.retried.append((name, job.workers[-1]))
        if job.attempts >= self.attempts:
            _settle(job.future, error=EvaluationLost(
                f"the evaluation of {name} was lost with its worker {job.attempts} times ({', '.join(job.workers)})"))
        else:
            # Back to the head of the queue: the first idle actor takes it, while this one is replaced.
            with self.cond:
                self.queue.appendleft(job)
                self.cond.notify()

    def _replace(self, i: int) -> bool:
        old = self.actors[i]
        try:
            self.ray.kill(old)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if self.closed or self._start_actor(i):
            return not self.closed
        with self.cond:
            self.live -= 1
            if not self.live:  # nobody left to take the queue
                for job in self.queue:
                    _settle(job.future, error=EvaluationLost("every Ray evaluation worker was lost; check `ray "
                                                            "status`"))
                self.queue.clear()
        return False

    def cancel(self, session: "RaySession") -> None:
        with self.cond:
            for job in [j for j in self.queue if j.session is session]:
                self.queue.remove(job)
                job.future.cancel()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            for job in self.queue:
                job.future.cancel()
            self.queue.clear()
            self.cond.notify_all()
            busy = set(self.busy)
        # An actor still checking a dropped candidate (a stopped run) is killed; an idle one cleans up first.
        idle = [a for i, a in enumerate(self.actors) if a is not None and i not in busy]
        for i in busy:
            self.ray.kill(self.actors[i])
        try:
            self.ray.get([a.close.remote() for a in idle], timeout=30)
        except Exception as exc:  # noqa: BLE001 - a worker that cannot close is killed below anyway
            log.warning("closing the evaluation workers: %s", exc)
        for actor in idle:
            self.ray.kill(actor)
        for t in self.threads:
            t.join(timeout=5)


class RayExecutor:
    """Evaluation actors across a Ray cluster; everything else stays in this process (the driver).

    `address` is what `ray.init` takes: None joins the cluster `ray start` made on this machine (or $RAY_ADDRESS)
    and otherwise starts a local one; "auto" insists on an existing one; "HOST:6379" joins that head. When Ray is
    already initialised in this process (tests), that connection is used and left open on close.
    """

    def __init__(self, address: str | None = None, *, attempts: int = 3, placement_timeout_s: float = 120.0,
                 max_workers: int | None = None):
        try:
            import ray
        except ImportError:
            raise ExecutorError("the ray executor needs Ray on this machine and every worker: "
                                "pip install 'kernel-crucible[ray]'") from None
        self.ray = ray
        self.attempts, self.placement_timeout_s, self.max_workers = attempts, placement_timeout_s, max_workers
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            try:
                # Workers' output stays in the cluster's logs (/tmp/ray/session_latest/logs): the CLI owns the terminal.
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False,
                         include_dashboard=False, **_checkout_env())
            except Exception as exc:  # noqa: BLE001 - ConnectionError, a bad address, a version mismatch
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise ExecutorError(f"cannot join the Ray cluster at {address or 'this machine'}: {why}; start one "
                                    "with `ray start --head` or fix --address") from None
        resources = ray.cluster_resources()
        self.gpus, self.cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
        self.pools: dict[str, _Pool] = {}
        self._lock = threading.Lock()

    def session(self, task: Task, config: "RunConfig", workdir: Path) -> "RaySession":
        device = config.device
        if device == "auto":
            device = "cuda" if self.gpus else "cpu"
        if device == "cuda" and not self.gpus:
            raise ExecutorError("the Ray cluster has no GPUs; add GPU nodes (`ray start --address=...` on them) or "
                                "pass --device cpu to check correctness through Triton's interpreter")
        if device not in ("cpu", "cuda"):
            raise ExecutorError(f"unknown device {device!r}; use cpu or cuda")
        with self._lock:
            pool = self.pools.get(device)
            if pool is None:
                size = self.gpus if device == "cuda" else self.cpus
                if self.max_workers is not None:
                    size = min(size, self.max_workers)
                if size < 1:
                    raise ExecutorError("the Ray cluster has no CPU to run an evaluation worker on")
                pool = self.pools[device] = _Pool(device, size, attempts=self.attempts,
                                                  placement_timeout_s=self.placement_timeout_s)
        return RaySession(pool, task, config)

    @property
    def retried(self) -> list[tuple[str, str]]:
        """(candidate file, lost worker) of every evaluation retried after its worker died."""
        return [r for pool in self.pools.values() for r in pool.retried]

    def busy_actors(self) -> list[Any]:
        """Handles of the actors evaluating right now (a test kills one)."""
        return [pool.actors[i] for pool in self.pools.values() for i in list(pool.busy)]

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
        if self.owns_ray and self.ray.is_initialized():
            self.ray.shutdown()

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RaySession:
    def __init__(self, pool: _Pool, task: Task, config: "RunConfig"):
        self.pool, self.device, self.slots = pool, pool.device, max(pool.live, 1)
        self.task_fields = {"task_name": task.path.name, "task_hash": task.source_hash, "task_path": str(task.path),
                            "task_source": task.path.read_text(encoding="utf-8"),
                            "timeout_s": config.check_timeout_s, "baselines": list(config.baselines),
                            "constants": dict(getattr(config, "constants", None) or {}),
                            "rescale": bool(getattr(config, "rescale", True))}

    def submit(self, slot: int, candidate: Path, baselines: tuple[str, ...] | None = None,
               incumbent_ms: float | None = None, retime: bool = False) -> cf.Future:
        future: cf.Future = cf.Future()
        payload = {**self.task_fields, "candidate_name": candidate.name, "candidate_path": str(candidate),
                   "candidate_source": candidate.read_text(encoding="utf-8")}
        if baselines:
            payload["baselines"] = list(baselines)
        if incumbent_ms is not None:
            payload["incumbent_ms"] = incumbent_ms
        if retime:
            payload["retime"] = True
        self.pool.submit(_Job(payload, future, self))
        return future

    def reset(self, slot: int) -> None:
        pass  # a lost actor is replaced by the pool; an exception from the harness leaves its actor usable

    def close(self) -> None:
        self.pool.cancel(self)


def _checkout_env() -> dict[str, Any]:
    """Workers import crucible from their own installation; a driver run from a checkout that is not installed lends
    them its path (on nodes where that path exists: this machine, a shared file system)."""
    try:
        importlib.metadata.distribution("kernel-crucible")
        return {}
    except importlib.metadata.PackageNotFoundError:
        root = str(Path(__file__).resolve().parents[2])
        return {"runtime_env": {"env_vars": {"PYTHONPATH": f"{root}{os.pathsep}${{PYTHONPATH}}"}}}


def _last_line(exc: BaseException) -> str:
    """Ray's errors carry the worker's traceback; its last line names the cause (ModuleNotFoundError: ...)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _settle(future: cf.Future, *, result: Any = None, error: BaseException | None = None) -> None:
    """Resolve a job's future unless its run already dropped it (cancelled while queued)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except cf.InvalidStateError:
        pass
