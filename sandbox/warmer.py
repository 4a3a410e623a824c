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
own process and names them), and it is ended, dead, before that stage's first call, so before the timing stage, whose
measurement no other process of the candidate may share the GPU with. The files give the check's process nothing
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
    from .reference import Reference

log = logging.getLogger(__name__)

WARM_AFTER_S = 2.0  # a task's last first call (the smoke stage's, where Triton compiles) at least this long
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
    robustness stage begins (the files to plant), `close` it whatever happens (idempotent)."""

    def __init__(self, harness: Harness, run: _Run, reference: Reference) -> None:
        self.harness, self.main = harness, run
        self.variants = harness._variant_tasks(run.task)
        self.model_seed = reference.model_seed
        self.run: _Run | None = None
        self.thread: threading.Thread | None = None
        self.warmed = 0  # shapes whose warm call returned
        self.seconds = 0.0  # the warmer's calls' own seconds (compiles and one run each)
        self.closed = False

    def start(self) -> bool:
        """The process and its thread, where there are shapes to warm; False where none was started."""
        if not self.variants:
            return False
        if self.main.device != "cpu":
            free, total = torch.cuda.mem_get_info(self.main.device)
            if free < total * ROOM:  # its context, model, inputs and outputs would crowd the other checks
                return False
        try:
            child = self.harness._spawn(self.main.deadline)
        except Exception as exc:  # noqa: BLE001 - no warmer: the robustness stage compiles as it would have
            log.info("no warmer for %s: %s", self.main.candidate.name, exc)
            return False
        self.run = replace(self.main, child=child, warmer=None, stages=[], laps={}, walls={}, fresh_build=True, calls=0,
                           call_seconds=0.0, rng=random.Random(self.main.rng.randrange(1 << 31)),
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
                        break
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
        except Exception as exc:  # noqa: BLE001 - whatever it met, the robustness stage meets in the check's process
            log.debug("the warmer of %s stopped: %s", run.candidate.name, exc)
        finally:
            if self.closed:  # ended while this thread waited: the cleanup close() left to it
                self._clean_up()

    def finish(self) -> compiled.Files:
        """The files the warmer's cache holds now (its process still alive: its cache exists only in its view), and
        the warmer ended; () where it has none."""
        if self.run is None or self.closed:
            return ()
        child = self.run.child
        t0 = time.monotonic()
        files = compiled.read_cache(child_view(child.pid, self.harness._scratch(child) / "triton")) or ()
        self.close()
        self.main.laps["warm_finish"] = time.monotonic() - t0
        self.main.laps["warmer_calls"] = self.seconds  # not the parent's: the compiles the check did not wait for
        return files

    def close(self) -> None:
        """End the process and give back what it was lent; safe to call again. The process is killed here and is dead
        when this returns. Its socket is closed by the thread that uses it (a socket closed under a waiting thread
        frees its descriptor's number for another check's channel): the thread's request ends as closed when the
        process dies, or its next one does, after a wait at the GPU's gate; the cleanup is the thread's then."""
        if self.run is None or self.closed:
            return
        self.closed = True
        pid = self.run.child.pid
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        end = time.monotonic() + DEATH_S
        while _alive(pid) and time.monotonic() < end:
            time.sleep(0.01)
        if self.thread is not None:
            self.thread.join(JOIN_S)  # its request ends as the process dies; a wait at the gate may take longer
            if self.thread.is_alive():
                return
        self._clean_up()

    def _clean_up(self) -> None:
        """The process's exit collected, its scratch removed, its lent blocks let go (it maps them no more)."""
        self.run.child.close(graceful=False)
        self.harness._clean(self.run.child)
        self.run.lending.release()

class _Built:
    """What the setup message needs of a reference: the task's init inputs, the model's parameters and their seed."""

    def __init__(self, task: Any, model_seed: int, state: dict[str, torch.Tensor]) -> None:
        self.task, self.model_seed, self._state = task, model_seed, state

    def init_inputs(self) -> list[Any]:
        return self.task.init_inputs()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state

