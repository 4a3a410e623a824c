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

Sizes. A task at another size is the file executed again with some constants replaced where the file assigns them, so
values the file derives from them (`bias_shape = (out_channels, 1, 1)`, `hidden = 4 * dim`) follow. Constants the file
computes from others are never rescaled on their own. On the CPU, `scaled_for_cpu` halves the largest literal
constants until the inputs are small, then checks that the smaller task still runs and still depends on its inputs;
where it does not, it backs off step by step towards the task's own size and says so in `rescale_note`. Constants the
user set (`--set`, `pin=True`) are never rescaled, and `rescale=False` (`--no-rescale`) keeps the task's own size.

The integer elements of a module-level tuple (`input_shape = (32768,)`) are constants too, named `input_shape[0]`
(also for `--set input_shape[0]=512`), and replaced in the tuple where the file assigns it. Constants of equal value
at the task's own size that the task ties (`torch.rand(batch_size, *input_shape)` times a `(batch_size,)` vector runs
only while `batch_size == input_shape[0]`) are halved together once halving one of them alone breaks the task.
"""
from __future__ import annotations

import hashlib
import logging
import math
import sys
import threading
import types
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from profiler.roofline import Declared

from . import pyparse
from .records import TaskError
from .task_constants import by_target, constant_value, derived_names, pin_assignments, replaced

log = logging.getLogger(__name__)

DISTRIBUTIONS = ("normal", "uniform", "large", "outliers", "constant_rows")
CPU_ELEMENT_BUDGET = 1 << 17  # largest input tensor on the CPU interpreter
CPU_PROBE_LIMIT = 1 << 26  # the largest input the rescaling's back-off runs a reference on (float64 too)
MIN_SCALABLE = 16  # integer constants below this are structural (dims, kernel sizes) and never rescaled


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
    constants: dict[str, int]  # the module-level integer constants (and tuples' elements) as the file declares them
    source_hash: str = ""
    overrides: dict[str, int] = field(default_factory=dict)
    derived: frozenset[str] = frozenset()  # constants the file computes from other names: they follow, never rescaled
    pinned: frozenset[str] = frozenset()  # constants the user set: never rescaled
    rescale: bool = True  # False: the CPU runs the task at the size it is given
    rescale_note: str = ""  # one sentence when the CPU rescaling had to back off towards the task's own size

    # ---- shapes -------------------------------------------------------------------------------------------
    def scalable(self) -> list[str]:
        return [k for k, v in self.constants.items() if v >= MIN_SCALABLE and k not in self.meta.fixed
                and k not in self.derived and k not in self.pinned]

    def with_constants(self, overrides: dict[str, int], *, pin: bool = False) -> "Task":
        """The same task with some module-level constants replaced (the file is executed again with the new values
        in place, so the values it derives from them follow). `pin`: the user chose them; never rescale them."""
        unknown = set(overrides) - set(self.constants)
        if unknown:
            raise TaskError(f"{self.path.name}: no integer constant named {', '.join(sorted(unknown))}; "
                            f"its constants are {', '.join(sorted(self.constants)) or 'none'}")
        merged = {**self.overrides, **overrides}
        merged = {k: v for k, v in merged.items() if v != self.constants[k] or k in self.pinned or pin}
        pinned = self.pinned | frozenset(overrides) if pin else self.pinned
        return _load(self.path, merged, base=self.constants, pinned=pinned, rescale=self.rescale)

    def without_rescaling(self) -> "Task":
        """This task, run on the CPU at the size it is given (`--no-rescale`)."""
        return dataclasses.replace(self, rescale=False)

    def current_constants(self) -> dict[str, int]:
        return {k: constant_value(self.module, k) for k in self.constants}

    def input_bytes(self) -> int:
        """Bytes of one call's tensor inputs at the current shapes (from a probe on the meta device: nothing is
        allocated)."""
        return sum(t.numel() * t.element_size() for t in self._shape_probe(self.current_constants())
                   if isinstance(t, torch.Tensor))

    def declared_roofline(self) -> Declared:
        """What the task declares for profiler.roofline at its current shapes (CRUCIBLE_BYTES, CRUCIBLE_FLOPS,
        CRUCIBLE_ALLOW_TF32)."""
        consts = self.current_constants()
        bytes_fn, flops_fn = formula(self.meta.bytes_formula), formula(self.meta.flops_formula)
        return Declared(bytes=float(bytes_fn(consts)) if bytes_fn is not None else None,
                        flops=float(flops_fn(consts)) if flops_fn is not None else None,
                        allow_tf32=self.meta.allow_tf32)

    def scaled_for_cpu(self, budget: int = CPU_ELEMENT_BUDGET) -> "Task":
        """The task at a size the CPU interpreter checks in seconds, still consistent and still depending on its
        inputs (module docstring); TaskError where the task fails at its own size too (the task's own fault)."""
        if not self.rescale:
            return self
        key = (str(self.path), self.source_hash, tuple(sorted(self.overrides.items())), self.pinned, budget)
        if key not in _FITTED:
            _FITTED[key] = _fit(self, budget)
        overrides, note = _FITTED[key]
        if overrides == self.overrides:
            return self
        task = _load(self.path, overrides, base=self.constants, pinned=self.pinned, rescale=self.rescale)
        task.rescale_note = note
        return task

    def _largest_input(self, consts: dict[str, int]) -> int:
        return max((t.numel() for t in self._shape_probe(consts) if isinstance(t, torch.Tensor)), default=0)

    def _halvings(self, consts: dict[str, int], frozen: set[str], budget: int,
                  ties: tuple[frozenset[str], ...] = ()) -> list[dict[str, int]]:
        """The constants after each halving (largest scalable first) until every input fits `budget` elements; a
        constant in one of `ties` is halved together with the others of its tie that still have its value."""
        steps: list[dict[str, int]] = []
        consts = dict(consts)
        for _ in range(64):
            sizes = [t.numel() for t in self._shape_probe(consts) if isinstance(t, torch.Tensor)]
            if not sizes or max(sizes) <= budget:
                break
            candidates = [k for k in self.scalable() if consts[k] >= 2 * 2 and k not in frozen]
            if not candidates:
                break
            biggest = max(candidates, key=lambda k: consts[k])
            tie = next((t for t in ties if biggest in t), frozenset({biggest}))
            value = consts[biggest]
            for k in tie:
                if consts[k] == value and k in candidates:
                    consts[k] = max(1, value // 2)
            steps.append(dict(consts))
        return steps

    def _shape_probe(self, consts: dict[str, int]) -> list[Any]:
        # Shapes only: run get_inputs under the meta device so that probing costs nothing.
        task = self if consts == self.current_constants() else _load(
            self.path, _diff(consts, self.constants, self.pinned), base=self.constants, pinned=self.pinned)
        with torch.device("meta"):
            try:
                return list(task.module.get_inputs())
            except Exception:
                pass
        return list(task.module.get_inputs())

    def shape_variants(self) -> list[dict[str, int]]:
        """Odd shapes for the robustness stage: declared ones, else derived (1, primes, non-multiples of a block),
        each kept only where the reference itself runs and depends on its inputs there (a prime channel count
        breaks `groups=8`: that is no test of the candidate)."""
        if self.meta.extra_shapes:
            return [dict(v) for v in self.meta.extra_shapes]
        consts = self.current_constants()
        names = [k for k in self.scalable() if consts[k] >= MIN_SCALABLE]
        if not names:
            return []
        key = (str(self.path), self.source_hash, tuple(sorted(self.overrides.items())), self.pinned)
        if key not in _VARIANTS:
            primes = {k: _prime_below(consts[k]) for k in names}
            wanted = [primes, {names[0]: 1, **{k: consts[k] // 2 + 1 for k in names[1:]}}]
            if _runs_on_meta(self, consts):  # else shapes cannot be tried for free: keep them all, as declared
                allowed = [v for v in wanted if _runs_on_meta(self, {**consts, **v})]
                if len(allowed) < len(wanted):  # one constant at a time, for the shapes that the task allows
                    allowed += [v for v in ({k: p} for k, p in primes.items())
                                if _runs_on_meta(self, {**consts, **v})][:len(wanted) - len(allowed)]
                wanted = allowed
            _VARIANTS[key] = wanted
        return [dict(v) for v in _VARIANTS[key]]

    # ---- instances ----------------------------------------------------------------------------------------
    def init_inputs(self) -> list[Any]:
        return list(self.module.get_init_inputs())

    def make_reference(self, seed: int, device: torch.device | str) -> torch.nn.Module:
        with SEEDED:
            torch.manual_seed(seed)
            model = self.module.Model(*self.init_inputs())
        return model.to(device).eval()

    def make_inputs(self, seed: int, distribution: str, device: torch.device | str = "cpu") -> list[Any]:
        """Inputs for one call: get_inputs() under `seed`, floating tensors redrawn from `distribution`."""
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"unknown distribution {distribution!r}")
        # get_inputs() makes its tensors on the default device: on the GPU that is the device itself, so large
        # inputs are drawn there (CPU-made inputs of several GB take seconds). Same seed, same values, whatever
        # other threads draw (SEEDED).
        with SEEDED, torch.device(device):
            torch.manual_seed(seed)
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


def load_task(path: str | Path, constants: dict[str, int] | None = None, *, rescale: bool = True) -> Task:
    """Load a task file, with `constants` (the user's --set) replaced and pinned, and `rescale=False` to keep its
    size on the CPU; TaskError with one sentence saying what to fix when it cannot be used."""
    path = Path(path).resolve()
    if not path.exists():
        raise TaskError(f"task file {path} does not exist; pass the path of a .py file that defines Model, "
                        "get_inputs() and get_init_inputs()")
    if path.suffix != ".py":
        raise TaskError(f"{path} is not a .py task file")
    task = _load(path, {}, rescale=rescale)
    return task.with_constants(constants, pin=True) if constants else task


# torch's default generators are one per process: a harness checks several candidates on threads, and a seed set by
# one thread would be drawn from by another (the parent's inputs of a timing stage then differ from the ones the
# candidate's process rebuilt from the same seed). Seeding and drawing hold this lock together.
SEEDED = threading.RLock()

# (path, source hash, overrides, pinned, budget) -> the rescaled task's overrides and its note
_FITTED: dict[tuple, tuple[dict[str, int], str]] = {}
# (path, source hash, overrides, pinned) -> the robustness stage's shape variants that the reference allows
_VARIANTS: dict[tuple, list[dict[str, int]]] = {}


def _diff(consts: dict[str, int], base: dict[str, int], pinned: frozenset[str]) -> dict[str, int]:
    return {k: v for k, v in consts.items() if v != base[k] or k in pinned}


def _fit(task: Task, budget: int) -> tuple[dict[str, int], str]:
    """Halve towards `budget`; where the smaller task fails or stops depending on its inputs, step back to the last
    size that works and halve the constant whose halving broke it together with the others of its value at the
    task's own size; where that breaks too, or it has no such partner, keep it at that size (module docstring)."""
    from .reference import check_task

    start = task.current_constants()
    consts, frozen, notes = dict(start), set(), []
    ties: dict[frozenset[str], tuple[str, int, str]] = {}  # constants halved together -> why (culprit, value, error)
    tried: set[str] = set()  # culprits already tied once
    for _ in range(2 * len(task.constants) + 1):
        steps = task._halvings(consts, frozen, budget, tuple(ties))
        if not steps:
            break
        error = _probe(task, steps[-1], check_task)
        if error is None:
            consts = steps[-1]
            break
        first_error = error
        good = -1  # the size this round started from works: probed before, or the task's own size probed here
        for i in range(len(steps) - 2, -1, -1):  # back off towards it
            if task._largest_input(steps[i]) > CPU_PROBE_LIMIT:
                raise TaskError(_too_big(task, steps[-1], steps[i], first_error))
            if _probe(task, steps[i], check_task) is None:
                good = i
                break
        if good < 0 and consts == start and not notes and not ties:
            if task._largest_input(start) > CPU_PROBE_LIMIT:
                raise TaskError(_too_big(task, steps[-1], start, first_error))
            error = _probe(task, start, check_task)
            if error is not None:  # the task fails at its own size: its own fault, said as such
                raise TaskError(f"{task.path.name} fails at its own size, without crucible's CPU rescaling: "
                                f"{_short(error)}")
        kept = steps[good] if good >= 0 else consts
        culprit = next(k for k in kept if steps[good + 1][k] != kept[k])
        consts = kept
        tied = next((t for t in ties if culprit in t), None)
        if tied is not None:  # halving them together broke it too: keep the first culprit, halve its partners alone
            culprit, bad, error = ties.pop(tied)
            notes.append((culprit, bad, error))
            frozen.add(culprit)
            continue
        bad = steps[good + 1][culprit]
        partners = frozenset(k for k in task.scalable() if k not in frozen and not any(k in t for t in ties)
                             and task.constants[k] == task.constants[culprit] and kept[k] == kept[culprit])
        if culprit not in tried and len(partners) > 1:  # the culprit itself is one of them
            ties[partners] = (culprit, bad, first_error)
            tried.add(culprit)
            continue
        notes.append((culprit, bad, first_error))
        frozen.add(culprit)
    note = ""
    if notes:
        culprit, bad, error = notes[0]
        kept = ", ".join(f"{k}={consts[k]}" for k, _, _ in notes)
        note = (f"rescaled for the CPU with {culprit}={bad}, {task.path.name} failed ({_short(error)}), so crucible "
                f"keeps {kept} and rescales the rest")
    if ties:
        said = "; ".join(f"with {c}={b} alone {task.path.name} failed ({_short(e)}), so crucible halves "
                         f"{' and '.join(sorted(t))} together" for t, (c, b, e) in ties.items())
        note = f"rescaled for the CPU, {said}" + (f"; {note}" if note else "")
    if note:
        log.info("%s", note)
    return _diff(consts, task.constants, task.pinned), note


def _too_big(task: Task, failed: dict[str, int], larger: dict[str, int], error: str) -> str:
    changed = ", ".join(f"{k}={v}" for k, v in failed.items() if v != task.constants[k])
    return (f"{task.path.name} fails once crucible shrinks it for the CPU ({changed}: {_short(error)}), and the "
            f"next larger size has an input of {task._largest_input(larger):,} elements, more than the CPU "
            f"interpreter can check; check it on a GPU (--device cuda), or pass --set NAME=VALUE with sizes it "
            f"runs at")


def _probe(task: Task, consts: dict[str, int], check_task: Callable[..., Any]) -> str | None:
    """None where the task at `consts` loads, runs and depends on its inputs (on the CPU), else why not."""
    try:
        sized = _load(task.path, _diff(consts, task.constants, task.pinned), base=task.constants,
                      pinned=task.pinned, rescale=False)
        check_task(sized, "cpu", float64=False)
    except TaskError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - the task's own code, at a size it was not written for
        return f"{type(exc).__name__}: {exc}"
    return None


def _runs_on_meta(task: Task, consts: dict[str, int]) -> bool:
    """Whether the reference builds and runs at `consts` on the meta device (shapes only, no data, no time)."""
    try:
        sized = _load(task.path, _diff(consts, task.constants, task.pinned), base=task.constants,
                      pinned=task.pinned, rescale=False)
        with torch.device("meta"):
            model = sized.module.Model(*sized.init_inputs())
            inputs = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in sized.module.get_inputs()]
            model(*inputs)
    except Exception:  # noqa: BLE001 - the task's own code at a size it may not allow
        return False
    return True


def _short(message: str, limit: int = 200) -> str:
    """An error without the task file's name in front, cut to `limit` characters."""
    head, sep, rest = message.partition(".py: ")
    message = rest if sep and " " not in head else message
    return message if len(message) <= limit else message[:limit - 3] + "..."


def _load(path: Path, overrides: dict[str, int], *, base: dict[str, int] | None = None,
          pinned: frozenset[str] = frozenset(), rescale: bool = True) -> Task:
    source = path.read_text(encoding="utf-8", errors="replace")
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    name = f"crucible_task_{digest}_{abs(hash(tuple(sorted(overrides.items())))) % 10**8}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    try:
        tree = pyparse.parse(source, str(path))
    except SyntaxError as exc:
        raise TaskError(f"{path.name} has a syntax error at line {exc.lineno}: {exc.msg}") from None
    # Overrides are pinned right after the file's own assignments, so that the values it derives from them at the
    # top level follow; one the file never assigns at the top level is set after the whole file has run.
    derived = derived_names(tree)  # of the file as written
    placed = pin_assignments(tree, overrides) if overrides else set()
    code = compile(tree, str(path), "exec")
    sys.modules[name] = module
    module.__dict__["_crucible_replaced"] = replaced
    try:
        exec(code, module.__dict__)
    except ModuleNotFoundError as exc:
        sys.modules.pop(name, None)
        raise TaskError(f"{path.name} needs the module {exc.name!r}, which is not installed; install it (for "
                        f"KernelBench's tasks: pip install 'kernel-crucible[kernelbench]')") from None
    except Exception as exc:
        sys.modules.pop(name, None)
        raise TaskError(f"{path.name} failed to load: {type(exc).__name__}: {exc}") from None
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, attr):
            raise TaskError(f"{path.name} does not define {attr}; a task file needs Model, get_inputs() "
                            "and get_init_inputs() (KernelBench's format)")
    del module.__dict__["_crucible_replaced"]
    found: dict[str, int] = {}
    for k, v in vars(module).items():
        if k.startswith("_") or k.startswith("CRUCIBLE_"):
            continue
        if type(v) is int:
            found[k] = v
        elif type(v) is tuple:  # a tuple's integer elements: `input_shape[0]`; derived where the tuple is
            found |= {f"{k}[{i}]": e for i, e in enumerate(v) if type(e) is int}
            if k in derived:
                derived |= {f"{k}[{i}]" for i in range(len(v))}
    constants = dict(base) if base is not None else found
    for k, v in by_target({k: v for k, v in overrides.items() if k not in placed}).items():
        setattr(module, k, replaced(getattr(module, k, None), v) if isinstance(v, dict) else v)
    meta = _read_meta(module, path)
    return Task(path=path, name=path.stem, module=module, meta=meta, constants=constants,
                source_hash=digest, overrides=dict(overrides), derived=frozenset(derived & set(constants)),
                pinned=pinned, rescale=rescale)


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
