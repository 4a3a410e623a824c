"""The staged harness: static → compile → smoke → correctness → robustness → timing.

The parent (this module) is trusted: it loads the task, computes expected outputs (in the task's dtype and in
float64) and compares. The candidate runs in a child forked from a warm zygote (sandbox.process), confined by
sandbox.policy, traced by sandbox.trace; the child never holds an expected output, and everything it sends back is
decoded with sandbox.wire, never unpickled.
"""
from __future__ import annotations

import logging
import math
import random
import secrets
import shutil
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import torch

from . import channel, cudaipc, pyparse, static, tolerance, wire
from .deadlines import BUDGETS, CompileSigns, Deadline
from .gate import GpuGate
from .process import REPO_ROOT, Child, ChildStopped, Zygote, ZygoteLost
from .records import CheckResult, ErrorInfo, Reason, Rejected, Stage, StageResult, Verdict
from .reference import Expected, Reference
from .task import Task, TaskError, load_task
from .timing_child import derive

log = logging.getLogger(__name__)
SEEDS_DIR = REPO_ROOT / "seeds"
# The soak's calls: (seconds of the candidate's time, most calls) by device, and the fewest. On the CPU interpreter a
# call costs milliseconds even at the smallest shape, so the soak stays short; on a GPU cheap calls run by hundreds.
SOAK_BUDGET_S = {"cpu": (0.2, 64), "cuda": (1.0, 2000)}
SOAK_MIN_CALLS = 3
# GPU memory the tensors lent to one child may pin (they stay alive until it is dead). Past it, outputs come back
# through host memory and inputs are no longer pinned: a task whose every call moves gigabytes (cross-entropy over a
# 128k vocabulary) must not run the parent out of memory. docs/threats.md names the residual risk.
COMPILE_ERRORS = {"CompilationError", "CompileTimeAssertionFailure", "OutOfResources", "UnsupportedLanguageConstruct",
                  "MLIRCompilationError", "PTXASError"}


@dataclass(frozen=True)
class CheckOptions:
    device: str = "auto"            # "cpu" | "cuda" | "auto"
    timing: bool = True             # the GPU timing stage (never on the CPU)
    timeout_s: float = 300.0        # wall clock per candidate
    seed: int | None = None         # hidden seed; None draws a fresh one
    gpu: int = 0                    # CUDA device index for the child
    baselines: tuple[str, ...] = ("eager",)
    timing_mode: str = "auto"       # "auto" (sustained when compute-bound) | "isolated" | "sustained"
    # Shared with the other checks on this GPU (sandbox/gate.py): their GPU work takes it shared, the timing stage
    # alone. Seconds spent waiting for it do not count against timeout_s.
    gate: GpuGate | None = None
    incumbent_ms: float | None = None  # the time to beat: timing races it (sandbox.timing_parent); None: no race

    def __post_init__(self) -> None:
        if self.incumbent_ms is not None and not (math.isfinite(self.incumbent_ms) and self.incumbent_ms > 0):
            raise ValueError(f"the incumbent's time must be a positive number of milliseconds, got {self.incumbent_ms}")


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}; use cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("no CUDA GPU is visible; use --device cpu to check correctness through Triton's interpreter")
    return device


@dataclass
class _Run:
    """One candidate's evaluation in progress."""
    task: Task
    candidate: Path
    options: CheckOptions
    child: Child
    deadline: float
    rng: random.Random
    stages: list[StageResult] = field(default_factory=list)
    stage_start: float = 0.0
    network_isolated: bool = False
    call_seconds: float = 0.0
    calls: int = 0
    laps: dict[str, float] = field(default_factory=dict)  # parent-side seconds by phase (where a check's time goes)
    # What the child is lent on a GPU (sandbox.cudaipc): alive until the child is dead, since a block freed earlier
    # could be reused for a reference while the child still maps it.
    lending: cudaipc.Lending = field(default_factory=lambda: cudaipc.Lending(0))
    stage: Stage = Stage.STATIC
    fresh_build: bool = True  # the next call is the first since the model was built: Triton compiles in it
    signs: CompileSigns | None = None  # when the parent last saw the candidate's process compile
    # id(reference) -> (the parent's wall time of the fastest call at its shape, the reference's time there)
    walls: dict[int, tuple[float, float]] = field(default_factory=dict)

    def within(self, what: str, reference: Reference | None = None, calls: int = 0) -> Deadline:
        """A request's deadline from the task (sandbox.deadlines), under the check's ceiling."""
        return Deadline(what, BUDGETS[self.device.split(":")[0]], time.monotonic(), self.deadline,
                        reference_s=reference.call_s if reference is not None else 0.0, calls=calls,
                        own_s=self.own_s(reference), signs=self.signs)

    def own_s(self, reference: Reference | None) -> float | None:
        """The candidate's time a call at `reference`'s shape: its fastest there, else the slowest of the shapes
        tried, scaled up by the ratio of the reference's times; None before its first call returned."""
        if id(reference) in self.walls:
            return self.walls[id(reference)][0]
        ref_s = reference.call_s if reference is not None else 0.0
        return max((wall * max(1.0, ref_s / r) if r > 0 else wall for wall, r in self.walls.values()), default=None)

    def timed_call(self, reference: Reference, wall: float) -> None:
        fastest = self.walls.get(id(reference), (wall, 0.0))[0]
        self.walls[id(reference)] = (min(fastest, wall), reference.call_s)

    @contextmanager
    def lap(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.laps[name] = self.laps.get(name, 0.0) + time.monotonic() - t0

    @property
    def device(self) -> str:
        """Where the parent draws inputs and runs references: the candidate's own GPU, or the CPU."""
        return f"cuda:{self.options.gpu}" if self.options.device == "cuda" else "cpu"


class Harness:
    """Keeps the warm zygote for one device; `check` evaluates one candidate against one task."""

    def __init__(self, device: str = "auto", *, workdir: str | Path | None = None):
        self.device = resolve_device(device)
        self.workdir = Path(workdir or REPO_ROOT / "runs" / "sandbox").resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.triton_shared = self.workdir / "triton-driver"  # Triton's own driver stub, built before any candidate runs
        self.triton_shared.mkdir(exist_ok=True)
        self._zygote_env = {"TRITON_INTERPRET": "1" if self.device == "cpu" else "0"}
        self.zygote = Zygote(self._zygote_env)
        self._tasks: dict[tuple[str, float], Task] = {}
        self._reapers: list[threading.Thread] = []

    def close(self) -> None:
        for reaper in self._reapers:
            reaper.join()
        self.zygote.close()

    def __enter__(self) -> "Harness":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- tasks ----------------------------------------------------------------------------------------------
    def load(self, task: str | Path | Task) -> Task:
        """The task at the size this device runs it: full size on the GPU, rescaled for the CPU interpreter."""
        if isinstance(task, Task):
            return task.scaled_for_cpu() if self.device == "cpu" else task
        path = Path(task).resolve()
        key = (str(path), path.stat().st_mtime if path.exists() else 0.0)
        if key not in self._tasks:
            loaded = load_task(path)
            self._tasks[key] = loaded.scaled_for_cpu() if self.device == "cpu" else loaded
        return self._tasks[key]

    # ---- the check ------------------------------------------------------------------------------------------
    def _ensure_zygote(self) -> None:
        """A fresh zygote in place of one that was lost (killed or stopped by a candidate, or wedged)."""
        if self.zygote.health() is not None:
            log.warning("starting a fresh sandbox worker process: the last one %s", self.zygote.health())
            self.zygote.close()
            self.zygote = Zygote(self._zygote_env)

    def check(self, task: str | Path | Task, candidate: str | Path, options: CheckOptions | None = None) -> CheckResult:
        """The verdict on one candidate. Whatever the candidate does, this returns a verdict (it raises only for the
        caller's own errors: a bad task, options for another device) within about options.timeout_s plus
        process.CLOSE_GRACE_S + process.CONTROL_TIMEOUT_S, plus any time spent waiting for options.gate."""
        options = options or CheckOptions()
        if options.device not in ("auto", self.device):
            raise ValueError(f"this harness runs on {self.device}; make another for {options.device}")
        self._ensure_zygote()  # before the clock starts: a restart is not the candidate's time
        start = time.monotonic()
        candidate = Path(candidate).resolve()
        task_obj = self.load(task)
        seed = options.seed if options.seed is not None else secrets.randbits(31)
        stages: list[StageResult] = []

        with open(candidate, "rb") as f:  # no more than the parser would look at
            source = f.read(4 * pyparse.MAX_SOURCE_CHARS + 4).decode("utf-8", errors="replace")
        t0 = time.monotonic()
        finding = static.check_source(source, candidate.name)
        if finding is not None:
            stages.append(StageResult(Stage.STATIC, False, finding.reason, finding.message,
                                      seconds=time.monotonic() - t0, details={"line": finding.line}))
            return self._result(task_obj, candidate, stages, start, None)
        stages.append(StageResult(Stage.STATIC, True, Reason.OK, seconds=time.monotonic() - t0))

        options = replace(options, device=self.device)
        t0 = time.monotonic()
        try:
            child = self._spawn(start + options.timeout_s)
        except ZygoteLost as exc:  # before any candidate code ran: not the candidate's doing
            stages.append(StageResult(Stage.COMPILE, False, Reason.HARNESS_ERROR,
                                      f"{exc}; the candidate's process could not be started, which says nothing "
                                      "about the candidate", seconds=time.monotonic() - t0))
            return self._result(task_obj, candidate, stages, start, None)
        run = _Run(task_obj, candidate, options, child, start + options.timeout_s, random.Random(seed), stages,
                   lending=cudaipc.Lending(_lending_cap(self.device)))
        run.signs = CompileSigns(self._scratch(child) / "triton", child.pid)
        run.laps["spawn"] = time.monotonic() - t0
        timing: dict[str, Any] | None = None
        try:
            reference = self._stage(run, Stage.COMPILE, self._compile)
            first = self._stage(run, Stage.SMOKE, self._smoke, reference)
            self._stage(run, Stage.CORRECTNESS, self._correctness, reference, first)
            self._stage(run, Stage.ROBUSTNESS, self._robustness, reference, first)
            first = None  # its float64 truth would pin cached device blocks the timing child needs (run W)
            if self.device == "cuda" and options.timing:
                with self._gpu(run, exclusive=True):
                    timing = self._stage(run, Stage.TIMING, self._timing, reference)
        except Rejected as rej:
            stages.append(replace(rej.result, seconds=time.monotonic() - run.stage_start))
            if rej.result.stage is Stage.TIMING:
                timing = rej.result.details.get("timing")
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            stages.append(StageResult(run.stage, False, Reason.HARNESS_ERROR,
                                      f"the harness ran out of GPU memory at the {run.stage.value} stage (the task's "
                                      "inputs, outputs and their float64 references did not fit beside what else "
                                      "runs on the GPU); this says nothing about the candidate: free the GPU or "
                                      "check the task at a smaller shape", seconds=time.monotonic() - run.stage_start))
        except Exception as exc:  # noqa: BLE001 - a verdict, never a traceback: the harness's own failure, named
            log.error("the harness failed at the %s stage of %s: %s: %s", run.stage.value, candidate.name,
                      type(exc).__name__, exc, exc_info=exc)
            stages.append(StageResult(run.stage, False, Reason.HARNESS_ERROR,
                                      f"the harness failed at the {run.stage.value} stage: {type(exc).__name__}: "
                                      f"{str(exc)[:500]}", seconds=time.monotonic() - run.stage_start,
                                      error=ErrorInfo.from_exception(exc)))
        finally:
            lost = self.zygote.health()  # what the candidate did to the zygote, before its process is ended
            with run.lap("close"):
                self._retire(child, run.lending)
            lost = lost or (child.zygote_lost.how if child.zygote_lost else None)
        if lost is not None:
            self._blame_for_zygote(run, lost)
        return self._result(task_obj, candidate, stages, start, timing, network_isolated=run.network_isolated,
                            run=run)

    def _spawn(self, deadline: float) -> Child:
        """The candidate's process; one retry with a fresh zygote if the warm one turns out lost."""
        try:
            return self.zygote.spawn(deadline)
        except ZygoteLost:
            self._ensure_zygote()
            return self.zygote.spawn(deadline)

    def _blame_for_zygote(self, run: _Run, how: str) -> None:
        """The zygote was lost while this candidate ran: nothing but the candidate's process could reach it, so the
        candidate is rejected whatever else it did (the next check starts a fresh zygote)."""
        message = (f"the sandbox's worker process {how} while the candidate's process ran; the candidate was "
                   "rejected (its process must not signal the process that started it)")
        failed = replace(run.stages[-1], passed=False, reason=Reason.SANDBOX_VIOLATION, message=message) \
            if run.stages and not run.stages[-1].passed else None
        if failed is not None:
            run.stages[-1] = failed
        else:
            run.stages.append(StageResult(run.stage, False, Reason.SANDBOX_VIOLATION, message))

    def bench(self, task: str | Path | Task, candidate: str | Path | None, *, baselines: tuple[str, ...] = ("eager",),
              gpu: int = 0, timeout_s: float = 600.0, timing_mode: str = "auto") -> dict[str, Any]:
        """The timing report of profiler.report for a candidate (checked first, every stage) or, with no candidate,
        for the baselines alone. A rejected candidate's report carries the rejection in `problems` and `check`."""
        if self.device != "cuda":
            raise ValueError("timing needs a CUDA GPU")
        options = CheckOptions(device="cuda", timing=True, gpu=gpu, baselines=tuple(baselines), timeout_s=timeout_s,
                               timing_mode=timing_mode)
        if candidate is not None:
            result = self.check(task, candidate, options)
            report = dict(result.timing or {"candidate_ms": None, "baselines": {}, "rows": [], "problems": []})
            if not result.accepted and not report.get("problems"):
                report["problems"] = [{"reason": result.reason.value, "message": result.message}]
            report["check"] = result.to_dict()
            return report
        from . import timing_parent
        task_obj = self.load(task)
        self._ensure_zygote()
        child = self.zygote.spawn()
        start = time.monotonic()
        run = _Run(task_obj, Path("-"), options, child, start + timeout_s, random.Random(secrets.randbits(31)),
                   lending=cudaipc.Lending(_lending_cap(self.device)))
        try:
            reference = Reference(task_obj, run.device, run.rng.randrange(1 << 31))
            scratch = self._scratch(child)
            self._request(run, Stage.TIMING, self._setup_msg(run, None, reference, scratch))
            return timing_parent.measure(self, run, reference, candidate=False)
        except Rejected as rej:
            return {"candidate_ms": None, "baselines": {}, "rows": [],
                    "problems": [{"reason": rej.result.reason.value, "message": rej.result.message}]}
        finally:
            child.close(graceful=True)
            self._clean(child)

    def _stage(self, run: _Run, stage: Stage, fn, *args: Any) -> Any:
        run.stage, run.stage_start = stage, time.monotonic()
        value, details = fn(run, *args)
        run.stages.append(StageResult(stage, True, Reason.OK, seconds=time.monotonic() - run.stage_start,
                                      details=details))
        return value

    @contextmanager
    def _gpu(self, run: _Run, exclusive: bool = False) -> Iterator[None]:
        """The GPU for work of this check, through its gate (CheckOptions.gate) when it has one: shared with the
        other checks on the GPU, or alone for the timing stage. The wait moves the check's deadline back."""
        gate = run.options.gate
        if gate is None or (not exclusive and run.stage is Stage.TIMING):  # the timing stage holds it already
            yield
            return
        with (gate.exclusive if exclusive else gate.shared)(run.candidate.name) as waited:
            run.deadline += waited
            lap = "timing_wait" if exclusive else "gpu_wait"
            run.laps[lap] = run.laps.get(lap, 0.0) + waited
            yield

    def _request(self, run: _Run, stage: Stage, msg: dict[str, Any], max_bytes: int = 1 << 30,
                 within: Deadline | None = None) -> dict[str, Any]:
        """The child's reply, by `within` (a deadline from the task) and never past the check's ceiling."""
        # The first call after a build compiles the candidate's kernels (CPU work in its process) and runs each once:
        # it takes no turn at the gate, so compiling overlaps another candidate's timing. Setup (the CUDA context,
        # the import) likewise; every other call, rebuild and soak runs the candidate's kernels and takes its turn.
        op = msg.get("op")
        ungated = op == "setup" or (op == "call" and run.fresh_build)
        run.fresh_build = op in ("setup", "rebuild")
        with nullcontext() if ungated else self._gpu(run):
            if within is not None:  # the deadline counts from the turn at the gate, under the moved ceiling
                within.start, within.ceiling = time.monotonic(), run.deadline
            return self._request_child(run, stage, msg, max_bytes, within)

    def _request_child(self, run: _Run, stage: Stage, msg: dict[str, Any], max_bytes: int,
                       within: Deadline | None) -> dict[str, Any]:
        try:
            reply = run.child.request(msg, within if within is not None else run.deadline, max_bytes)
        except ZygoteLost as exc:
            run.child.close(graceful=False)
            raise Rejected(stage, Reason.SANDBOX_VIOLATION, f"{exc} while the candidate's process ran; the candidate "
                          "was rejected (its process must not signal the process that started it)") from None
        except ChildStopped:
            run.child.close(graceful=False)
            raise Rejected(stage, Reason.SANDBOX_VIOLATION, "the candidate's process stopped itself (SIGSTOP) and "
                          "would never answer; it was killed") from None
        except channel.ChannelTimeout:
            run.child.close(graceful=False)
            if within is not None and not within.by_ceiling:
                raise Rejected(stage, Reason.TIMEOUT, f"{within.describe()}; its process group was killed",
                              details={"deadline_s": within() - within.start, "request": within.what,
                                       "reference_s": within.reference_s, "calls": within.calls}) from None
            raise Rejected(stage, Reason.TIMEOUT, f"the candidate did not finish within {run.options.timeout_s:.0f} s "
                          "(the check's ceiling, --timeout; its process group was killed)") from None
        except channel.ChannelClosed:
            run.child.close(graceful=False)
            how = run.child.describe_exit()
            reason = Reason.TIMEOUT if "SIGXCPU" in how else Reason.CRASH
            tail = run.child.output_tail()
            last = tail.strip().splitlines()[-1] if tail.strip() else ""
            raise Rejected(stage, reason, f"the candidate's process {how}" + (f": {last}" if last else ""),
                          details={"output_tail": tail}) from None
        except wire.WireError as exc:
            run.child.close(graceful=False)
            raise Rejected(stage, Reason.SANDBOX_VIOLATION,
                          f"the candidate's process sent a malformed reply: {exc}") from None
        if not reply.get("ok"):
            raise self._reject_from_reply(stage, reply, run)
        return reply

    def _reject_from_reply(self, stage: Stage, reply: dict[str, Any], run: _Run) -> Rejected:
        try:
            reason = Reason(reply.get("reason"))
        except ValueError:
            reason = Reason.RUNTIME_ERROR
        err = reply.get("error")
        error = ErrorInfo(str(err.get("type")), str(err.get("message")), str(err.get("traceback"))) \
            if isinstance(err, dict) else None
        if error is not None and error.type in COMPILE_ERRORS:
            stage, reason = Stage.COMPILE, Reason.COMPILE_ERROR
        details = {"trace": reply["trace"]} if isinstance(reply.get("trace"), dict) else {}
        tail = run.child.output_tail(2000)
        if tail:
            details["output_tail"] = tail
        return Rejected(stage, reason, str(reply.get("message", ""))[:4000], error=error, details=details)

    # ---- stages ---------------------------------------------------------------------------------------------
    def _compile(self, run: _Run) -> tuple[Reference, dict[str, Any]]:
        t0 = time.monotonic()
        reference = Reference(run.task, run.device, run.rng.randrange(1 << 31))
        reference_s = time.monotonic() - t0
        msg = self._setup_msg(run, str(run.candidate), reference, self._scratch(run.child))
        reply = self._request(run, Stage.COMPILE, msg, within=run.within("the setup (import and ModelNew(...))"))
        run.network_isolated = bool(reply.get("network_isolated"))
        laps = reply.get("laps") if isinstance(reply.get("laps"), dict) else {}
        return reference, {"network_isolated": run.network_isolated, "reference_s": reference_s,
                           "filesystem_read_only": bool(reply.get("filesystem_read_only")),
                           "capabilities_dropped": bool(reply.get("capabilities_dropped")),
                           "walls": reply.get("walls") if isinstance(reply.get("walls"), dict) else {}, **laps}

    def _retire(self, child: Child, lending: cudaipc.Lending) -> None:
        """End the child and remove its scratch directory. On the CPU, at once; on a GPU, where a process takes a
        quarter of a second to give its context back, on a thread the next check does not wait for (the tensors the
        child mapped stay alive until it is dead; `close` joins every such thread)."""
        def reap() -> None:
            child.close(graceful=True)
            self._clean(child)
            lending.release()

        self._reapers = [r for r in self._reapers if r.is_alive()]
        if self.device != "cuda":
            reap()
            return
        reaper = threading.Thread(target=reap, name=f"crucible-reap-{child.pid}", daemon=True)
        reaper.start()
        self._reapers.append(reaper)

    def _scratch(self, child: Child) -> Path:
        """A fresh directory per candidate: its only writable place, Triton's cache included (a shared cache would
        let one candidate plant compiled kernels for the next)."""
        scratch = self.workdir / f"scratch-{child.pid}"
        (scratch / "triton").mkdir(parents=True, exist_ok=True)
        return scratch

    def _clean(self, child: Child) -> None:
        shutil.rmtree(self.workdir / f"scratch-{child.pid}", ignore_errors=True)

    def _setup_msg(self, run: _Run, candidate: str | None, reference: Reference, scratch: Path) -> dict[str, Any]:
        return {
            "op": "setup", "candidate": candidate, "seeds_dir": str(SEEDS_DIR), "device": self.device,
            "gpu": run.options.gpu, "scratch": str(scratch), "write_roots": [str(scratch)],
            "triton_cache": str(scratch / "triton"), "triton_shared": str(self.triton_shared),
            "cpu_seconds": int(max(60, 4 * run.options.timeout_s)),
            "allow_compute": run.task.meta.allow_torch_compute, "seed": reference.model_seed,
            "init_inputs": reference.init_inputs(), "state_dict": reference.state_dict(),
        }

    def _call(self, run: _Run, stage: Stage, reference: Reference, inputs: list[Any],
              expected: Expected | None = None) -> tuple[dict[str, Any], Expected]:
        if expected is None:
            with run.lap("reference"), self._gpu(run):
                expected = reference.run(inputs)
        used: set[int] = set()
        msg: dict[str, Any] = {"op": "call", "inputs": run.lending.ship(inputs, used)[0]}
        buffers: list[torch.Tensor | None] = []
        if run.device != "cpu":
            # Outputs come back into lent buffers on the GPU (no trip through host memory).
            msg["out_buffers"], buffers = run.lending.ship([_poisoned(r) for r in expected.ref], used)
        within = run.within(f"the {stage.value} call", reference, calls=1)
        with run.lap("request"):
            reply = self._request(run, stage, msg, max_bytes=4 * expected.nbytes + (1 << 24), within=within)
        run.timed_call(reference, time.monotonic() - within.start)
        run.calls += 1
        run.call_seconds += float(reply.get("seconds") or 0.0)
        outs = _claim(reply.get("outputs"), buffers)
        if not isinstance(outs, list) or not all(isinstance(t, torch.Tensor) for t in outs):
            raise Rejected(stage, Reason.OUTPUT_TYPE, "the candidate's outputs could not be read back")
        # Outputs that came back by value (past the lending cap) go where the reference's are, so that every comparison
        # (including two calls' bits in the robustness stage, one from each path) sees one device.
        outs = reply["outputs"] = [o if o.device == r.device else o.to(r.device)
                                   for o, r in zip(outs, expected.ref)] + outs[len(expected.ref):]
        if len(outs) != len(expected.ref) or reply.get("structure") != expected.structure:
            raise Rejected(stage, Reason.OUTPUT_SHAPE,
                          f"the candidate returned {len(outs)} output(s) as a {reply.get('structure')}; "
                          f"the reference returns {len(expected.ref)} as a {expected.structure}")
        for i, (got, ref, strides) in enumerate(zip(outs, expected.ref, reply.get("strides", []))):
            if got.shape != ref.shape:
                raise Rejected(stage, Reason.OUTPUT_SHAPE,
                              f"output {i} has shape {list(got.shape)}, expected {list(ref.shape)}")
            if got.dtype != ref.dtype:
                raise Rejected(stage, Reason.OUTPUT_DTYPE, f"output {i} has dtype {got.dtype}, expected {ref.dtype}")
            if ref.is_contiguous() and not _contiguous(list(got.shape), list(strides)):
                raise Rejected(stage, Reason.OUTPUT_SHAPE, f"output {i} has strides {strides}, expected contiguous "
                              f"{list(ref.stride())}")
        return reply, expected

    def _compare(self, run: _Run, stage: Stage, outs: list[torch.Tensor], expected: Expected, label: str) -> None:
        meta = run.task.meta
        for i, got in enumerate(outs):
            truth = expected.truth[i] if expected.truth is not None else None
            with run.lap("compare"), self._gpu(run):
                mismatch = tolerance.compare(f"output {i}", got.to(expected.ref[i].device), expected.ref[i], truth,
                                             allow_tf32=meta.allow_tf32, scale=meta.tolerance_scale,
                                             alternates=expected.alternates_for(i))
            if mismatch is not None:
                # NaN/Inf where the reference has none (or the reverse) is named as such: the clearest signal of
                # unwritten or uninitialised output.
                reason = Reason.NONFINITE_MISMATCH if mismatch.first_nonfinite_diff is not None \
                    else Reason.OUTPUT_MISMATCH
                raise Rejected(stage, reason, f"wrong result on {label}:\n{mismatch.describe()}", mismatch=mismatch,
                              details={"inputs": label})

    def _smoke(self, run: _Run, reference: Reference) -> tuple[dict[str, Any], dict[str, Any]]:
        seed = run.rng.randrange(1 << 31)
        with run.lap("inputs"), self._gpu(run):
            inputs = run.task.make_inputs(seed, run.task.meta.distributions[0], run.device)
        reply, expected = self._call(run, Stage.SMOKE, reference, inputs)
        first = {"inputs": inputs, "outputs": reply["outputs"], "expected": expected,
                 "label": f"{run.task.meta.distributions[0]} inputs"}
        return first, {"trace": reply.get("trace"), "seconds": reply.get("seconds")}

    def _correctness(self, run: _Run, reference: Reference, first: dict[str, Any]) -> tuple[None, dict[str, Any]]:
        self._compare(run, Stage.CORRECTNESS, first["outputs"], first["expected"], first["label"])
        checked = [run.task.meta.distributions[0]]
        rest = list(run.task.meta.distributions[1:])
        run.rng.shuffle(rest)  # no fixed order of calls to count on
        for dist in rest:
            with run.lap("inputs"), self._gpu(run):
                inputs = run.task.make_inputs(run.rng.randrange(1 << 31), dist, run.device)
            reply, expected = self._call(run, Stage.CORRECTNESS, reference, inputs)
            self._compare(run, Stage.CORRECTNESS, reply["outputs"], expected, f"{dist} inputs")
            checked.append(dist)
        return None, {"distributions": checked}

    def _robustness(self, run: _Run, reference: Reference, first: dict[str, Any]) -> tuple[None, dict[str, Any]]:
        # Repeat the first call on the same values at fresh addresses: a deterministic op must agree bitwise.
        reply, _ = self._call(run, Stage.ROBUSTNESS, reference, first["inputs"], first["expected"])
        for i, (a, b) in enumerate(zip(first["outputs"], reply["outputs"])):
            if run.task.meta.deterministic and not torch.equal(_bits(a), _bits(b)):
                diff = int((_bits(a) != _bits(b)).sum())
                raise Rejected(Stage.ROBUSTNESS, Reason.NONDETERMINISTIC, f"output {i} differs between two runs on the "
                              f"same inputs in {diff} of {a.numel()} elements (a race or an uninitialised read?)")
        self._compare(run, Stage.ROBUSTNESS, reply["outputs"], first["expected"], "a repeat of the first inputs")
        shapes = []
        variants = run.task.shape_variants()
        run.rng.shuffle(variants)
        tried = [(float(reply.get("seconds") or 0.0), run.task, reference)]  # the soak takes the cheapest shape
        for variant in variants:
            vtask = run.task.with_constants(variant)
            vref = Reference(vtask, run.device, reference.model_seed)
            with run.lap("rebuild"):
                self._request(run, Stage.ROBUSTNESS, {"op": "rebuild", "init_inputs": vref.init_inputs(),
                                                      "state_dict": vref.state_dict(),
                                                      "seed": reference.model_seed},
                              within=run.within("the rebuild at a new shape"))
            with run.lap("inputs"), self._gpu(run):
                inputs = vtask.make_inputs(run.rng.randrange(1 << 31), "normal", run.device)
            reply, expected = self._call(run, Stage.ROBUSTNESS, vref, inputs)
            label = "shape " + ", ".join(f"{k}={v}" for k, v in variant.items())
            self._compare(run, Stage.ROBUSTNESS, reply["outputs"], expected, label)
            shapes.append(variant)
            tried.append((float(reply.get("seconds") or 0.0), vtask, vref))
        seconds, soak_task, soak_ref = min(tried, key=lambda t: t[0])
        if soak_ref is not tried[-1][2]:
            with run.lap("rebuild"):
                self._request(run, Stage.ROBUSTNESS, {"op": "rebuild", "init_inputs": soak_ref.init_inputs(),
                                                      "state_dict": soak_ref.state_dict(),
                                                      "seed": reference.model_seed},
                              within=run.within("the rebuild at the soak's shape"))
        soak = self._soak(run, soak_task, soak_ref, seconds)
        return None, {"shapes": shapes, "repeat_bitwise": run.task.meta.deterministic, "soak": soak}

    def _soak(self, run: _Run, task: Task, reference: Reference, seconds: float) -> dict[str, Any]:
        """Many calls back to back at the model's current shape (the cheapest tried), on fresh inputs: a number
        drawn log-uniformly up to what SOAK_BUDGET_S allows at this call's time, so a kernel that turns to a stored
        output after its first N calls cannot know N's safe value. The last call and one other drawn at random are
        verified here; the child checks every call as any other (trace, state), and cannot tell which are verified."""
        n = soak_length(run.rng, seconds, run.device.split(":")[0])
        checked = sorted({n - 1} | set(run.rng.sample(range(n - 1), 1)))  # each costs a reference and a compare
        dists = task.meta.distributions
        with run.lap("inputs"), self._gpu(run):
            base = [task.make_inputs(run.rng.randrange(1 << 31), dist, run.device)
                    for dist in (dists[0], run.rng.choice(dists))]
        expected = []
        for k in checked:
            with run.lap("reference"), self._gpu(run):
                expected.append(reference.run(derive(base, k, task.meta.fixed_inputs)))
        used: set[int] = set()
        msg = {"op": "soak", "base": [run.lending.ship(b, used)[0] for b in base], "n": n, "checked": checked,
               "fixed": list(task.meta.fixed_inputs)}
        within = run.within(f"the soak of {n} calls", reference, calls=n)
        with run.lap("soak"):
            reply = self._request(run, Stage.ROBUSTNESS, msg, max_bytes=4 * sum(e.nbytes for e in expected) + (1 << 24),
                                  within=within)
        run.calls += n
        run.call_seconds += float(reply.get("seconds") or 0.0)
        outs = reply.get("outputs")
        per = len(expected[0].ref)
        if not isinstance(outs, list) or len(outs) != per * len(checked) or \
                not all(isinstance(t, torch.Tensor) for t in outs) or reply.get("structure") != expected[0].structure:
            raise Rejected(Stage.ROBUSTNESS, Reason.OUTPUT_SHAPE, f"the candidate's outputs over {n} calls in a row "
                          "did not come back as its single calls' did")
        for j, (k, exp) in enumerate(zip(checked, expected)):
            got = outs[j * per:(j + 1) * per]
            for i, (g, r) in enumerate(zip(got, exp.ref)):
                if g.shape != r.shape or g.dtype != r.dtype:
                    raise Rejected(Stage.ROBUSTNESS, Reason.OUTPUT_SHAPE, f"call {k + 1} of {n} in a row: output {i} "
                                  f"is {list(g.shape)} {g.dtype}, expected {list(r.shape)} {r.dtype}")
            self._compare(run, Stage.ROBUSTNESS, [g.to(r.device) for g, r in zip(got, exp.ref)], exp,
                          f"call {k + 1} of {n} in a row (fresh inputs each call)")
        return {"calls": n, "verified": len(checked)}

    def _timing(self, run: _Run, reference: Reference) -> tuple[dict[str, Any], dict[str, Any]]:
        from . import timing_parent
        if self.device == "cuda":  # the correctness stages' cached blocks (float64 truths) go back to the driver,
            torch.cuda.empty_cache()  # for the child's input sets, baselines and held outputs
        return timing_parent.run(self, run, reference)

    # ---- the verdict ----------------------------------------------------------------------------------------
    def _result(self, task: Task, candidate: Path, stages: list[StageResult], start: float,
                timing: dict[str, Any] | None, network_isolated: bool = False,
                run: _Run | None = None) -> CheckResult:
        last = stages[-1]
        accepted = all(s.passed for s in stages)
        if accepted:
            message = "accepted: correct on every input distribution and shape tried"
            eager = ((timing or {}).get("baselines") or {}).get("eager") or {}
            if eager.get("speedup") is not None:
                message += (f"; {eager['speedup']:.2f}x eager [{eager['ci_low']:.2f}, {eager['ci_high']:.2f}] "
                            f"({eager['verdict']})")
            message += "" if timing else " (not timed)"
        else:
            message = last.message
        return CheckResult(
            task=str(task.path), candidate=str(candidate), device=self.device,
            verdict=Verdict.ACCEPTED if accepted else Verdict.REJECTED, stage=last.stage,
            reason=Reason.OK if accepted else last.reason, message=message, stages=tuple(stages),
            seconds=time.monotonic() - start, timed=timing is not None, timing=timing,
            environment={"device": self.device, "torch": torch.__version__, "triton": _triton_version(),
                         "network_isolated": network_isolated, "constants": task.current_constants()},
            costs=self._costs(stages, run, time.monotonic() - start),
        )

    @staticmethod
    def _costs(stages: list[StageResult], run: _Run | None, total: float) -> dict[str, float]:
        timing_s = sum(s.seconds for s in stages if s.stage is Stage.TIMING)
        calls_s = run.call_seconds if run else 0.0
        laps = {f"{k}_s": v for k, v in (run.laps if run else {}).items()}
        return {"total_s": total, "candidate_calls_s": calls_s, "calls": float(run.calls if run else 0),
                "timing_stage_s": timing_s, "harness_s": max(0.0, total - calls_s - timing_s), **laps}


def soak_length(rng: random.Random, seconds: float, device: str) -> int:
    """The soak's number of calls: log-uniform between SOAK_MIN_CALLS and what the device's budget allows at
    `seconds` a call."""
    budget, cap = SOAK_BUDGET_S[device]
    most = max(SOAK_MIN_CALLS, min(cap, int(budget / max(seconds, 1e-6))))
    return int(round(math.exp(rng.uniform(math.log(SOAK_MIN_CALLS), math.log(most)))))


def check(task: str | Path, candidate: str | Path, options: CheckOptions | None = None) -> CheckResult:
    """One-shot: start a harness, check one candidate, stop it."""
    options = options or CheckOptions()
    with Harness(options.device) as harness:
        return harness.check(task, candidate, options)


def _poisoned(ref: torch.Tensor) -> torch.Tensor | None:
    """A contiguous buffer like `ref`, every byte 0xFF (NaN in every float format, -1 in every integer one): where the
    child writes nothing, the comparison says so. None for bool outputs, which have no such pattern (they travel by
    value)."""
    if ref.dtype == torch.bool or ref.is_complex():
        return None
    buf = torch.empty_like(ref, memory_format=torch.contiguous_format)
    if buf.numel():
        buf.reshape(-1).view(torch.uint8).fill_(0xFF)
    return buf


def _claim(outs: Any, buffers: list[torch.Tensor | None]) -> Any:
    """The reply's outputs with each {"__gpu_buffer__": i} the child put at position i replaced by a copy of our
    buffer i (a copy: the child maps the buffer until it is dead). Anything else forged stays as it is and fails the
    output-type check."""
    if not isinstance(outs, list):
        return outs
    claimed = []
    for i, o in enumerate(outs):
        if isinstance(o, dict) and set(o) == {"__gpu_buffer__"}:
            buf = buffers[i] if o["__gpu_buffer__"] == i and i < len(buffers) else None
            if buf is None:
                return None
            claimed.append(buf.clone())
        else:
            claimed.append(o)
    return claimed


def _lending_cap(device: str) -> int:
    """Bytes of GPU memory one child may be lent (staging copies of its inputs and output buffers, reused call after
    call): a quarter of the device, at least 8 GiB. Past it, tensors travel by value through host memory."""
    if device != "cuda":
        return 0
    return max(8 << 30, torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory // 4)


def _contiguous(shape: list[int], strides: list[int]) -> bool:
    """Row-major contiguity as torch defines it: the strides of size-1 dimensions do not matter."""
    if len(shape) != len(strides):
        return False
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _bits(t: torch.Tensor) -> torch.Tensor:
    kind = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(kind)


def _triton_version() -> str:
    import triton
    return triton.__version__
