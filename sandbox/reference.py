"""The task's reference, run in the trusted parent: in its own dtype (what PyTorch delivers) and in float64 (the
truth the tolerance module measures errors against), and the task's other honest PyTorch implementations of the op
when it names some (`crucible_references(model)` in the task file: {name: fn(*inputs) -> outputs}; sandbox/tolerance.py
says how they count). Also the check that a task is usable at all."""
from __future__ import annotations

import copy
import logging
import threading
import time
from contextlib import contextmanager, nullcontext as _nothing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import torch

from .records import TaskError

if TYPE_CHECKING:
    from .task import Task

log = logging.getLogger(__name__)
# The passing GPU bytes of one reference run (its own dtype, the float64 truth, the alternates) by task, shapes and
# device: measured on the first run, which holds the gate's whole memory budget; later runs ask for this much more.
_PEAKS: dict[tuple[str, tuple, str], int] = {}
PEAK_MARGIN = 1.25

REFERENCES_HOOK = "crucible_references"


def _full(exc: BaseException) -> bool:
    """Whether an error says the GPU was full: torch's own, or a library's allocation failure raised as a plain
    RuntimeError (cuBLAS's CUBLAS_STATUS_ALLOC_FAILED)."""
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and any(s in str(exc) for s in ("out of memory", "ALLOC_FAILED")))


def _raise_if_full(exc: BaseException) -> None:
    """torch.OutOfMemoryError, raised from `exc`, where `exc` says the GPU was full: `Reference.run` tries again."""
    if _full(exc):
        raise torch.OutOfMemoryError(str(exc)) from exc


class SharedExclusive:
    """Reference runs in one process: the GPU's check slots are threads of the parent, and their reference runs
    (the model and its float64 truth) share this; a task's alternates take it alone. An alternate may switch
    process-wide state to pick its implementation (`torch.nn.attention.sdpa_kernel` sets SDPA's backend flags,
    which every thread sees): run beside another slot's reference, it would turn that reference into another
    backend or its float64 truth into an error (the float64 math backend switched off), and leave the flags
    switched where two such runs overlap. A waiting exclusive run holds back new shared ones (writer preference),
    so a stream of references cannot starve the alternates."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: not self._exclusive and not self._shared)
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


RUNS = SharedExclusive()

# Process-wide switches an alternate may set to pick an implementation: read before its run and put back after it
# (a hook that leaks one would change every later reference of the process). SDPA's backends, those this torch has.
_SWITCHES = tuple((get, set_) for get, set_ in ((getattr(torch.backends.cuda, f"{name}_sdp_enabled", None),
                                                  getattr(torch.backends.cuda, f"enable_{name}_sdp", None))
                                                 for name in ("flash", "mem_efficient", "math", "cudnn"))
                  if get is not None and set_ is not None)


@contextmanager
def _switches_kept() -> Iterator[None]:
    saved = [(get(), set_) for get, set_ in _SWITCHES]
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        yield
    finally:
        for value, set_ in saved:
            set_(value)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


@dataclass
class Expected:
    ref: list[torch.Tensor]
    truth: list[torch.Tensor] | None
    structure: str  # "tensor" or "tuple"
    alternates: list[list[torch.Tensor]] = field(default_factory=list)  # per alternate, its outputs

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.ref)

    @property
    def held_bytes(self) -> int:
        """All it holds: the reference's outputs, the truth and every alternate's outputs."""
        return sum(t.numel() * t.element_size()
                   for t in (*self.ref, *(self.truth or []), *(x for alt in self.alternates for x in alt)))

    def alternates_for(self, i: int) -> tuple[torch.Tensor, ...]:
        """Output i of each alternate implementation."""
        return tuple(alt[i] for alt in self.alternates)


def spec_bytes(specs: list[tuple[torch.Size, torch.dtype]]) -> int:
    """Bytes of tensors of these shapes and dtypes (Reference.output_specs)."""
    return sum(shape.numel() * dtype.itemsize for shape, dtype in specs)


class Reference:
    def __init__(self, task: Task, device: str, model_seed: int, gate: Any = None):
        self.task = task
        self.device = device
        self.model_seed = model_seed
        try:
            self.model = task.make_reference(model_seed, device)
        except Exception as exc:
            raise TaskError(f"{task.path.name}: Model(*get_init_inputs()) failed: {type(exc).__name__}: {exc}") from None
        self.alternates = _alternates(task, self.model)
        self.call_s = 0.0  # the fastest call of the model in its own dtype so far (sandbox.deadlines); 0: none yet
        self.gate = gate  # the GPU's gate (sandbox/gate.py) where several checks share it: runs take its memory
        self.model64: torch.nn.Module | None = None
        self._upcast()

    def _upcast(self) -> None:
        """model64, the model's float64 copy; where the GPU is full, `_upcast_later` says to make it at the first run
        that needs it."""
        try:
            self.model64, self._upcast_later = copy.deepcopy(self.model).double(), False
        except Exception as exc:  # a module that cannot be upcast: compare against its own dtype only
            self._upcast_later = _full(exc)
            if not self._upcast_later:
                log.info("no float64 reference for %s: %s", self.task.name, exc)

    def init_inputs(self) -> list[Any]:
        return self.task.init_inputs()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu").clone() for k, v in self.model.state_dict().items()}

    def _run_model(self, dev_inputs: list[Any]) -> tuple[Any, list[torch.Tensor]]:
        """(the raw output, its tensors) of the reference in its own dtype; TaskError where it fails. Its wall time
        (the device's work included) updates `call_s`."""
        cuda = torch.device(self.device).type == "cuda"
        if cuda:
            torch.cuda.current_stream(self.device).synchronize()
        t0 = time.monotonic()
        try:
            out = self.model(*dev_inputs)
        except Exception as exc:
            _raise_if_full(exc)  # a full GPU is not the task's fault
            raise TaskError(f"{self.task.path.name}: the reference Model failed on its own inputs: "
                            f"{type(exc).__name__}: {exc}") from None
        if cuda:
            torch.cuda.current_stream(self.device).synchronize()
        took = time.monotonic() - t0
        self.call_s = min(self.call_s, took) if self.call_s else took
        ref = _as_list(out)
        if not all(isinstance(t, torch.Tensor) for t in ref):
            raise TaskError(f"{self.task.path.name}: the reference must return a tensor or a tuple of tensors")
        return out, ref

    def output_specs(self, inputs: list[Any]) -> list[tuple[torch.Size, torch.dtype]]:
        """Shape and dtype of each of the reference's outputs on these inputs, from the model in its own dtype alone
        (no float64 truth, no alternates: at causal attention fwd+bwd the truth's scores alone are 16 GiB a tensor)."""
        dev_inputs = [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]
        with RUNS.shared():
            _, ref = self._run_model(dev_inputs)
        return [(t.shape, t.dtype) for t in ref]

    def run(self, inputs: list[Any]) -> Expected:
        """The outputs in the model's dtype, the float64 truth and the alternates' outputs on these inputs. On a
        shared GPU the run's passing memory is taken from the gate's budget first (`_memory_turn`). A run that finds
        the GPU full is made once more alone, after the parent's cached blocks go back to the driver; full again,
        the OutOfMemoryError is the caller's: the harness ends the check as its own failure, which says nothing of
        the candidate. A full GPU never drops the truth or an alternate: compared without them, a candidate would be
        held to the reference's outputs as if they had no error."""
        try:
            with self._memory_turn():
                return self._run(inputs)
        except torch.OutOfMemoryError:
            log.warning("%s: a reference run found the GPU full; once more, alone", self.task.name)
        with self._alone():
            return self._run(inputs)

    @contextmanager
    def _alone(self) -> Iterator[None]:
        """The gate's whole memory budget, with the parent's cached blocks handed back to the driver first."""
        if torch.device(self.device).type == "cuda":
            torch.cuda.empty_cache()
        with self.gate.memory(None) if self.gate is not None else _nothing():
            yield

    @contextmanager
    def _memory_turn(self) -> Iterator[None]:
        """The gate's memory for this run: the task's measured peak, or the whole budget while none is measured
        (then measured here, and the cache handed back so the other checks' streams can use what it took)."""
        dev = torch.device(self.device)
        if self.gate is None or dev.type != "cuda":
            yield
            return
        key = (str(self.task.path), tuple(sorted(self.task.overrides.items())), str(dev))
        known = _PEAKS.get(key)
        with self.gate.memory(None if known is None else int(known * PEAK_MARGIN)):
            if known is not None:
                yield
                return
            before = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            yield
            _PEAKS[key] = max(0, torch.cuda.max_memory_allocated(dev) - before)
            torch.cuda.empty_cache()

    def _run(self, inputs: list[Any]) -> Expected:
        dev_inputs = [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]
        with RUNS.shared():  # released before the alternates take it alone
            out, ref, truth = self._run_with_truth(dev_inputs)
        return Expected(ref=[t.detach() for t in ref], truth=truth,
                        structure="tuple" if isinstance(out, (tuple, list)) else "tensor",
                        alternates=self._run_alternates(dev_inputs, ref) if truth is not None else [])

    def _run_with_truth(self, dev_inputs: list[Any]) -> tuple[Any, list[torch.Tensor], list[torch.Tensor] | None]:
        out, ref = self._run_model(dev_inputs)
        truth = None
        if self._upcast_later and any(t.is_floating_point() for t in ref):
            self._upcast()
            if self._upcast_later:
                raise torch.OutOfMemoryError(f"{self.task.name}: the float64 copy of the model did not fit")
        if self.model64 is not None and any(t.is_floating_point() for t in ref):
            try:
                up = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in dev_inputs]
                truth = [t.detach() for t in _as_list(self.model64(*up))]
                if len(truth) != len(ref) or any(a.shape != b.shape for a, b in zip(truth, ref)):
                    truth = None
            except Exception as exc:  # noqa: BLE001 - the model does not run in float64 (an op has no float64
                # kernel): it never will, so no later run tries; a full GPU is a moment's, and `run` tries again
                _raise_if_full(exc)
                log.info("float64 reference failed for %s: %s", self.task.name, exc)
                self.model64, truth = None, None
        return out, ref, truth

    def _run_alternates(self, inputs: list[Any], ref: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Each alternate's outputs; one that cannot run here (a backend this device lacks) or returns another
        structure is left out (logged): it can only loosen the bound, never tighten it."""
        outs = []
        for name, fn in self.alternates.items():
            try:
                with RUNS.exclusive(), _switches_kept():  # alone in the process: it may switch backends (RUNS)
                    got = _as_list(fn(*inputs))
            except Exception as exc:  # noqa: BLE001 - e.g. SDPA's flash backend on a CPU
                _raise_if_full(exc)  # a moment's: left out, the alternate would tighten the bound
                log.info("%s: alternate reference %s unavailable here: %s: %s", self.task.name, name,
                         type(exc).__name__, exc)
                continue
            if len(got) != len(ref) or any(not isinstance(g, torch.Tensor) or g.shape != r.shape or g.dtype != r.dtype
                                           for g, r in zip(got, ref)):
                log.info("%s: alternate reference %s returned another structure; left out", self.task.name, name)
                continue
            outs.append([g.detach() for g in got])
        return outs


def _alternates(task: Task, model: torch.nn.Module) -> dict[str, Any]:
    hook = getattr(task.module, REFERENCES_HOOK, None)
    if hook is None:
        return {}
    try:
        found = dict(hook(model))
    except Exception as exc:  # noqa: BLE001 - a task's broken hook: the check goes on against the reference alone
        log.info("%s: %s failed: %s: %s", task.name, REFERENCES_HOOK, type(exc).__name__, exc)
        return {}
    return {str(k): v for k, v in found.items() if callable(v)}


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def check_task(task: Task, device: str, seed: int = 0, *, float64: bool = True) -> dict[str, Any]:
    """Refuse a task that cannot run or whose output ignores its inputs; return a summary of it otherwise.
    `float64=False` skips the float64 truth (the rescaling's probes: whether the task runs, not how exactly)."""
    ref = Reference(task, device, seed)
    if not float64:
        ref.model64, ref._upcast_later = None, False
    a = ref.run(task.make_inputs(seed + 1, "normal", device))
    b = ref.run(task.make_inputs(seed + 2, "normal", device))
    if all(torch.equal(x, y) for x, y in zip(a.ref, b.ref)):
        raise TaskError(f"{task.path.name}: the reference returns the same output for different inputs "
                        f"({_constant_what(a.ref)}, at {_sizes(task)}), so any constant would pass; make its output "
                        "depend on its inputs")
    if all(x.numel() == 0 or (x.is_floating_point() and not bool(x.any())) for x in a.ref):
        raise TaskError(f"{task.path.name}: the reference returns only zeros; make its output depend on its inputs")
    return {
        "outputs": [{"shape": list(t.shape), "dtype": str(t.dtype)} for t in a.ref],
        "float64_reference": a.truth is not None,
        "constants": task.current_constants(),
    }


def _constant_what(outputs: list[torch.Tensor]) -> str:
    """What the constant output is: 'output 0 is 1.0 everywhere' where it is one value, else its shape."""
    parts = []
    for i, t in enumerate(outputs):
        flat = t.detach().reshape(-1)
        if flat.numel() and bool((flat == flat[0]).all()):
            parts.append(f"output {i} is {flat[0].item()} everywhere")
        else:
            parts.append(f"output {i} ({list(t.shape)}) does not change")
    return "; ".join(parts)


def _sizes(task: Task) -> str:
    rescaled = {k: v for k, v in task.overrides.items() if k not in task.pinned}
    if not rescaled:
        return "the task's own size"
    return "the size " + ", ".join(f"{k}={v}" for k, v in rescaled.items())
