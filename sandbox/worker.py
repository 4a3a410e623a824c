"""The candidate's process: trusted code that confines itself, imports the candidate and runs the calls the parent
asks for. It holds no expected output at any time; it only reports what the candidate returned and what it did.

Requests (from the parent, pickled): setup, call, rebuild, soak (many calls on inputs derived here), prepare_timing
(a timing's input sets and baselines, each baseline called once), time, samples (timed outputs kept by `time`), exit.
Replies (to the parent, sandbox.wire): dicts with `ok`, and on failure `reason` (a records.Reason value), `message`,
`error`.

Every call, single or in a soak, is checked the same way here: the launch trace (sandbox.trace: kernels launched,
torch compute, computation outside torch and Triton, the trace's own hooks still in place), threads, global flags,
the model's state (sandbox.carry: unchanged after its first call; tensors a call wrote are scrambled before the
next), output types and aliasing, inputs untouched. The harness's modules are out of sys.modules before the candidate
is imported; the worker keeps its own references.
"""
from __future__ import annotations

import importlib.util
import linecache
import mmap
import os
import sys
import threading
import time
from typing import Any

import torch

from . import carry, channel, compiled, cudaipc, policy, pyparse, timing_child, trace
from .records import ErrorInfo, Reason

CANDIDATE_MODULE = "crucible_candidate"
# Modules hidden from the candidate (sys.modules) while it can run: the trace's, the policy's and the timer's code
# stays referenced by the worker, but a candidate cannot name it to switch it off.
HIDDEN_PREFIXES = ("sandbox", "profiler")


def main(sock_fd: int, out_fd: int, shared_fd: int) -> None:
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    shared = mmap.mmap(shared_fd, 0)  # outputs go back through it, not through the socket
    os.close(shared_fd)
    state: dict[str, Any] = {}
    while True:
        try:
            msg = channel.recv_from_parent(sock_fd)
        except channel.ChannelClosed:
            return
        op = msg.get("op")
        if op == "exit":
            return
        try:
            reply = _HANDLERS[op](state, msg)
        except Exception as exc:  # the candidate's failure, reported; the worker itself goes on
            reply = _raised(exc)
            if "Read-only file system" in str(exc) and "policy" in state:  # a write from C, stopped by the mount
                state["policy"].violations.append("writing outside the scratch directory (read-only file system)")
        if reply.get("ok") is False and "No space left on device" in str(reply.get("message")) and "policy" in state:
            state["policy"].violations.append(policy.scratch_full(state["policy"]))  # the scratch tmpfs is full
        violations = list(state["policy"].violations) if "policy" in state else []
        if violations and reply.get("ok") is False:
            reply.update(reason=Reason.SANDBOX_VIOLATION.value, message=violations[0])
        reply["violations"] = violations
        with policy.trusted():
            channel.send_to_parent(sock_fd, reply, shared)
        sys.stdout.flush()
        sys.stderr.flush()


def _exec_source(module: Any, text: str, path: str) -> None:
    """Run `text`, the source the parent's static stage checked, as the candidate module's code, under its file's
    name (the trace knows the candidate's frames by it). Compiled as text, never as bytes: a coding declaration
    (`# coding: utf-7`) would make bytes read as other code than the static stage saw. Its lines go into linecache
    first, so what Triton reads to compile a kernel (inspect.getsourcelines) and a traceback shows are these, split
    as Python numbers them (pyparse.source_lines: a form feed in a comment does not move a kernel onto a string)."""
    linecache.cache[path] = (len(text), None, pyparse.source_lines(text), path)  # no mtime: never reloaded
    exec(compile(text, path, "exec", dont_inherit=True), module.__dict__)


def _raised(exc: Exception) -> dict[str, Any]:
    """The reply for an exception a request raised. SystemError says the interpreter's own state is broken (a kernel
    wrote over the process's heap, which the CPU interpreter lets it do): the process crashed, whatever it raised."""
    reason = Reason.CRASH if isinstance(exc, SystemError) else Reason.RUNTIME_ERROR
    return _failure(reason, f"{type(exc).__name__}: {exc}", exc)


def _failure(reason: Reason, message: str, exc: BaseException | None = None) -> dict[str, Any]:
    reply: dict[str, Any] = {"ok": False, "reason": reason.value, "message": message}
    if exc is not None:
        with policy.trusted():  # formatting the traceback reads its frames, which the audit hook refuses otherwise
            info = ErrorInfo.from_exception(exc)
        reply["error"] = {"type": info.type, "message": info.message, "traceback": info.traceback}
    return reply


def _setup(state: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """Confine the process, import the candidate, build ModelNew with the reference's parameters."""
    device = msg["device"]
    clock = [time.perf_counter()]

    def lap() -> float:
        clock.append(time.perf_counter())
        return clock[-1] - clock[-2]

    laps: dict[str, float] = {}
    if device == "cuda":  # the whole CUDA context now, before confinement: later lazy loads are the candidate's
        torch.cuda.set_device(msg["gpu"])
        torch.empty(1, device="cuda").fill_(0)
        torch.cuda.synchronize()
        laps["cuda_init_s"] = lap()
        # Triton's driver stub (cuda_utils, built with gcc on first use) is trusted code: build or load it from the
        # harness's shared cache now, which the candidate will only be able to read.
        os.environ["TRITON_CACHE_DIR"] = msg["triton_shared"]
        from triton.runtime import driver
        driver.active.get_current_device()
        cudaipc.load()  # loading a library is refused once confined
        laps["triton_driver_s"] = lap()
    pol = policy.Policy(scratch=msg["scratch"], write_roots=[os.path.realpath(p) for p in msg["write_roots"]],
                        cpu_seconds=int(msg["cpu_seconds"]))
    os.environ["TRITON_CACHE_DIR"] = msg["triton_cache"]
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(msg["scratch"], "inductor")
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # compile in this process: no worker pool to start
    state["policy"] = policy.apply(pol)
    laps["confine_s"] = lap()
    with policy.trusted():  # this source's own kernels from a verified earlier check (sandbox.compiled), written
        compiled.plant(msg["triton_cache"], msg.get("compiled") or ())  # before any candidate code runs
    laps["plant_s"] = lap()
    walls = pol.walls()  # taken before any candidate code runs
    state.update(device=device, allow_compute=msg["allow_compute"], triton_cache=msg["triton_cache"])
    state["flags"] = _flags()
    if msg["candidate"] is None:  # timing the baselines alone
        return {"ok": True, "network_isolated": pol.network_isolated, "filesystem_read_only": pol.filesystem_read_only,
                "laps": laps, "walls": walls}
    state["tracer"] = trace.install(msg["candidate"], msg["seeds_dir"])
    state["scramble"] = torch.Generator(device=device).manual_seed(int(msg["seed"]) ^ 0x5C4A3B1E)
    state["interpreter"] = sys.modules.get("triton.runtime.interpreter") if device == "cpu" else None
    state["hidden"] = _hide_modules()

    spec = importlib.util.spec_from_file_location(CANDIDATE_MODULE, msg["candidate"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[CANDIDATE_MODULE] = module
    try:
        if msg.get("source") is None:
            spec.loader.exec_module(module)
        else:  # the source the parent read and checked, never the file again (it may have changed since)
            _exec_source(module, msg["source"], msg["candidate"])
    except BaseException as exc:
        return _failure(Reason.IMPORT_ERROR, f"importing the candidate failed: {type(exc).__name__}: {exc}", exc)
    state["module"] = module
    laps["import_s"] = lap()
    reply = _build(state, msg)
    laps["build_s"] = lap()
    reply["laps"] = laps
    reply["network_isolated"] = pol.network_isolated
    reply["filesystem_read_only"] = pol.filesystem_read_only
    reply["capabilities_dropped"] = pol.capabilities_dropped
    reply["walls"] = walls
    return reply


def _build(state: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    module = state["module"]
    cls = getattr(module, "ModelNew", None)
    if cls is None:
        return _failure(Reason.NO_MODEL_NEW, "the candidate module has no ModelNew")
    torch.manual_seed(msg["seed"])
    try:
        with state["tracer"].tracing(poison=True):
            model = cls(*msg["init_inputs"])
    except BaseException as exc:
        return _failure(Reason.INIT_ERROR, f"ModelNew(*get_init_inputs()) failed: {type(exc).__name__}: {exc}", exc)
    if not isinstance(model, torch.nn.Module):
        return _failure(Reason.INIT_ERROR, "ModelNew must be a torch.nn.Module")
    hooked = carry.installed_hooks(model)  # before loading parameters, which would run state-dict hooks
    if hooked:
        return _failure(Reason.SANDBOX_VIOLATION, f"ModelNew installed a hook ({hooked}); hooks run Python outside "
                        "the harness's checks")
    problem = _load_parameters(model, msg["state_dict"])
    if problem:
        return _failure(Reason.PARAMETER_MISMATCH, problem)
    state["model"] = model.to(state["device"])
    state["threads"] = threading.active_count()
    state["tasks"] = None
    state["calls"] = 0  # calls of this model: the first may fill caches, later ones must leave the state alone
    state["watch"] = None
    return {"ok": True}


def _hide_modules() -> dict[str, Any]:
    """Take the harness's modules out of sys.modules (the worker keeps its references); returned to put back while
    trusted code that imports lazily runs (the timing stage)."""
    hidden = {name: mod for name, mod in sys.modules.items() if name.split(".")[0] in HIDDEN_PREFIXES}
    for name in hidden:
        del sys.modules[name]
    return hidden


def _load_parameters(model: torch.nn.Module, ref_state: dict[str, torch.Tensor]) -> str | None:
    """Make the candidate's parameters equal to the reference's: by name, else by position when shapes line up."""
    own = model.state_dict()
    if set(own) == set(ref_state):
        for k, v in ref_state.items():
            if own[k].shape != v.shape:
                return f"parameter {k} has shape {tuple(own[k].shape)}, the reference's has {tuple(v.shape)}"
        model.load_state_dict(ref_state, strict=True)
        return None
    own_items, ref_items = list(own.items()), list(ref_state.items())
    if len(own_items) == len(ref_items) and all(a.shape == b.shape for (_, a), (_, b) in zip(own_items, ref_items)):
        with torch.no_grad():
            for (_, a), (_, b) in zip(own_items, ref_items):
                a.copy_(b)
        return None
    return (f"ModelNew's parameters {sorted(own)} do not match the reference's {sorted(ref_state)}: keep the "
            "reference's parameter names and shapes")


def _fresh(x: Any, device: str) -> Any:
    """The candidate's own copy of an input, at a fresh address."""
    if isinstance(x, tuple) and x and x[0] == "cuda-ipc":  # ("cuda-ipc", cudaipc.Lent) from the parent
        shared = cudaipc.open_lent(x[1])
        mine = shared.to(device, copy=True)  # onto this process's GPU, wherever the parent's copy lives
        del shared
        return mine
    if isinstance(x, torch.Tensor):
        return x.to(device, copy=True)
    return x


def _hand_back(outs: list[torch.Tensor], buffers: list[Any], start: int = 0) -> list[Any]:
    """Each output written into the parent's GPU buffer of the same position (`start` + its index in `outs`), shape
    and dtype (the reply then holds a marker), else sent by value through host memory."""
    sent: list[Any] = []
    for i, o in enumerate(outs):
        dest, at = None, start + i
        if at < len(buffers) and isinstance(buffers[at], tuple) and buffers[at][0] == "cuda-ipc" and o.is_cuda:
            dest = cudaipc.open_lent(buffers[at][1])
        if dest is not None and dest.shape == o.shape and dest.dtype == o.dtype and dest.device == o.device:
            dest.copy_(o.detach())
            sent.append({"__gpu_buffer__": at})
        else:  # a copy: what the call returned, as it was then (a later call may write the same tensor)
            sent.append(o.detach().to("cpu", copy=True))
        del dest
    if any(isinstance(x, dict) for x in sent):
        torch.cuda.synchronize()  # the parent reads the buffers as soon as the reply arrives
    return sent


def _int_view(t: torch.Tensor) -> torch.Tensor:
    kind = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size())
    return t.contiguous().view(kind) if kind is not None else t


def _call(state: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """Run the candidate once on the given inputs and report its outputs and behaviour."""
    inputs = [_fresh(x, state["device"]) for x in msg["inputs"]]
    reply, out = _run_call(state, inputs)
    if not reply["ok"]:
        return reply
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    reply["outputs"] = _hand_back(outs, msg.get("out_buffers") or [])
    reply["strides"] = [list(o.stride()) for o in outs]
    reply["structure"] = "tuple" if isinstance(out, (tuple, list)) else "tensor"
    _scramble_written(state)
    return reply


def _warm(state: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """A first call made only so that its kernels compile (sandbox.warmer): its outputs are dropped, its reply says
    only how it went."""
    inputs = [_fresh(x, state["device"]) for x in msg["inputs"]]
    reply, _ = _run_call(state, inputs, check_inputs=False)
    return {k: v for k, v in reply.items() if k in ("ok", "reason", "message", "seconds")}


def _plant(state: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """Kernels the candidate's other process compiled (sandbox.warmer), written into this process's own cache: none
    where they would take more than a quarter of its scratch's free space (the candidate's own compiles need it),
    and an error leaves the rest unwritten, never a failure of the candidate's."""
    files = msg.get("files") or ()
    with policy.trusted():
        try:
            room = os.statvfs(state["triton_cache"])
            if sum(len(data) for _, data in files) > room.f_bavail * room.f_frsize // 4:
                return {"ok": True, "planted": 0}
            return {"ok": True, "planted": compiled.plant(state["triton_cache"], files)}
        except (OSError, ValueError, TypeError):
            return {"ok": True, "planted": 0}


def _soak(state: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """Calls `start` to `stop` of the soak's `n`, back to back, on inputs derived from the base sets
    (timing_child.derive, which the parent repeats; sent with the first slice, kept until the last); the outputs of
    the calls in `checked` come back (into the parent's GPU buffers, in order, where it lent them), every call is
    checked here as `_call` checks one, its inputs compared with their copies only on the calls in `inputs_checked`
    (the copy and the comparison are three passes over the inputs). Nothing in a call says whether its output will
    be verified."""
    device = state["device"]
    if "base" in msg:
        state["soak"] = ([[_fresh(x, device) for x in s] for s in msg["base"]], None)
    if "soak" not in state:
        return {"ok": False, "reason": "harness_error", "message": "a soak slice came before the soak's base sets"}
    base, keep = state["soak"]
    checked, fixed = set(msg["checked"]), tuple(msg["fixed"])
    inputs_checked = set(msg["inputs_checked"])
    buffers = msg.get("out_buffers") or []
    outputs: list[torch.Tensor] = []
    strides: list[list[int]] = []
    seconds, structure = 0.0, "tensor"
    n = int(msg["n"])
    stop = int(msg.get("stop", n))
    for k in range(int(msg.get("start", 0)), stop):
        inputs = timing_child.derive(base, k, fixed)
        reply, out = _run_call(state, inputs, check_inputs=k in inputs_checked)
        seconds += reply.get("seconds", 0.0)
        if not reply["ok"]:
            reply["message"] = f"soak call {k + 1} of {msg['n']}: {reply['message']}"
            return reply
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        structure = "tuple" if isinstance(out, (tuple, list)) else "tensor"
        if k in checked:
            outputs += _hand_back(outs, buffers, start=len(outputs))
            strides += [list(o.stride()) for o in outs]
        keep = inputs  # the next call's inputs do not reuse these addresses
        _scramble_written(state)
    if stop >= n:
        state.pop("soak", None)
    else:
        state["soak"] = (base, keep)
    return {"ok": True, "outputs": outputs, "strides": strides, "structure": structure, "seconds": seconds,
            "calls": n}


def _run_call(state: dict[str, Any], inputs: list[Any], check_inputs: bool = True) -> tuple[dict[str, Any], Any]:
    """One traced call and every check the child can make on it (check_inputs: its inputs compared bitwise with
    copies taken before it); (reply, the forward's return value)."""
    device, model, tracer = state["device"], state["model"], state["tracer"]
    hooked = carry.installed_hooks(model)
    if hooked:
        return _failure(Reason.SANDBOX_VIOLATION, f"the model has a hook installed ({hooked}); hooks run Python "
                        "outside the harness's checks"), None
    # Unchecked, each input still gets a buffer of its copy's size (allocated, not written): what the allocator
    # holds, and so the addresses and torch.cuda.memory_allocated() the call sees, do not say which calls are checked.
    copies = [(_int_view(x).clone() if check_inputs else
               torch.empty(x.numel() * x.element_size(), dtype=torch.uint8, device=x.device))
              if isinstance(x, torch.Tensor) else None for x in inputs]
    pristine = copies if check_inputs else [None] * len(inputs)
    tasks_before = _native_threads()
    watch = state["watch"] or _watch(state)
    call = tracer.tracing(poison=True)
    start = time.perf_counter()
    raised: BaseException | None = None
    out = None
    with call as tr:
        try:
            out = model(*inputs)
        except BaseException as exc:  # noqa: BLE001 - reported below, after the trace says what the call did
            raised = exc
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    reply: dict[str, Any] = {"ok": True, "trace": tr.summary(), "seconds": seconds}
    state["calls"] += 1

    tampered = tracer.verify() or next(iter(tr.tampered), None)
    if tampered:
        return {**reply, **_failure(Reason.TRACE_TAMPERED, f"the forward switched off the harness's checks: "
                                    f"{tampered}")}, None
    if tr.refused:
        return {**reply, **_failure(Reason.FOREIGN_COMPUTE, f"{tr.refused[0]}: the forward computed outside its "
                                    "Triton kernels (numpy, Python, or Python code run inside a launch)",
                                    raised)}, None
    if raised is not None:
        raise raised
    if state["policy"].violations:
        return {**reply, **_failure(Reason.SANDBOX_VIOLATION, state["policy"].violations[0])}, None
    if not tr.launches:
        return {**reply, **_failure(Reason.NO_TRITON_LAUNCH, "the forward launched no Triton kernel")}, None
    if tr.foreign:
        return {**reply, **_failure(Reason.FOREIGN_KERNEL, "the forward launched Triton kernels not defined in the "
                                    f"candidate: {tr.summary()['foreign_kernels']}")}, None
    if tr.compute_ops and not state["allow_compute"]:
        return {**reply, **_failure(Reason.TORCH_COMPUTE, "the forward ran torch compute ops "
                                    f"{sorted(set(tr.compute_ops))}; only Triton kernels may compute (allocation, "
                                    "views, copies and fills are allowed)")}, None
    if threading.active_count() > state["threads"]:
        return {**reply, **_failure(Reason.THREADS_LEFT_RUNNING, "the forward left a thread running")}, None
    if state["tasks"] is not None and _native_threads() > max(state["tasks"], tasks_before):
        return {**reply, **_failure(Reason.THREADS_LEFT_RUNNING, "the forward left a native thread running")}, None
    state["tasks"] = max(state["tasks"] or 0, _native_threads())
    if _flags() != state["flags"]:
        changed = {k: v for k, v in _flags().items() if state["flags"].get(k) != v}
        return {**reply, **_failure(Reason.GLOBAL_FLAGS_CHANGED,
                                    f"the forward changed global numeric flags {changed}")}, None
    carried = _carried(state, watch)
    if carried:
        return {**reply, **_failure(Reason.STATE_CARRIED, f"the forward keeps state across calls: {carried}; after "
                                    "its first call a model's Python state (its attributes, the module's globals) "
                                    "must not change from call to call")}, None

    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    for i, o in enumerate(outs):
        if type(o) is not torch.Tensor:
            return {**reply, **_failure(Reason.OUTPUT_TYPE, f"output {i} is a {type(o).__module__}."
                                        f"{type(o).__name__}, not a plain torch.Tensor")}, None
        ptr = o.untyped_storage().data_ptr()
        if any(isinstance(x, torch.Tensor) and x.numel() and ptr == x.untyped_storage().data_ptr() for x in inputs):
            return {**reply, **_failure(Reason.OUTPUT_ALIASES_INPUT, f"output {i} shares storage with an input")}, None
    for i, (x, p) in enumerate(zip(inputs, pristine)):
        if p is not None and not torch.equal(_int_view(x), p):
            return {**reply, **_failure(Reason.INPUT_MUTATED, f"the forward modified input {i}")}, None
    return reply, out


def _watch(state: dict[str, Any]) -> tuple[dict[str, Any], list, list]:
    """The model's state as it stands: (snapshot, its tensors, what they hold)."""
    interp = state["interpreter"]
    values, tensors = carry.snapshot(state["model"], state.get("module"), CANDIDATE_MODULE,
                                     vars(interp) if interp is not None else None)
    return values, tensors, carry.signatures(tensors)


def _carried(state: dict[str, Any], before: tuple[dict[str, Any], list, list]) -> str | None:
    """After the model's second call on: what changed in its Python state. Records the tensors the call wrote."""
    values, tensors, sigs = before
    after = _watch(state)
    state["watch"], state["written"] = after, []
    if state["calls"] < 2:
        return None
    state["written"] = carry.written(tensors, sigs)
    return carry.difference(values, after[0])


def _scramble_written(state: dict[str, Any]) -> None:
    """Random bytes in every state tensor the last call wrote, before the next call can read it back."""
    if not state.get("written"):
        return
    for _, t in state["written"]:
        carry.scramble(t, state["scramble"])
    state["written"] = []
    state["watch"] = _watch(state)


def _native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _flags() -> dict[str, Any]:
    flags = {
        "matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "fp16_reduced_precision": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "bf16_reduced_precision": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "grad_enabled": torch.is_grad_enabled(),
    }
    return flags


def _rebuild(state: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """A new ModelNew for another shape variant, in the same process."""
    state.pop("model", None)
    return _build(state, msg)


def _time(state: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    return _with_hidden(state, timing_child.run, msg)


def _prepare_timing(state: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    return _with_hidden(state, timing_child.prepare, msg)


def _samples(state: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    return _with_hidden(state, lambda st, m: timing_child.samples(st, m, _hand_back), msg)


def _with_hidden(state: dict[str, Any], fn, msg: dict[str, Any]) -> dict[str, Any]:
    hidden = state.get("hidden") or {}
    sys.modules.update(hidden)  # timing_child imports the profiler and the task loader as it goes
    try:
        return fn(state, msg)
    finally:
        for name in hidden:
            sys.modules.pop(name, None)


_HANDLERS = {"setup": _setup, "call": _call, "rebuild": _rebuild, "prepare_timing": _prepare_timing, "time": _time,
             "samples": _samples, "soak": _soak, "warm": _warm, "plant": _plant}
