"""Where candidates are evaluated: warm harnesses on this machine, or evaluation actors across a Ray cluster.

The loop opens one `Session` per run (`executor.session(task, config, workdir)`) and sees only its device, its
number of evaluation slots and `submit(slot, candidate) -> Future[CheckResult]`; it does not know which executor it
has. Both keep what the loop relies on:

- the search, the LLM requests and every archive write stay in the loop's process (the Ray driver): workers only
  receive a task's text and a candidate's text and send back the harness's CheckResult;
- a future resolves to a CheckResult, or fails with the harness's exception (the loop records a harness error).

`LocalExecutor` keeps warm harnesses on this machine, each called on its own thread (`gpu_ids` pins which GPUs: a
`crucible batch` lane owns one). A GPU has several slots (`--checks-per-gpu`, default 4), one harness each: while one
candidate is timed, the next ones are started, compiled and checked for correctness, so the GPU never waits for a
compile. The slots of a GPU share its gate (sandbox/gate.py): their checks' GPU work runs side by side, a timing stage
alone. The CPU has one slot unless asked for more. `RayExecutor` (agent/search/ray_executor.py) spreads the
same sessions over a Ray cluster.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from sandbox.gate import TIMING_TURNS, GpuGate
from sandbox.records import CheckResult
from sandbox.task import Task
from sandbox.timing_child import set_budget
from sandbox.timing_parent import EXTRA_REPS, REPS, WARMUP, kept_bytes

if TYPE_CHECKING:
    from agent.search.runs import RunConfig

log = logging.getLogger(__name__)
CHECK_FOOTPRINT = 16  # GPU bytes a check keeps alive, in multiples of the task's input bytes (checks_that_fit;
# H200, SwiGLU's 0.94 GB of inputs at 8 checks: the parent held 81 GiB, a timing's child 28 GiB, out of memory)
# Slots per GPU when the run does not say: half the CPU's cores (each check's process compiles and loads on one),
# at least 4 (a compile ready before the GPU is free) and at most 8 (H200, RMSNorm: 35 verified a minute at 8,
# 23 at 4; benchmarks/data/throughput.csv), and never more than the GPU's memory holds (checks_that_fit).
CHECKS_PER_GPU = min(8, max(4, (os.cpu_count() or 1) // 2))


@dataclass(frozen=True)
class CheckSpan:
    """One check a slot ran, from its evaluator taking it to its verdict (or failure), on the monotonic clock: what
    says how many checks were in flight at a time (a retried check is two spans)."""
    slot: int
    gpu: int
    candidate: str  # the candidate file's name
    start: float
    end: float


class ExecutorError(Exception):
    """The executor cannot evaluate this run; the message is one sentence saying what to do (the CLI exits 2)."""


class Session(Protocol):
    """One run's view of an executor."""

    device: str  # "cuda": candidates are timed; "cpu": correctness only, through Triton's interpreter
    slots: int  # candidates the loop may have under evaluation at once

    # resolves to a CheckResult; `baselines` overrides the run's (the final re-check of a run's best)
    # incumbent_ms: the run's best time so far; timing stops once the candidate cannot beat it (profiler.stats)
    # retime: a source this run verified in full, only timed again (a duel's leg; sandbox.harness.CheckOptions)
    def submit(self, slot: int, candidate: Path, baselines: tuple[str, ...] | None = None,
               incumbent_ms: float | None = None, retime: bool = False) -> cf.Future: ...
    def reset(self, slot: int) -> None: ...  # the slot's last evaluation raised: start it afresh
    def close(self) -> None: ...  # the run is over; evaluations not started are dropped


class Executor(Protocol):
    def session(self, task: Task, config: "RunConfig", workdir: Path) -> Session: ...  # ExecutorError if impossible
    def close(self) -> None: ...


def spawn(fn: Callable[..., Any], *args: Any) -> cf.Future:
    """Run fn on a daemon thread (a stop must not wait for a hung call), returning a Future."""
    future: cf.Future = cf.Future()

    def body() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the loop, which records it
            future.set_exception(exc)
    threading.Thread(target=body, daemon=True).start()
    return future


# ---- on this machine ------------------------------------------------------------------------------------------------

class Evaluator(Protocol):
    def check(self, candidate: Path, baselines: tuple[str, ...] | None = None,
              incumbent_ms: float | None = None, retime: bool = False) -> CheckResult: ...
    def close(self) -> None: ...


EvaluatorFactory = Callable[[Task, str, int], Evaluator]


class HarnessEvaluator:
    """One warm harness on one device (one GPU index), made by `warm` (the session starts every slot's at once) or
    by the first check, whichever comes first. `gate` is the GPU's, shared with the other slots on it."""

    def __init__(self, task: Task, device: str, gpu: int, *, timeout_s: float, baselines: tuple[str, ...],
                 workdir: Path, gate: GpuGate | None = None):
        self.task, self.device, self.gpu = task, device, gpu
        self.timeout_s, self.baselines, self.workdir, self.gate = timeout_s, baselines, workdir, gate
        self._harness = None
        self._made = threading.Lock()  # held while the harness is made or warmed, and while it is closed
        self._closed = False

    def warm(self) -> None:
        """The harness made, its sandbox worker started and the task's robustness shapes worked out: what the
        slot's first check would otherwise do first (seconds: the worker imports torch and Triton)."""
        with self._made:
            harness = self._make()
            harness._ensure_zygote()
            harness._variant_tasks(harness.load(self.task))
            if self._closed:  # closed meanwhile: the closing did not wait for this warm-up, so it ends it here
                self._shut()

    def _make(self) -> Any:
        """The harness, made if need be; called holding `_made`."""
        from sandbox.harness import Harness
        if self._closed:
            self._shut()  # a close that found `_made` held left the harness to its holder
            raise RuntimeError("this evaluator was closed")
        if self._harness is None:
            self._harness = Harness(self.device, workdir=self.workdir)
        return self._harness

    def check(self, candidate: Path, baselines: tuple[str, ...] | None = None,
              incumbent_ms: float | None = None, retime: bool = False) -> CheckResult:
        from sandbox.harness import CheckOptions
        with self._made:  # a warm-up under way finishes first: it does what this check would
            harness = self._make()
        options = CheckOptions(device=self.device, timing=self.device == "cuda", timeout_s=self.timeout_s,
                               gpu=self.gpu, baselines=baselines or self.baselines, gate=self.gate,
                               incumbent_ms=incumbent_ms, retime=retime)
        return harness.check(self.task, candidate, options)

    def close(self) -> None:
        """The harness and its worker closed now, or by the warm-up under way as it ends (a run that ends before
        its slots are warm does not wait for their workers to start)."""
        self._closed = True
        if self._made.acquire(blocking=False):
            try:
                self._shut()
            finally:
                self._made.release()

    def _shut(self) -> None:
        if self._harness is not None:
            self._harness.close()
            self._harness = None


def sized(task: Task, config: "RunConfig") -> Task:
    """The task at the run's size: its --set constants in place (pinned) and --no-rescale kept."""
    constants = getattr(config, "constants", None) or {}
    if constants:
        task = task.with_constants(constants, pin=True)
    return task if getattr(config, "rescale", True) else task.without_rescaling()


def _resolve_local(device: str) -> str:
    from sandbox.device import resolve_device
    try:
        return resolve_device(device)
    except ValueError as exc:
        raise ExecutorError(str(exc)) from None


def checks_that_fit(task: Task, gpu_bytes: int, wanted: int = CHECKS_PER_GPU) -> int:
    """How many checks one GPU holds at once, at most `wanted`: a check keeps about CHECK_FOOTPRINT times the task's
    input bytes alive there (the parent's inputs, reference output and float64 truth, the lent staging copies, the
    soak's calls, the child's own copies), and the GPU's timing turns (sandbox/gate.py) each hold a timing's input
    sets and kept outputs besides (`timing_bytes`), so a task of gigabytes (SwiGLU at Llama-3 8B's width, KernelBench's
    6 GB tensors) is checked fewer at a time instead of running the GPU out of memory."""
    try:
        inputs = task.input_bytes()
    except Exception:  # noqa: BLE001 - a task whose inputs cannot be probed keeps the default
        return wanted
    return max(1, min(wanted, _left(inputs, gpu_bytes, 0) // max(1, CHECK_FOOTPRINT * inputs)))


def parent_memory_budget(task: Task, gpu_bytes: int, checks: int) -> int:
    """The bytes the parent's passing peaks (reference runs with their float64 truth) may take on a GPU at once
    (sandbox/gate.py's `memory`): what the timing turns and the checks' own footprints (checks_that_fit) leave, at
    least one byte (a run then goes alone: the gate admits one whatever its size); 0 (no budget) off the GPU."""
    if gpu_bytes <= 0:
        return 0
    try:
        inputs = task.input_bytes()
    except Exception:  # noqa: BLE001 - a task whose inputs cannot be probed: its reference runs one at a time
        return 1
    return max(1, _left(inputs, gpu_bytes, checks))


def _left(input_bytes: int, gpu_bytes: int, checks: int) -> int:
    """The GPU's bytes past its timing turns' holdings and `checks` checks' footprints (may be negative)."""
    return gpu_bytes - TIMING_TURNS * timing_bytes(input_bytes, gpu_bytes) - checks * CHECK_FOOTPRINT * input_bytes


def timing_bytes(input_bytes: int, gpu_bytes: int) -> int:
    """What one timing stage may hold on the GPU beyond a check's own: its input sets (one per timed call, within
    the child's budget, an eighth of the GPU at most: timing_child.set_budget) and the timed outputs it keeps for
    sampling (taken as large as the inputs; within the parent's deferral budget: timing_parent.kept_bytes)."""
    calls = WARMUP + REPS + EXTRA_REPS + 1
    return min(set_budget(gpu_bytes), calls * input_bytes) + min(kept_bytes(gpu_bytes), calls * input_bytes)


class LocalExecutor:
    """Warm harnesses in this process: `checks_per_gpu` per GPU (`--gpus`), or one on the CPU (more if asked).

    `gpu_ids` pins the GPUs a session's slots evaluate on (slot i on GPU gpu_ids[i % len(gpu_ids)]); by default they
    are GPUs 0 .. --gpus - 1. `crucible batch --gpus N` gives each of its N lanes one GPU this way. `gates` holds one
    gate per GPU (sandbox/gate.py), shared by every session of this executor; its log says when the GPU had work.
    `checks` lists every check its sessions' slots ran (CheckSpan), the order they ended in.
    """

    def __init__(self, evaluator_factory: EvaluatorFactory | None = None, *,
                 resolve_device: Callable[[str], str] = _resolve_local, gpu_ids: tuple[int, ...] | None = None):
        if gpu_ids is not None and (not gpu_ids or min(gpu_ids) < 0 or len(set(gpu_ids)) != len(gpu_ids)):
            raise ValueError(f"gpu_ids must be distinct GPU indices, 0 or more; got {gpu_ids!r}")
        self.factory = evaluator_factory
        self.resolve_device = resolve_device
        self.gpu_ids = None if gpu_ids is None else tuple(gpu_ids)
        self.gates: dict[int, GpuGate] = {}
        self.checks: list[CheckSpan] = []

    def session(self, task: Task, config: "RunConfig", workdir: Path) -> "LocalSession":
        device = self.resolve_device(config.device)
        task = sized(task, config)
        per_gpu = getattr(config, "checks_per_gpu", None)
        if per_gpu is not None and per_gpu < 1:
            raise ExecutorError(f"--checks-per-gpu {per_gpu}: give at least 1")
        gates = self.gates
        factory = self.factory or (lambda t, d, gpu: HarnessEvaluator(
            t, d, gpu, timeout_s=config.check_timeout_s, baselines=config.baselines, workdir=workdir,
            gate=gates[gpu]))
        if device != "cuda":
            return LocalSession(task, device, per_gpu or 1, factory, gpu_ids=(0,) * (per_gpu or 1), gates=gates,
                                checks=self.checks)
        gpu_ids = self.gpu_ids if self.gpu_ids is not None else tuple(range(config.gpus))
        import torch
        visible = torch.cuda.device_count()
        if max(gpu_ids, default=-1) >= visible:
            what = f"--gpus {config.gpus}" if self.gpu_ids is None else f"GPU {max(gpu_ids)}"
            raise ExecutorError(f"{what} asks for more GPUs than the {visible} visible")
        gpu_bytes = torch.cuda.get_device_properties(gpu_ids[0]).total_memory if torch.cuda.is_available() else 0
        if per_gpu is None:
            per_gpu = checks_that_fit(task, gpu_bytes) if gpu_bytes else CHECKS_PER_GPU
        elif gpu_bytes and (fit := checks_that_fit(task, gpu_bytes, per_gpu)) < per_gpu:
            log.warning("--checks-per-gpu %d: %d checks of %s fit in the GPU's memory at once; checking %d at a "
                        "time (more would fail as out of memory, which says nothing about a candidate)",
                        per_gpu, fit, task.path.name, fit)
            per_gpu = fit
        return LocalSession(task, device, len(gpu_ids) * per_gpu, factory, gpu_ids=gpu_ids * per_gpu, gates=gates,
                            checks=self.checks)

    def close(self) -> None:
        pass  # each session closes its own harnesses


class LocalSession:
    """Slot i evaluates on GPU gpu_ids[i] (default: GPU i) through its own evaluator. Several slots may name one
    GPU; they share its gate in `gates` (GPU index -> GpuGate, filled here). Every slot's evaluator is made and
    warmed (`warm`, where it has one) on a thread of its own as the session opens: the run's first check (its
    starting kernel) takes one slot, and the others would otherwise start their sandbox workers only when their
    first candidates come, after that check (about 11 s on the H100 before a second SwiGLU slot's first check)."""

    def __init__(self, task: Task, device: str, slots: int, factory: EvaluatorFactory, *,
                 gpu_ids: tuple[int, ...] | None = None, gates: dict[int, GpuGate] | None = None,
                 checks: list[CheckSpan] | None = None):
        if gpu_ids is not None and len(gpu_ids) != slots:
            raise ValueError(f"{slots} slot(s) need as many GPU ids; got {gpu_ids!r}")
        self.task, self.device, self.slots, self.factory = task, device, slots, factory
        self.gpu_ids = tuple(gpu_ids) if gpu_ids is not None else tuple(range(slots))
        self.gates = gates if gates is not None else {}
        self.checks = checks if checks is not None else []  # each check's span, appended as it ends
        for gpu in self.gpu_ids:
            self.gates.setdefault(gpu, GpuGate(f"{device}:{gpu}"))
        import torch
        # This task's reference peaks beside its checks (a batch's next task on the GPU sets its own budget).
        if device == "cuda" and torch.cuda.is_available():
            for gpu in set(self.gpu_ids):
                self.gates[gpu].memory_bytes = parent_memory_budget(
                    task, torch.cuda.get_device_properties(gpu).total_memory, self.gpu_ids.count(gpu))
        self.evaluators: dict[int, Evaluator] = {}
        self._lock = threading.Lock()  # making a slot's evaluator: its warm-up and its first check may race
        self._closed = False
        for slot in range(slots):
            threading.Thread(target=self._warm, args=(slot,), daemon=True, name=f"warm-slot-{slot}").start()

    def _evaluator(self, slot: int) -> Evaluator:
        with self._lock:
            evaluator = self.evaluators.get(slot)
            if evaluator is None:
                if self._closed:
                    raise RuntimeError("the session is closed")
                evaluator = self.evaluators[slot] = self.factory(self.task, self.device, self.gpu_ids[slot])
            return evaluator

    def _warm(self, slot: int) -> None:
        try:
            warm = getattr(self._evaluator(slot), "warm", None)
            if warm is not None:
                warm()
        except Exception as exc:  # noqa: BLE001 - the slot's first check makes it again and reports what fails
            if not self._closed:  # a session closed before its slots were warm: nothing to say
                log.warning("warming evaluation slot %d failed: %s: %s", slot, type(exc).__name__, exc)

    def submit(self, slot: int, candidate: Path, baselines: tuple[str, ...] | None = None,
               incumbent_ms: float | None = None, retime: bool = False) -> cf.Future:
        return spawn(self._evaluate, slot, candidate, baselines, incumbent_ms, retime)

    def _evaluate(self, slot: int, candidate: Path, baselines: tuple[str, ...] | None,
                  incumbent_ms: float | None, retime: bool) -> CheckResult:
        start = time.monotonic()
        try:
            return self._evaluator(slot).check(candidate, baselines, incumbent_ms=incumbent_ms, retime=retime)
        finally:
            self.checks.append(CheckSpan(slot, self.gpu_ids[slot], candidate.name, start, time.monotonic()))

    def reset(self, slot: int) -> None:
        with self._lock:
            evaluator = self.evaluators.pop(slot, None)
        if evaluator is not None:
            threading.Thread(target=evaluator.close, daemon=True).start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        closers = [threading.Thread(target=e.close, daemon=True) for e in self.evaluators.values()]
        for t in closers:
            t.start()
        for t in closers:
            t.join(timeout=10)
        self.evaluators.clear()
