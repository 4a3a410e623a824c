"""The staged harness: static → compile → smoke → correctness → robustness → timing.

The parent (this module, and the stage runners of sandbox.stage_runners it calls) is trusted: it loads the task,
computes expected outputs (in the task's dtype and in float64) and compares. This module orchestrates a check: the
warm zygote, the candidate's process, its requests and their deadlines, the stages in order and the verdict.
The candidate runs in a child forked from a warm zygote (sandbox.process), confined by sandbox.policy, traced by
sandbox.trace; the child never holds an expected output, and everything it sends back is decoded with sandbox.wire,
never unpickled.
"""
from __future__ import annotations

import logging
import math
import random
import secrets
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import torch

from . import channel, compiled, cudaipc, pyparse, stage_runners, static, verdict, wire
from .deadlines import BUDGETS, CompileSigns, Deadline
from .device import interpreter_fault, resolve_device
from .gate import GpuGate
from .process import REPO_ROOT, Child, ChildStopped, Zygote, ZygoteLost, child_view
from .records import (GPU_FULL, GPU_FULL_HARNESS, CheckResult, ErrorInfo, Reason, Rejected, Stage,
                      StageResult)
from .reference import Reference
from .task import Task, load_task

log = logging.getLogger(__name__)
SEEDS_DIR = REPO_ROOT / "seeds"
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
    # A re-time of a source an earlier check verified in full (a duel's leg): its first call is compared and it is
    # timed, whose sampled calls are validated as ever; the other distributions, shapes and the soak are not re-run.
    retime: bool = False
    warm: bool | None = None  # the robustness shapes compiled ahead in a second process (sandbox.warmer); None: auto

    def __post_init__(self) -> None:
        if self.incumbent_ms is not None and not (math.isfinite(self.incumbent_ms) and self.incumbent_ms > 0):
            raise ValueError(f"the incumbent's time must be a positive number of milliseconds, got {self.incumbent_ms}")


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
    source: str = ""  # the candidate's file as the parent read and decoded it: what the static stage saw and the
    # child runs
    source_key: str = ""  # what its verified kernels are kept under (sandbox.compiled)
    kept_files: int = 0  # the files of its Triton cache kept for its later checks (verified only)
    warmer: Any = None  # its second process compiling the robustness shapes ahead (sandbox.warmer), if any
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
        self._variants: dict[int, tuple[Task, list[tuple[dict[str, int], Task]]]] = {}
        self._scaled: dict[int, tuple[Task, Task]] = {}  # id(task) -> (task, the task rescaled for the CPU)
        self._reapers: list[threading.Thread] = []
        self._streams: dict[int, torch.cuda.Stream] = {}

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
            if self.device != "cpu":
                return task
            hit = self._scaled.get(id(task))  # one rescaled task per task: its robustness shapes are worked out once
            if hit is None or hit[0] is not task:
                hit = self._scaled[id(task)] = (task, task.scaled_for_cpu())
            return hit[1]
        path = Path(task).resolve()
        key = (str(path), path.stat().st_mtime if path.exists() else 0.0)
        if key not in self._tasks:
            loaded = load_task(path)
            self._tasks[key] = loaded.scaled_for_cpu() if self.device == "cpu" else loaded
            try:  # the robustness shapes too (seconds: each is tried on the meta device), once, off every check's clock
                self._variant_tasks(self._tasks[key])
            except Exception:  # noqa: BLE001 - the robustness stage meets it again and names it in its verdict
                pass
        return self._tasks[key]

    def _variant_tasks(self, task: Task) -> list[tuple[dict[str, int], Task]]:
        """The task at each of its robustness shapes (Task.shape_variants), worked out once per task: a warm harness
        checks candidate after candidate of the same task."""
        hit = self._variants.get(id(task))
        if hit is None or hit[0] is not task:
            hit = self._variants[id(task)] = (task, [(v, task.with_constants(v)) for v in task.shape_variants()])
        return list(hit[1])

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
        task_obj = self.load(task)  # likewise the task's own preparation, done once for every candidate
        start = time.monotonic()
        candidate = Path(candidate).resolve()
        seed = options.seed if options.seed is not None else secrets.randbits(31)
        stages: list[StageResult] = []

        with open(candidate, "rb") as f:  # no more than the parser would look at (a longer file fails the static stage)
            raw = f.read(4 * pyparse.MAX_SOURCE_CHARS + 4)
        source = raw.decode("utf-8", errors="replace")
        t0 = time.monotonic()
        finding = static.check_source(source, candidate.name)
        if finding is not None:
            stages.append(StageResult(Stage.STATIC, False, finding.reason, finding.message,
                                      seconds=time.monotonic() - t0, details={"line": finding.line}))
            return verdict.assemble(self.device, task_obj, candidate, stages, start, None)
        stages.append(StageResult(Stage.STATIC, True, Reason.OK, seconds=time.monotonic() - t0))

        options = replace(options, device=self.device)
        t0 = time.monotonic()
        try:
            child = self._spawn(start + options.timeout_s)
        except ZygoteLost as exc:  # before any candidate code ran: not the candidate's doing
            stages.append(StageResult(Stage.COMPILE, False, Reason.HARNESS_ERROR,
                                      f"{exc}; the candidate's process could not be started, which says nothing "
                                      "about the candidate", seconds=time.monotonic() - t0))
            return verdict.assemble(self.device, task_obj, candidate, stages, start, None)
        run = _Run(task_obj, candidate, options, child, start + options.timeout_s, random.Random(seed), stages,
                   lending=cudaipc.Lending(cudaipc.lending_cap(self.device)))
        run.signs = CompileSigns(self._scratch(child) / "triton", child.pid)
        run.source = source
        run.source_key = compiled.check_key(raw, str(task_obj.path), dict(task_obj.overrides), self.device)
        run.laps["spawn"] = time.monotonic() - t0
        timing: dict[str, Any] | None = None
        with self._parent_stream(run):  # this check's parent-side GPU work, ordered apart from other checks'
            try:
                reference = self._stage(run, Stage.COMPILE, stage_runners.compile_candidate)
                first = self._stage(run, Stage.SMOKE, stage_runners.smoke, reference)
                self._stage(run, Stage.CORRECTNESS, stage_runners.correctness, reference, first)
                if not options.retime:
                    self._stage(run, Stage.ROBUSTNESS, stage_runners.robustness, reference, first)
                first = None  # its float64 truth would pin cached blocks the timing child needs (seen on the H200)
                if self.device == "cuda" and options.timing:  # takes the gate alone only while the child times
                    timing = self._stage(run, Stage.TIMING, stage_runners.timing, reference)
            except Rejected as rej:
                stages.append(replace(rej.result, seconds=time.monotonic() - run.stage_start))
                if rej.result.stage is Stage.TIMING:
                    timing = rej.result.details.get("timing")
            except torch.OutOfMemoryError:
                message = cudaipc.full_gpu_message(run.stage.value, run.device)
                torch.cuda.empty_cache()
                stages.append(StageResult(run.stage, False, Reason.HARNESS_ERROR, message,
                                          seconds=time.monotonic() - run.stage_start,
                                          details={GPU_FULL: GPU_FULL_HARNESS}))
            except Exception as exc:  # noqa: BLE001 - a verdict, never a traceback: the harness's own failure, named
                log.error("the harness failed at the %s stage of %s: %s: %s", run.stage.value, candidate.name,
                          type(exc).__name__, exc, exc_info=exc)
                stages.append(StageResult(
                    run.stage, False, Reason.HARNESS_ERROR,
                    f"the harness failed at the {run.stage.value} stage: {type(exc).__name__}: {str(exc)[:500]}",
                    seconds=time.monotonic() - run.stage_start, error=ErrorInfo.from_exception(exc)))
            finally:
                lost = self.zygote.health()  # what the candidate did to the zygote, before its process is ended
                if lost is None:
                    self._keep_compiled(run)
                with run.lap("close"):
                    self._retire(run)
                lost = lost or (child.zygote_lost.how if child.zygote_lost else None)
        if lost is not None:
            self._blame_for_zygote(run, lost)
        return verdict.assemble(self.device, task_obj, candidate, stages, start, timing,
                                network_isolated=run.network_isolated, run=run)

    def _keep_compiled(self, run: _Run) -> None:
        """A verified candidate's kernels, kept for its own later checks (sandbox.compiled): read from its process's
        own view of its cache while that process is alive."""
        if all(s.passed for s in run.stages) and run.stages[-1].stage in (Stage.ROBUSTNESS, Stage.TIMING):
            with run.lap("keep_compiled"):
                run.kept_files = compiled.STORE.keep(run.source_key, compiled.read_cache(
                    child_view(run.child.pid, self._scratch(run.child) / "triton")))

    def _spawn(self, deadline: float, beside: int | None = None) -> Child:
        """The candidate's process (`beside`: another of its processes, sharing that one's bounds); one retry with a
        fresh zygote if the warm one turns out lost."""
        try:
            return self.zygote.spawn(deadline, beside)
        except ZygoteLost:
            self._ensure_zygote()
            return self.zygote.spawn(deadline, beside)

    def _blame_for_zygote(self, run: _Run, how: str) -> None:
        """The zygote was lost while this candidate ran: nothing but the candidate's process could reach it, so the
        candidate is rejected whatever else it did (the next check starts a fresh zygote)."""
        message = (f"the sandbox's worker process {how} while the candidate's process ran; the candidate was "
                   "rejected (its process must not signal the process that started it)")
        if run.stages and not run.stages[-1].passed:
            run.stages[-1] = replace(run.stages[-1], passed=False, reason=Reason.SANDBOX_VIOLATION, message=message)
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
                   lending=cudaipc.Lending(cudaipc.lending_cap(self.device)))
        try:
            reference = Reference(task_obj, run.device, run.rng.randrange(1 << 31), gate=options.gate)
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
        value, details = fn(self, run, *args)
        run.stages.append(StageResult(stage, True, Reason.OK, seconds=time.monotonic() - run.stage_start,
                                      details=details))
        return value

    def _parent_stream(self, run: _Run):
        """A CUDA stream of this harness's own for the parent's work of a check (inputs, references, comparisons,
        staging copies): several harnesses in one process (a GPU's check slots, as threads) then queue their work
        apart, and a synchronisation waits for this check's work alone, not for every slot's."""
        if self.device != "cuda":
            return nullcontext()
        if run.options.gpu not in self._streams:
            self._streams[run.options.gpu] = torch.cuda.Stream(device=run.device)
        return torch.cuda.stream(self._streams[run.options.gpu])

    @contextmanager
    def _gpu(self, run: _Run, exclusive: bool = False, work: str = "") -> Iterator[None]:
        """The GPU for `work` of this check, through its gate (CheckOptions.gate) when it has one: shared with the
        other checks on the GPU, or alone for the timing stage. The wait moves the check's deadline back."""
        gate = run.options.gate
        if gate is None:
            yield
            return
        with (gate.exclusive if exclusive else gate.shared)(run.candidate.name, work) as waited:
            run.deadline += waited
            lap = "timing_wait" if exclusive else "gpu_wait"
            run.laps[lap] = run.laps.get(lap, 0.0) + waited
            yield

    def _request(self, run: _Run, stage: Stage, msg: dict[str, Any], max_bytes: int = 1 << 30,
                 within: Deadline | None = None, exclusive: bool = False) -> dict[str, Any]:
        """The child's reply, by `within` (a deadline from the task) and never past the check's ceiling; with
        `exclusive`, the GPU's gate is held alone while the child works (the timing's measurement)."""
        # The first call after a build compiles the candidate's kernels (CPU work in its process) and runs each once:
        # it takes no turn at the gate, so compiling overlaps another candidate's timing. Setup (the CUDA context,
        # the import), a warmer's first calls and the planting of its files (sandbox.warmer) likewise; every other
        # call, rebuild and soak runs the candidate's kernels and takes its turn.
        op = msg.get("op")
        ungated = op in ("setup", "plant") or (op in ("call", "warm") and run.fresh_build)
        run.fresh_build = op in ("setup", "rebuild")
        with nullcontext() if ungated else self._gpu(run, exclusive, str(op)):
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
            if within is not None:
                within.miss()
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
        message = str(reply.get("message", ""))[:4000]
        details: dict[str, Any] = {"trace": reply["trace"]} if isinstance(reply.get("trace"), dict) else {}
        if error is not None and error.type in COMPILE_ERRORS:
            stage, reason = Stage.COMPILE, Reason.COMPILE_ERROR
        elif run.device == "cpu" and (fault := interpreter_fault(message)) is not None:
            reason, message = Reason.HARNESS_ERROR, fault  # this machine's Triton and numpy, not the candidate
        elif error is not None and error.type == "OutOfMemoryError" and run.device != "cpu":
            blamed = cudaipc.blame_full_gpu(run.device, message)
            if blamed is not None:  # the harness and the other checks filled the GPU the child allocates from
                reason, (message, details[GPU_FULL]) = Reason.HARNESS_ERROR, blamed
        tail = run.child.output_tail(2000)
        if tail:
            details["output_tail"] = tail
        return Rejected(stage, reason, message, error=error, details=details)

    # ---- the candidate's process ---------------------------------------------------------------------------
    def _retire(self, run: _Run) -> None:
        """End the child (its warmer first, where one still runs) and remove its scratch directory. On the CPU, at
        once; on a GPU, where a process takes a quarter of a second to give its context back, on a thread the next
        check does not wait for (the tensors the child mapped stay alive until it is dead, then the idle cache may go
        back; `close` joins every such thread)."""
        child, lending, device = run.child, run.lending, run.device
        if run.warmer is not None:
            run.warmer.close()
        def reap() -> None:
            child.close(graceful=True)
            self._clean(child)
            lending.release()
            stage_runners.return_idle(device)

        self._reapers = [r for r in self._reapers if r.is_alive()]
        if self.device != "cuda":
            reap()
            return
        reaper = threading.Thread(target=reap, name=f"crucible-reap-{child.pid}", daemon=True)
        reaper.start()
        self._reapers.append(reaper)

    def _scratch(self, child: Child) -> Path:
        """A fresh directory per candidate: its only writable place, Triton's cache included (a shared cache would
        let one candidate plant compiled kernels for the next). Made new for each child, never found by its pid: a
        directory a killed run left behind, or one an earlier child of a recycled pid still holds until its reaper
        removes it, is not this child's."""
        if child.scratch is None:
            child.scratch = Path(tempfile.mkdtemp(prefix=f"scratch-{child.pid}-", dir=self.workdir))
            (child.scratch / "triton").mkdir()
        return child.scratch

    def _clean(self, child: Child) -> None:
        if child.scratch is not None:
            shutil.rmtree(child.scratch, ignore_errors=True)

    def _setup_msg(self, run: _Run, candidate: str | None, reference: Reference, scratch: Path) -> dict[str, Any]:
        return {
            "op": "setup", "candidate": candidate, "seeds_dir": str(SEEDS_DIR), "device": self.device,
            "gpu": run.options.gpu, "scratch": str(scratch), "write_roots": [str(scratch)],
            "triton_cache": str(scratch / "triton"), "triton_shared": str(self.triton_shared),
            "cpu_seconds": int(max(60, 4 * run.options.timeout_s)),
            "allow_compute": run.task.meta.allow_torch_compute, "seed": reference.model_seed,
            "init_inputs": reference.init_inputs(), "state_dict": reference.state_dict(),
            "source": run.source if candidate is not None else None,
            # its own kept kernels; none where the seed is fixed: the same inputs again, which outputs the candidate
            # stored in its cache could answer
            "compiled": compiled.STORE.files(run.source_key) if candidate is not None and run.options.seed is None
            else (),
        }
