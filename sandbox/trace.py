"""The launch trace: which Triton kernels a call launched, which torch ops it ran besides, and whether it took data
out of torch to compute elsewhere.

`install` (trusted code, in the candidate's process, before the candidate is imported) returns a `Tracer`. Its
state lives in closures, not in module globals, so a candidate that reaches this module finds no switch to turn:
  - Triton's `JITFunction.run` (and the interpreter's `InterpretedFunction.run`, the autotuner's `Autotuner.run`)
    are wrapped: each launch records the file and name of the kernel's Python function. Kernels must come from the
    candidate's file or from the `seeds` package (crucible's own verified kernels).
  - a TorchDispatchMode sees every aten op on every device, CPU included. The policy below splits them into glue
    (allowed always) and compute (allowed only where the task says CRUCIBLE_ALLOW_TORCH_COMPUTE).
  - a TorchFunctionMode refuses the ways out of torch: `.numpy()`, `__array__`, storages read from Python,
    `torch.from_numpy` / `torch.frombuffer`, tensors built from Python floats or arrays beyond a few values, and more
    than a few scalar reads (`.item()`, `.tolist()`, `float(t)`) a call. Results computed in numpy or Python beside
    a decoy launch are refused whatever the launch did.
While a Triton launch is in progress both modes stand aside: the launcher's own tensor copies (on the interpreter,
every argument) are Triton's, not the candidate's. So the wrapper first refuses what would run the candidate's own
Python inside that window: pre-run hooks, the autotuner's user hooks, Triton's launch and compile hooks, and on the
CPU interpreter (where a kernel body is plain Python) arguments that are callables, modules or tensors as
constexprs, and bodies that refer to anything but Triton, other @triton.jit functions and constants (a plain Python
helper, torch, numpy, `.handle` — the interpreter's raw arrays). A callable grid runs watched.
`Tracer.verify` then checks, after each call, that the wrappers and modes are still the ones installed.

The mode also poisons every fresh allocation (NaN for floating tensors, the dtype's minimum for integers), so an
output the candidate allocates but does not fully write shows up as NaN, and memory freed by anything earlier can
never pass as a result.

Glue policy (write it down, since the LLM is told the same): allocation (empty/zeros/ones/full and *_like, new_*,
arange), fills (fill_, zero_), copies and dtype/device conversion (copy_, clone, contiguous, .to), views and shape
changes (view, reshape, transpose, permute, expand, squeeze/unsqueeze, slicing, select, split/chunk/unbind, as_strided),
concatenation (cat, stack) and reading a few values into Python (.item(), float(t), a size or an index taken from
a tensor, str(t) or an f-string of it: at most SCALAR_READS values a call). Everything else is compute.
"""
from __future__ import annotations

import builtins
import dis
import inspect
import os
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from .trace_rules import (ALLOCATING_OPS, BODY_ATTRS, BODY_BUILTINS_REFUSED, BUILDERS, GLUE_OPS, PLAIN, REFUSED_FUNCS,
                          SCALAR_FUNCS, SCALAR_OP, SCALAR_READS, TEXT_FUNCS, py_data_problem)


class ForeignCompute(RuntimeError):
    """Raised inside the candidate's forward at the point it leaves torch and Triton (also recorded in the trace)."""


@dataclass
class CallTrace:
    launches: list[tuple[str, str]] = field(default_factory=list)  # (file, kernel name)
    compute_ops: list[str] = field(default_factory=list)
    foreign: list[tuple[str, str]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # computation outside torch and Triton, refused launches
    tampered: list[str] = field(default_factory=list)  # the trace's own machinery disturbed during the call
    scalar_reads: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "launches": len(self.launches),
            "kernels": sorted({name for _, name in self.launches}),
            "compute_ops": sorted(set(self.compute_ops)),
            "foreign_kernels": sorted({f"{name} ({os.path.basename(f)})" for f, name in self.foreign}),
            "refused": self.refused[:3],
        }


class _Cell:
    """The tracer's mutable state, held only by the closures `install` makes."""
    __slots__ = ("active", "in_launch", "poison", "counted")

    def __init__(self) -> None:
        self.active: CallTrace | None = None
        self.in_launch = 0
        self.poison = True
        self.counted = 0  # inside a read the function mode has counted already: its scalar ops are not counted again


def _poison(t: torch.Tensor) -> None:
    if t.numel() == 0:
        return
    with torch.no_grad():
        if t.is_floating_point() or t.is_complex():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(torch.iinfo(t.dtype).min)


def _make_modes(cell: _Cell) -> tuple[type, type]:
    """The dispatch and function mode classes, closing over `cell` (instances carry no state of their own)."""

    def refuse(trace: CallTrace, what: str) -> None:
        trace.refused.append(what)
        raise ForeignCompute(f"{what} is not allowed in the forward: compute in your Triton kernels")

    def read(trace: CallTrace, values: int) -> None:
        trace.scalar_reads += values
        if trace.scalar_reads > SCALAR_READS:
            refuse(trace, f"reading more than {SCALAR_READS} tensor values into Python (.item(), .tolist(), float(t), "
                          "str(t), a size or an index from a tensor) in one call")

    class TraceMode(TorchDispatchMode):
        """Records compute ops and poisons fresh allocations while the candidate runs."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            trace = cell.active
            if cell.in_launch or trace is None:
                return out
            name = func.__name__.split(".")[0]
            if name == SCALAR_OP and not cell.counted:
                read(trace, 1)
            elif name not in GLUE_OPS:
                trace.compute_ops.append(name)
            elif cell.poison and name in ALLOCATING_OPS and isinstance(out, torch.Tensor):
                _poison(out)
            return out

    class GuardMode(TorchFunctionMode):
        """Refuses the ways out of torch (numpy, Python lists, raw storages) while the candidate runs."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            trace = cell.active
            if trace is not None and not cell.in_launch:
                name = getattr(func, "__name__", "")
                if name in REFUSED_FUNCS:
                    refuse(trace, REFUSED_FUNCS[name])
                elif name in SCALAR_FUNCS or name in TEXT_FUNCS:
                    this = args[0] if args else None
                    read(trace, max(this.numel(), 1) if name in TEXT_FUNCS and isinstance(this, torch.Tensor) else 1)
                    cell.counted += 1
                    try:
                        return func(*args, **kwargs)
                    finally:
                        cell.counted -= 1
                elif name in BUILDERS:
                    data = args[1] if name == "new_tensor" and len(args) > 1 else (args[0] if args else None)
                    problem = py_data_problem(data)
                    if problem:
                        refuse(trace, problem)
            return func(*args, **kwargs)

    return TraceMode, GuardMode


class _Standalone:
    """tracing() without an installed tracer (the zygote warms the mode machinery with it)."""

    def __init__(self, poison: bool = True):
        self.cell = _Cell()
        self.cell.poison = poison
        dispatch, function = _make_modes(self.cell)
        self.modes = (function(), dispatch())
        self.trace = CallTrace()

    def __enter__(self) -> CallTrace:
        self.cell.active = self.trace
        for m in self.modes:
            m.__enter__()
        return self.trace

    def __exit__(self, *exc: object) -> None:
        for m in reversed(self.modes):
            m.__exit__(*exc)
        self.cell.active = None


tracing = _Standalone


class Tracer:
    """What `install` hands the worker: a context manager per call and a check that nothing was switched off."""
    __slots__ = ("_enter", "_verify")

    def __init__(self, enter: Callable[[bool], Any], verify: Callable[[], str | None]):
        self._enter, self._verify = enter, verify

    def tracing(self, poison: bool = True) -> Any:
        return self._enter(poison)

    def verify(self) -> str | None:
        """None while every hook is the one installed; else what was replaced."""
        return self._verify()


def install(candidate_file: str, seeds_dir: str) -> Tracer:
    """Wrap Triton's launch entry points and build the modes. Call once, before the candidate is imported."""
    import triton
    import triton.language as tl
    from triton import knobs
    from triton.runtime import autotuner as _autotuner
    from triton.runtime import jit as _jit

    from . import policy

    trusted = policy.trusted
    allowed_files = {os.path.realpath(candidate_file)}
    allowed_dirs = (os.path.realpath(seeds_dir) + os.sep,)
    cell = _Cell()
    dispatch_cls, function_cls = _make_modes(cell)
    try:
        from triton.runtime import interpreter as _interp
    except ImportError:  # pragma: no cover - every supported Triton has it
        _interp = None
    kernel_types: tuple[type, ...] = (_jit.JITFunction,) + ((_interp.InterpretedFunction,) if _interp else ())
    injected: dict[str, Any] = vars(_interp) if _interp is not None else {}
    code_names: dict[types.CodeType, tuple[frozenset, frozenset]] = {}

    def names_of(code: types.CodeType) -> tuple[frozenset, frozenset]:
        if code not in code_names:
            globs, attrs = set(), set()
            for ins in dis.get_instructions(code):
                if ins.opname in ("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME"):
                    globs.add(ins.argval)
                elif ins.opname in ("LOAD_ATTR", "STORE_ATTR", "DELETE_ATTR", "LOAD_METHOD"):
                    attrs.add(ins.argval)
            for const in code.co_consts:
                if isinstance(const, types.CodeType):
                    g, a = names_of(const)
                    globs |= g
                    attrs |= a
            code_names[code] = (frozenset(globs), frozenset(attrs))
        return code_names[code]

    def triton_defined(v: Any) -> bool:
        mod = getattr(v, "__module__", None) if isinstance(v, (type, types.FunctionType, types.BuiltinFunctionType)) \
            else type(v).__module__
        return isinstance(mod, str) and (mod == "triton" or mod.startswith("triton."))

    def value_problem(v: Any, attrs: frozenset, seen: set[int], depth: int = 0) -> str | None:
        if isinstance(v, PLAIN) or isinstance(v, (tl.constexpr, tl.dtype)):
            return None
        if isinstance(v, tuple):
            return next((p for p in (value_problem(x, attrs, seen, depth) for x in v) if p), None)
        if isinstance(v, _jit.KernelInterface):
            inner = v
            while not isinstance(inner, kernel_types) and hasattr(inner, "fn"):
                inner = inner.fn
            fn = getattr(inner, "fn", None)
            return body_problem(fn, seen) if isinstance(fn, types.FunctionType) else None
        if isinstance(v, types.ModuleType):
            name = v.__name__
            if not (name == "triton" or name.startswith(("triton.", "seeds.")) or name == "seeds"):
                return f"the module {name}"
            if id(v) in seen or depth > 6:
                return None
            seen.add(id(v))
            for a in attrs:
                if a in v.__dict__:
                    p = value_problem(v.__dict__[a], attrs, seen, depth + 1)
                    if p:
                        return p
            return None
        if triton_defined(v):
            return None
        what = "function" if callable(v) else type(v).__name__
        return f"{getattr(v, '__name__', what)} (a {what} from {getattr(v, '__module__', None) or type(v).__module__})"

    def body_problem(fn: types.FunctionType, seen: set[int]) -> str | None:
        if id(fn) in seen:
            return None
        seen.add(id(fn))
        globs, attrs = names_of(fn.__code__)
        bad_attrs = sorted(attrs & BODY_ATTRS)
        if bad_attrs:
            return f"the kernel {fn.__name__} reads `.{bad_attrs[0]}` (the interpreter's raw data)"
        if fn.__closure__:
            return f"the kernel {fn.__name__} closes over local variables"
        for d in (fn.__defaults__ or ()):
            p = value_problem(d, attrs, seen)
            if p:
                return f"the kernel {fn.__name__} has a default argument {p}"
        for name in globs:
            # A name the module lacks may still resolve when the body runs: the interpreter copies its own module's
            # globals (numpy as `np` among them) into the kernel's module on the kernel's first launch.
            scope = fn.__globals__ if name in fn.__globals__ else injected if name in injected else None
            if scope is not None:
                p = value_problem(scope[name], attrs, seen)
                if p:
                    return f"the kernel {fn.__name__} refers to `{name}`, {p}"
            elif name in BODY_BUILTINS_REFUSED and hasattr(builtins, name):
                return f"the kernel {fn.__name__} calls the builtin {name}"
        return None

    def arg_problem(v: Any, seen: set[int], pointer: bool = True) -> str | None:
        """`pointer`: whether the interpreter turns a tensor here into a pointer (a parameter that is not a
        tl.constexpr, or a tuple in one). Elsewhere (a constexpr, a list) the body gets the torch tensor itself, and
        its operators and methods (`*`, `.sum`, `.rsqrt`) would run torch while the trace stands aside."""
        if type(v) in (torch.Tensor, torch.nn.Parameter):
            return None if pointer else "a torch tensor as a tl.constexpr or in a list (the kernel body would get " \
                                        "the tensor itself and compute with torch)"
        if isinstance(v, PLAIN) or isinstance(v, tl.dtype):
            return None
        if isinstance(v, tl.constexpr):
            return arg_problem(v.value, seen, False)
        if isinstance(v, (tuple, list)):
            inner = pointer and isinstance(v, tuple)
            return next((p for p in (arg_problem(x, seen, inner) for x in v) if p), None)
        if isinstance(v, _jit.KernelInterface):
            return value_problem(v, frozenset(), seen)
        if type(v).__name__ in ("TensorDescriptor", "TensorDescriptorIm2Col") and triton_defined(v):
            return arg_problem(getattr(v, "base", None), seen)
        return f"an argument of type {type(v).__module__}.{type(v).__name__}"

    def constexpr_params(fn: Any) -> frozenset[str]:
        """The parameters the interpreter hands to the body as they are (GridExecutor's own test)."""
        normalize = getattr(_jit, "_normalize_ty", None)
        if not isinstance(fn, types.FunctionType) or normalize is None:
            return frozenset()
        return frozenset(name for name, ty in inspect.get_annotations(fn).items() if normalize(ty) == "constexpr")

    def hooks_problem(kernel: Any) -> str | None:
        for hook in getattr(kernel, "pre_run_hooks", None) or ():
            if not triton_defined(hook):
                return "the kernel has a pre-run hook"
        if getattr(kernel, "launch_metadata", None) is not None:
            return "the kernel has a launch_metadata callback"
        rt = knobs.runtime
        for name in ("launch_enter_hook", "launch_exit_hook"):
            chain = getattr(rt, name, None)
            if chain is not None and getattr(chain, "calls", None):
                return f"triton.knobs.runtime.{name} is set"
        for name in ("jit_cache_hook", "jit_post_compile_hook", "add_stages_inspection_hook"):
            if getattr(rt, name, None) is not None:
                return f"triton.knobs.runtime.{name} is set"
        if getattr(knobs.autotuning, "listener", None) is not None:
            return "triton.knobs.autotuning.listener is set"
        return None

    def refuse_launch(trace: CallTrace, name: str, problem: str) -> None:
        trace.refused.append(f"launching {name}: {problem}")
        raise ForeignCompute(f"launching {name} is refused: {problem}. A launch may run only Triton code: no hooks, "
                             "no Python callables or tensors as constexprs, and kernel bodies that call only Triton "
                             "and other @triton.jit functions")

    def watched(grid: Any) -> Any:
        if not callable(grid):
            return grid

        def run_grid(*a: Any, **k: Any) -> Any:
            depth, cell.in_launch = cell.in_launch, 0  # the grid function is the candidate's code: watch it
            try:
                return grid(*a, **k)
            finally:
                cell.in_launch = depth
        return run_grid

    def wrap(cls: type, interpreted: bool) -> Callable:
        original = cls.run

        def run(self, *args, **kwargs):
            trace = cell.active
            if trace is not None and cell.in_launch == 0:
                fn = getattr(self, "fn", None)
                code = getattr(fn, "__code__", None)
                origin = os.path.realpath(code.co_filename) if code else "?"
                name = getattr(fn, "__name__", "?")
                record = (origin, name)
                trace.launches.append(record)
                if origin not in allowed_files and not origin.startswith(allowed_dirs):
                    trace.foreign.append(record)
                problem = hooks_problem(self)
                if problem is None and interpreted:
                    seen: set[int] = set()
                    names = list(getattr(self, "arg_names", ()))
                    consts = constexpr_params(fn)
                    problem = next((p for p in (arg_problem(v, seen, (names[k] if isinstance(k, int) and k < len(names)
                                                                      else k) not in consts) for k, v in
                                                list(enumerate(args)) + [kv for kv in kwargs.items() if kv[0] != "grid"])
                                    if p), None)
                    if problem is None and isinstance(fn, types.FunctionType):
                        problem = body_problem(fn, seen)
                if problem is not None:
                    refuse_launch(trace, name, problem)
                if "grid" in kwargs:
                    kwargs["grid"] = watched(kwargs["grid"])
            cell.in_launch += 1
            try:
                with trusted():
                    return original(self, *args, **kwargs)
            finally:
                cell.in_launch -= 1

        cls.run = run
        return run

    def wrap_autotuner(cls: type) -> Callable:
        original = cls.run

        def run(self, *args, **kwargs):
            trace = cell.active
            if trace is not None and cell.in_launch == 0:
                user = [h for h in (getattr(self, "pre_hook", None), getattr(self, "post_hook", None))
                        if h is not None and not triton_defined(h)]
                user += [c.pre_hook for c in getattr(self, "configs", ()) if getattr(c, "pre_hook", None)]
                if user or getattr(self, "user_defined_pre_hook", False) or getattr(self, "user_defined_post_hook",
                                                                                    False):
                    fn = getattr(self, "base_fn", None) or getattr(self, "fn", None)
                    refuse_launch(trace, getattr(fn, "__name__", "?"), "the autotuner has a pre_hook or post_hook")
            return original(self, *args, **kwargs)

        cls.run = run
        return run

    runs = {_jit.JITFunction: wrap(_jit.JITFunction, False)}
    if _interp is not None:
        runs[_interp.InterpretedFunction] = wrap(_interp.InterpretedFunction, True)
    runs[_autotuner.Autotuner] = wrap_autotuner(_autotuner.Autotuner)
    getitem = _jit.KernelInterface.__getitem__
    grid_call = _interp.GridExecutor.__call__ if _interp is not None else None

    def guarded(original: Callable, what: str) -> Callable:
        def guard(*args: Any, **kwargs: Any) -> Any:
            trace = cell.active
            if trace is not None and not cell.in_launch:
                trace.refused.append(what)
                raise ForeignCompute(f"{what} is not allowed in the forward: compute in your Triton kernels")
            return original(*args, **kwargs)
        return guard

    # Not torch functions, so the function mode never sees them: guarded where they live.
    torch_guards = {name: guarded(getattr(torch, name), f"torch.{name}") for name in ("from_numpy", "frombuffer")}
    for name, guard in torch_guards.items():
        setattr(torch, name, guard)
    storage_guards = {}
    for name in ("__getitem__", "__iter__", "tolist"):
        if hasattr(torch.UntypedStorage, name):
            storage_guards[name] = guarded(getattr(torch.UntypedStorage, name), "reading a storage from Python")
            setattr(torch.UntypedStorage, name, storage_guards[name])
    dispatch_hook = dispatch_cls.__dict__["__torch_dispatch__"]
    function_hook = function_cls.__dict__["__torch_function__"]

    def verify() -> str | None:
        for cls, run in runs.items():
            if cls.run is not run:
                return f"{cls.__name__}.run was replaced"
        if _jit.KernelInterface.__getitem__ is not getitem:
            return "KernelInterface.__getitem__ was replaced"
        if grid_call is not None and _interp.GridExecutor.__call__ is not grid_call:
            return "the interpreter's GridExecutor was replaced"
        for name, guard in torch_guards.items():
            if getattr(torch, name) is not guard:
                return f"torch.{name} was replaced"
        for name, guard in storage_guards.items():
            if getattr(torch.UntypedStorage, name) is not guard:
                return f"torch.UntypedStorage.{name} was replaced"
        if dispatch_cls.__dict__.get("__torch_dispatch__") is not dispatch_hook or \
                function_cls.__dict__.get("__torch_function__") is not function_hook:
            return "the trace's modes were changed"
        return None

    class Call:
        __slots__ = ("trace", "modes", "poison")

        def __init__(self, poison: bool):
            self.trace = CallTrace()
            self.modes = (function_cls(), dispatch_cls())
            self.poison = poison

        def __enter__(self) -> CallTrace:
            cell.active, cell.in_launch, cell.poison = self.trace, 0, self.poison
            for m in self.modes:
                m.__enter__()
            return self.trace

        def __exit__(self, *exc: object) -> None:
            # The modes must still be the innermost ones: a mode the candidate pushed and left would otherwise be
            # popped in ours' place, and ours would stay.
            stack = _get_current_dispatch_mode_stack()
            functions = _get_current_function_mode_stack()
            if not stack or stack[-1] is not self.modes[1] or not functions or functions[-1] is not self.modes[0]:
                self.trace.tampered.append("the forward left a torch mode of its own installed")
            cell.active = None
            for m in reversed(self.modes):
                m.__exit__(*exc)
            if cell.in_launch:
                self.trace.tampered.append("the forward ended inside a Triton launch")
                cell.in_launch = 0

    return Tracer(Call, verify)
