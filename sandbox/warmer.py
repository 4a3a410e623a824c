"""A second process of the candidate that makes the robustness stage's first calls ahead of it.

At each robustness shape the candidate's first call compiles its kernels again (Triton specialises on sizes: a prime
sequence length or a batch of one takes kernels of its own, often another code path), CPU work in the candidate's
process that the check waits for. Where this task's last first call in this process took WARM_AFTER_S or more (a
compile worth hiding: attention's take seconds, a memory-bound task's well under one), a check on a GPU starts a
second process of the same candidate as soon as its own process has imported it: built at each robustness shape in
turn and called once there on the parent's inputs, its outputs dropped (the worker's `warm` request), while the
check's own process goes through its smoke and correctness stages. When the robustness stage comes, the parent reads
that process's Triton cache through the process's own view of it (`compiled.read_cache`, as untrusted data), ends
the process, and the check's own process writes the files into its cache (the worker's `plant` request): its first
calls at those shapes load the kernels instead of compiling them, or compile what the warmer had not reached.

What the warmer met counts for nothing: its failures are not reported (the robustness stage meets them in the check's
own process and names them), and its process is killed at its first failure, once its calls are made, and at the
latest where the robustness stage begins, dead before that stage's first call and so before the timing stage, whose
measurement no other process of the candidate may share the GPU with. It runs in the control group of the check's
process (sandbox/zygote.py `beside`): the candidate's memory bound and process count cover the two together. The files give the check's process nothing
its own source could not make: the same source at the same task's shapes, compiled by the same Triton; another
candidate's cache is never read, and the two processes share no writable place (each has its own scratch).
"""
from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from contextlib import nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from . import compiled, cudaipc
from .deadlines import CompileSigns
from .process import _alive, child_view
from .records import Stage

if TYPE_CHECKING:
    from .harness import Harness, _Run
    from .process import Child
    from .reference import Reference

log = logging.getLogger(__name__)

WARM_AFTER_S = 2.0  # a task's last first call (the smoke stage's, where Triton compiles) at least this long
# How long the robustness stage waits for a warmer still at work. Measured (attention fwd+bwd, four checks on an
# H100, docs/BENCHMARKS.md): waiting up to one compile (the check's own first call, about 3.3 s a check) saved 1.7 s
# of the robustness stage's and verified fewer a minute (5.4 against 7.5 without waiting), so it does not wait.
WAIT_S = 0.0
ROOM = 1 / 8  # the share of the GPU's memory that must be free for a warmer to start
DEATH_S = 5.0  # how long the parent waits for the killed warmer's process to be gone
JOIN_S = 0.5  # and then for its thread to end (past it, the thread cleans up after itself)
_COMPILE_S: dict[tuple[str, str, str], float] = {}  # (task, its sizes, device) -> its last smoke call's seconds
_LOCK = threading.Lock()


def _key(run: _Run) -> tuple[str, str, str]:
    return str(run.task.path), repr(sorted(run.task.overrides.items())), run.device


def note_first_call(run: _Run, seconds: float) -> None:
    """The smoke stage's first call took `seconds` (its compile and one run): what later checks of the task go by.
    Not where the check began with its source's kept kernels (sandbox.compiled): that call compiled nothing."""
    if any(s.stage is Stage.COMPILE and (s.details or {}).get("planted_files") for s in run.stages):
        return
    with _LOCK:
        _COMPILE_S[_key(run)] = seconds


def wanted(run: _Run) -> bool:
    """Whether this check starts a warmer: `CheckOptions.warm` where it says, else on a GPU where the task has
    robustness shapes, the check runs them (not a re-time) and the task's last first call took WARM_AFTER_S."""
    if run.options.retime or run.device == "cpu" and run.options.warm is not True:
        return False
    if run.options.warm is not None:
        return run.options.warm
    with _LOCK:
        return _COMPILE_S.get(_key(run), 0.0) >= WARM_AFTER_S


class Warmer:
    """One check's warmer: `start` it once the check's process has imported the candidate, `finish` it where the
    robustness stage begins (the files to plant), `close` it whatever happens (idempotent).

    Its process is killed at its first failure, once its calls are made (its cache read first), or where the check
    ends it, and found dead; it is reaped once (`_clean_up`), after which its pid is never used again (a killed,
    unreaped process keeps its pid, so no other process can be signalled or read under it)."""

    def __init__(self, harness: Harness, run: _Run, reference: Reference) -> None:
        self.harness, self.main = harness, run
        self.variants = harness._variant_tasks(run.task)
        self.model_seed = reference.model_seed
        self.run: _Run | None = None
        self.thread: threading.Thread | None = None
        self.warmed = 0  # shapes whose warm call returned
        self.planted = 0  # the files of its cache planted in the check's process
        self.seconds = 0.0  # the warmer's calls' own seconds (compiles and one run each)
        self.files: compiled.Files | None = None  # its cache, read just before its process was killed
        self.closed = False  # the check has ended it
        self._lock = threading.Lock()
        self._killed = self._reaped = False

    def start(self) -> bool:
        """The process and its thread, where there are shapes to warm; False where none was started."""
        if not self.variants:
            return False
        if self.main.device != "cpu":
            free, total = torch.cuda.mem_get_info(self.main.device)
            if free < total * ROOM:  # its context, model, inputs and outputs would crowd the other checks
                return False
        try:  # in the check's process's control group: the candidate's memory bound covers both
            child = self.harness._spawn(self.main.deadline, beside=self.main.child.pid)
        except Exception as exc:  # noqa: BLE001 - no warmer: the robustness stage compiles as it would have
            log.info("no warmer for %s: %s", self.main.candidate.name, exc)
            return False
        self.run = replace(self.main, child=_Held(child, self), warmer=None, stages=[], laps={}, walls={},
                           fresh_build=True, calls=0, call_seconds=0.0,
                           rng=random.Random(self.main.rng.randrange(1 << 31)),
                           lending=cudaipc.Lending(cudaipc.lending_cap(self.main.device.split(":")[0])),
                           signs=CompileSigns(self.harness._scratch(child) / "triton", child.pid))
        self.thread = threading.Thread(target=self._work, name=f"crucible-warm-{child.pid}", daemon=True)
        self.thread.start()
        return True

    def _work(self) -> None:
        run, harness = self.run, self.harness
        stream = torch.cuda.Stream(device=run.device) if run.device != "cpu" else None
        try:
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                for i, (_, vtask) in enumerate(self.variants):
                    if self.closed:
                        return
                    model = vtask.make_reference(self.model_seed, "cpu")  # its parameters, as the reference's
                    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                    del model
                    if i == 0:
                        msg = harness._setup_msg(run, str(run.candidate), _Built(vtask, self.model_seed, state),
                                                 harness._scratch(run.child))
                    else:
                        msg = {"op": "rebuild", "init_inputs": vtask.init_inputs(), "state_dict": state,
                               "seed": self.model_seed}
                    harness._request(run, Stage.ROBUSTNESS, msg)
                    with harness._gpu(run, work="inputs"):
                        inputs = vtask.make_inputs(run.rng.randrange(1 << 31), "normal", run.device)
                        shipped = run.lending.ship(inputs, set())[0]
                        if stream is not None:  # done within the turn: no work of it left to run past the gate
                            stream.synchronize()
                    del inputs
                    reply = harness._request(run, Stage.ROBUSTNESS, {"op": "warm", "inputs": shipped})
                    self.warmed += 1
                    self.seconds += float(reply.get("seconds") or 0.0)
            self._end(read=True)  # its work done: nothing of it runs on while the check goes on
        except Exception as exc:  # noqa: BLE001 - whatever it met, the robustness stage meets in the check's process
            log.debug("the warmer of %s stopped: %s", run.candidate.name, exc)
        finally:
            self._end(read=False)  # at its first failure (a call that left a thread running, say): at once
            self._clean_up()  # this thread uses its socket: it closes it

    def _end(self, read: bool) -> None:
        """Once: the process's cache read where `read` (it is there only while the process lives), then the process
        killed and found dead, before it is reaped, while its pid is still its own."""
        with self._lock:
            if self._killed or self._reaped:
                return
            self._killed = True
            pid = self.run.child.pid
            if read:
                self.files = compiled.read_cache(child_view(pid, self.harness._scratch(self.run.child) / "triton"))
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            end = time.monotonic() + DEATH_S
            while _alive(pid) and time.monotonic() < end:
                time.sleep(0.01)

    def finish(self) -> compiled.Files:
        """The files of the warmer's cache (read as its calls were done, or now, its process still alive), and the
        warmer ended; () where it has none. A warmer still at work is waited for up to WAIT_S (a candidate that
        hangs at those shapes costs the check no more than that here: it hangs there in the check's process too)."""
        if self.run is None:
            return ()
        t0 = time.monotonic()
        if self.thread is not None and WAIT_S > 0:
            self.thread.join(WAIT_S)
        self.main.laps["warm_wait"] = time.monotonic() - t0
        self.closed = True
        self._end(read=True)
        self.close()
        self.main.laps["warm_finish"] = time.monotonic() - t0
        self.main.laps["warmer_calls"] = self.seconds  # not the parent's: the compiles the check did not wait for
        return self.files or ()

    def close(self) -> None:
        """End the warmer: its process killed and dead when this returns; safe to call again. Its socket is closed
        by the thread that uses it (a socket closed under a waiting thread frees its descriptor's number for another
        check's channel): the thread's request ends as closed when the process dies, or its next one does, after a
        wait at the GPU's gate; the cleanup is the thread's then."""
        if self.run is None:
            return
        self.closed = True
        self._end(read=False)
        if self.thread is not None:
            self.thread.join(JOIN_S)
            if self.thread.is_alive():
                return
        self._clean_up()

    def _clean_up(self) -> None:
        """Once, after the kill: the process reaped (the zygote's wait), its scratch removed, its lent blocks let go
        (it maps them no more)."""
        with self._lock:
            if self._reaped or not self._killed:
                return
            self._reaped = True
        self.run.child.held.close(graceful=False)
        self.harness._clean(self.run.child.held)
        self.run.lending.release()


class _Held:
    """The warmer's process as the harness's requests see it: where a request fails, `close` kills the process at
    once (Warmer._end) but does not reap it, so that its pid stays its own until the warmer's own cleanup."""

    def __init__(self, child: Child, warmer: Warmer) -> None:
        self.held, self._warmer = child, warmer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.held, name)

    def close(self, graceful: bool = True) -> None:
        self._warmer._end(read=False)


class _Built:
    """What the setup message needs of a reference: the task's init inputs, the model's parameters and their seed."""

    def __init__(self, task: Any, model_seed: int, state: dict[str, torch.Tensor]) -> None:
        self.task, self.model_seed, self._state = task, model_seed, state

    def init_inputs(self) -> list[Any]:
        return self.task.init_inputs()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state

