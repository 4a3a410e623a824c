"""Loading task files in KernelBench's format, their optional metadata, shape rescaling and input generation.

A task file defines `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`, with shapes as module-level
constants. KernelBench's own files load unmodified. A task may also declare, all optional:

    CRUCIBLE_ALLOW_TORCH_COMPUTE = False   # may a candidate call torch compute ops besides its Triton kernels
    CRUCIBLE_ALLOW_TF32 = False            # float32 outputs checked at tf32 tolerance
    CRUCIBLE_TOLERANCE_SCALE = 1.0         # multiplies every tolerance of sandbox.tolerance
    CRUCIBLE_DISTRIBUTIONS = [...]         # subset of DISTRIBUTIONS to draw inputs from
    CRUCIBLE_FIXED_INPUTS = [2]            # indices of inputs never redrawn (tables, masks, scales)
    CRUCIBLE_FIXED = ["D"]                 # integer constants never rescaled (head dims, kernel sizes)
    CRUCIBLE_EXTRA_SHAPES = [{"N": 7}]     # shape variants for the robustness stage (else derived)
    CRUCIBLE_DETERMINISTIC = True          # repeated runs must agree bitwise
    CRUCIBLE_BYTES = "lambda c: ..."       # minimum bytes moved, from the constants dict c (else from tensors)
    CRUCIBLE_FLOPS = "lambda c: ..."       # FLOPs, from the constants dict c (else counted on the reference)

The task file is the user's own code and is trusted: it runs in the harness's process, never the candidate's.
"""
from __future__ import annotations

import hashlib
import importlib.util
import math
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

DISTRIBUTIONS = ("normal", "uniform", "large", "outliers", "constant_rows")
CPU_ELEMENT_BUDGET = 1 << 17  # largest input tensor on the CPU interpreter
MIN_SCALABLE = 16  # integer constants below this are structural (dims, kernel sizes) and never rescaled


class TaskError(Exception):
    """The task file cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class TaskMeta:
    allow_torch_compute: bool = False
    allow_tf32: bool = False
    tolerance_scale: float = 1.0
    distributions: tuple[str, ...] = DISTRIBUTIONS
    fixed_inputs: tuple[int, ...] = ()
    fixed: tuple[str, ...] = ()
    extra_shapes: tuple[dict[str, int], ...] = ()
    deterministic: bool = True
    bytes_formula: str | None = None
    flops_formula: str | None = None


@dataclass
class Task:
    path: Path
    name: str
    module: types.ModuleType
    meta: TaskMeta
    constants: dict[str, int]  # the module-level integer constants as the file declares them
    source_hash: str = ""
    overrides: dict[str, int] = field(default_factory=dict)

    # ---- shapes -------------------------------------------------------------------------------------------
    def scalable(self) -> list[str]:
        return [k for k, v in self.constants.items() if v >= MIN_SCALABLE and k not in self.meta.fixed]

    def with_constants(self, overrides: dict[str, int]) -> "Task":
        """The same task with some module-level constants replaced (the module is re-executed, never mutated)."""
        merged = {**self.overrides, **overrides}
        unknown = set(overrides) - set(self.constants)
        if unknown:
            raise TaskError(f"{self.path.name}: no integer constant named {sorted(unknown)}")
        return _load(self.path, merged)

    def current_constants(self) -> dict[str, int]:
        return {k: int(getattr(self.module, k)) for k in self.constants}

    def scaled_for_cpu(self, budget: int = CPU_ELEMENT_BUDGET) -> "Task":
        """Shrink scalable constants (largest first, halving) until every input has at most `budget` elements."""
        consts = self.current_constants()
        for _ in range(64):
            sizes = [t.numel() for t in self._shape_probe(consts) if isinstance(t, torch.Tensor)]
            if not sizes or max(sizes) <= budget:
                break
            candidates = [k for k in self.scalable() if consts[k] >= 2 * 2]
            if not candidates:
                break
            biggest = max(candidates, key=lambda k: consts[k])
            consts[biggest] = max(1, consts[biggest] // 2)
        changed = {k: v for k, v in consts.items() if v != self.constants[k]}
        return self.with_constants(changed) if changed else self

    def _shape_probe(self, consts: dict[str, int]) -> list[Any]:
        # Shapes only: run get_inputs under the meta device so that probing costs nothing.
        task = self if consts == self.current_constants() else self.with_constants(
            {k: v for k, v in consts.items() if v != self.constants[k]})
        with torch.device("meta"):
            try:
                return list(task.module.get_inputs())
            except Exception:
                pass
        return list(task.module.get_inputs())

    def shape_variants(self) -> list[dict[str, int]]:
        """Odd shapes for the robustness stage: declared ones, else derived (1, primes, non-multiples of a block)."""
        if self.meta.extra_shapes:
            return [dict(v) for v in self.meta.extra_shapes]
        consts = self.current_constants()
        names = [k for k in self.scalable() if consts[k] >= MIN_SCALABLE]
        if not names:
            return []
        primes = {k: _prime_below(consts[k]) for k in names}
        variants = [primes]
        first = names[0]
        variants.append({first: 1, **{k: consts[k] // 2 + 1 for k in names[1:]}})
        return variants

    # ---- instances ----------------------------------------------------------------------------------------
    def init_inputs(self) -> list[Any]:
        return list(self.module.get_init_inputs())

    def make_reference(self, seed: int, device: torch.device | str) -> torch.nn.Module:
        torch.manual_seed(seed)
        model = self.module.Model(*self.init_inputs())
        return model.to(device).eval()

    def make_inputs(self, seed: int, distribution: str, device: torch.device | str = "cpu") -> list[Any]:
        """Inputs for one call: get_inputs() under `seed`, floating tensors redrawn from `distribution`."""
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"unknown distribution {distribution!r}")
        torch.manual_seed(seed)
        # get_inputs() makes its tensors on the default device: on the GPU that is the device itself, so large
        # inputs are drawn there (CPU-made inputs of several GB take seconds). Same seed, same values.
        with torch.device(device):
            inputs = list(self.module.get_inputs())
        gens: dict[torch.device, torch.Generator] = {}
        out = []
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor) and x.is_floating_point() and i not in self.meta.fixed_inputs:
                if x.device not in gens:
                    gens[x.device] = torch.Generator(device=x.device).manual_seed(seed ^ 0x5EED)
                x = _redraw(x.detach(), distribution, gens[x.device])
            if isinstance(x, torch.Tensor):
                x = x.to(device)
            out.append(x)
        return out


def load_task(path: str | Path) -> Task:
    """Load a task file; TaskError with one sentence saying what to fix when it cannot be used."""
    path = Path(path).resolve()
    if not path.exists():
        raise TaskError(f"task file {path} does not exist; pass the path of a .py file that defines Model, "
                        "get_inputs() and get_init_inputs()")
    if path.suffix != ".py":
        raise TaskError(f"{path} is not a .py task file")
    return _load(path, {})


def _load(path: Path, overrides: dict[str, int]) -> Task:
    source = path.read_text(encoding="utf-8", errors="replace")
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    name = f"crucible_task_{digest}_{abs(hash(tuple(sorted(overrides.items())))) % 10**8}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    try:
        code = compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise TaskError(f"{path.name} has a syntax error at line {exc.lineno}: {exc.msg}") from None
    # Constants are overridden by executing the file with the new values pinned after each assignment:
    # the module is executed once, then the overrides are applied, then module-level code that derives
    # from them (rare in task files) is not re-run — get_inputs() reads the globals at call time.
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise TaskError(f"{path.name} failed to load: {type(exc).__name__}: {exc}") from None
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, attr):
            raise TaskError(f"{path.name} does not define {attr}; a task file needs Model, get_inputs() "
                            "and get_init_inputs() (KernelBench's format)")
    constants = {k: int(v) for k, v in vars(module).items()
                 if type(v) is int and not k.startswith("_") and not k.startswith("CRUCIBLE_")}
    for k, v in overrides.items():
        setattr(module, k, v)
    meta = _read_meta(module, path)
    task = Task(path=path, name=path.stem, module=module, meta=meta, constants=constants,
                source_hash=digest, overrides=dict(overrides))
    return task


def _read_meta(module: types.ModuleType, path: Path) -> TaskMeta:
    def get(name: str, default: Any) -> Any:
        return getattr(module, "CRUCIBLE_" + name, default)
    dists = tuple(get("DISTRIBUTIONS", DISTRIBUTIONS))
    bad = [d for d in dists if d not in DISTRIBUTIONS]
    if bad:
        raise TaskError(f"{path.name}: CRUCIBLE_DISTRIBUTIONS names unknown {bad}; choose from {list(DISTRIBUTIONS)}")
    return TaskMeta(
        allow_torch_compute=bool(get("ALLOW_TORCH_COMPUTE", False)),
        allow_tf32=bool(get("ALLOW_TF32", False)),
        tolerance_scale=float(get("TOLERANCE_SCALE", 1.0)),
        distributions=dists,
        fixed_inputs=tuple(int(i) for i in get("FIXED_INPUTS", ())),
        fixed=tuple(get("FIXED", ())),
        extra_shapes=tuple(dict(s) for s in get("EXTRA_SHAPES", ())),
        deterministic=bool(get("DETERMINISTIC", True)),
        bytes_formula=get("BYTES", None),
        flops_formula=get("FLOPS", None),
    )


def _redraw(x: torch.Tensor, distribution: str, gen: torch.Generator) -> torch.Tensor:
    dtype, shape, dev = x.dtype, x.shape, x.device
    if distribution == "normal" or x.numel() == 0:
        return x
    if distribution == "uniform":
        y = torch.rand(shape, generator=gen, dtype=torch.float32, device=dev) * 2 - 1
    elif distribution == "large":
        y = torch.randn(shape, generator=gen, dtype=torch.float32, device=dev) * 100.0
    elif distribution == "outliers":
        y = torch.randn(shape, generator=gen, dtype=torch.float32, device=dev)
        flat = y.view(-1)
        n = max(1, flat.numel() // 1000)
        idx = torch.randint(0, flat.numel(), (n,), generator=gen, device=dev)
        signs = torch.randint(0, 2, (n,), generator=gen, device=dev).float() * 2 - 1
        flat[idx] = signs * 50.0
    elif distribution == "constant_rows":
        rows = torch.randn(shape[:-1] + (1,) if len(shape) else (), generator=gen, dtype=torch.float32, device=dev)
        y = rows.expand(shape).contiguous() if len(shape) else rows
    else:
        raise ValueError(distribution)
    return y.to(dtype)


def _prime_below(n: int) -> int:
    for c in range(max(2, n - 1), 1, -1):
        if all(c % p for p in range(2, int(math.isqrt(c)) + 1)):
            return c
    return 2


def formula(expr: str | None) -> Callable[[dict[str, int]], float] | None:
    """A task's CRUCIBLE_BYTES / CRUCIBLE_FLOPS lambda text, compiled (the task is trusted code)."""
    if not expr:
        return None
    fn = eval(expr, {"math": math})  # noqa: S307 - task files are the user's own trusted code
    return fn if callable(fn) else (lambda c, v=fn: float(v))
