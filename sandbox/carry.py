"""State a candidate carries from one call to the next, seen from inside its process (trusted code, sandbox.worker).

The rule: after the first call of a model, its Python-visible state does not change between calls. That state is the
model's attributes, recursively (submodules, lists, dicts, objects of the candidate's own classes), and the
candidate module's globals (the candidate's own functions and classes included: their default arguments, closures
and class attributes), and what the interpreter's own objects hold: a bound method's object (`{}.get` keeps its
dict), an iterator's position and source. A counter (`self.n += 1`), a dict of cached outputs, a tensor stored anew
each call: all change. Triton's kernels and autotuners keep compiled-kernel and timing caches that legitimately
grow: they are compared by identity, and what the candidate set on them (any attribute Triton's own code does not
set: a counter or a dict on a kernel) is walked; a kernel compiled on first use is not state, and a cache filled at
the first call of each shape is fine too, since the first call after each (re)build is not compared. Other Triton
and torch objects (a `triton.Config`'s kwargs) are walked like any object, and a torch generator is compared by its
seed and state. A state tensor that views part of its storage is compared (and scrambled) as the whole storage,
which `as_strided` reaches. Past its limits (MAX_ITEMS, MAX_DEPTH, MAX_ENTRIES) the walk refuses the model rather
than leave the rest unseen.

Tensors held in that state are the other half: one that a call (after the first) writes — a workspace, or a cache —
is overwritten with random bytes before the next call, so a result kept there cannot come back, and a counter kept
there reads garbage. An honest workspace is written before it is read and does not notice.

The walk runs outside the trace, so it must run none of the candidate's code: types are read with type() (an object's
`__class__` can lie to isinstance), containers through their base type's own methods (a subclass may override
`items` or `__iter__`), scalars through their base type's conversions, and a tensor subclass in the state, whose
methods (`data_ptr`, `stride`, `__torch_function__`) would be the candidate's, is refused (`StateRefused`): state
tensors are plain tensors or parameters.
"""
from __future__ import annotations

import ast
import collections
import functools
import hashlib
import inspect
import itertools
import sys
import types
from typing import Any, Iterator

import torch

from . import pyparse

# How much state a walk looks at: past any of these it refuses the model (StateRefused) rather than leave the rest
# unseen (a store behind item 513 of a list, 14 lists down or after 20000 paths of padding).
MAX_ENTRIES = 100000  # paths recorded per snapshot
MAX_ITEMS = 4096      # items of one container
MAX_DEPTH = 40
CLONE_BYTES = 64 << 20  # tensors up to this size are compared exactly, larger ones by a checksum
_SCALARS = (int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device)
# A subclass of a scalar type, as a plain value made by the base type's own conversion (no method of the subclass).
_PLAIN = ((bool, bool.__index__), (int, int.__index__), (float, float.__float__), (str, str.__str__),
          (bytes, bytes.__bytes__), (complex, complex.__complex__))
TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


class StateRefused(TypeError):
    """The model's state holds something the walk cannot look at without running the candidate's code."""


def _is(v: Any, kinds: Any) -> bool:
    return issubclass(type(v), kinds)


def _items(v: Any) -> list[Any]:
    """A container's items through its base type's own iterator: a subclass's `__iter__`/`items` never runs."""
    for base in (list, tuple, collections.deque, dict, set, frozenset):
        if _is(v, base):
            return list(dict.items(v)) if base is dict else list(base.__iter__(v))
    raise TypeError(type(v))


def _key(k: Any) -> str:
    plain = (str, int, float, bool, type(None))
    if type(k) in plain or (type(k) is tuple and all(type(x) in plain for x in k)):
        return repr(k)[:60]  # exact builtin types only: a subclass's __repr__ would be the candidate's
    return f"<{type(k).__name__}>"


# Triton's launchers (kernels, autotuners, heuristics) and its runtime's other objects (drivers, compiled kernels),
# whose caches change legitimately, by their own modules.
_LAUNCHER_MODULES = ("triton.runtime", "triton.backends", "triton.compiler", "triton.knobs",
                     "triton.experimental.gluon._runtime")
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not the interpreter's own C type


def _launcher(v: Any) -> bool:
    """A kernel, autotuner or heuristics object of Triton's own (a subclass the candidate made is walked as its)."""
    mod = _MODULE.__get__(type(v)) or ""
    return mod.startswith(_LAUNCHER_MODULES) and _NAME.__get__(type(v)) != "Config"


@functools.lru_cache(maxsize=None)
def launcher_own(cls: type) -> frozenset[str]:
    """The attribute names Triton's own code gives a launcher of class `cls`: every `self.<name> = ...` in the
    modules that define its classes, and every name those classes define (a cached property fills the instance's
    dict under its own name). Read from the installed Triton's source, so it follows Triton's version: what a
    kernel sets on itself as it compiles and tunes (lazily, at its first launch or a new tuning key)."""
    names: set[str] = set()
    for klass in _MRO.__get__(cls):
        mod = sys.modules.get(_MODULE.__get__(klass) or "")
        if mod is None or not (mod.__name__ or "").startswith("triton"):
            continue
        names.update(_CLASS_DICT.__get__(klass))
        names.update(_self_stores(mod.__name__))
    return frozenset(names)


def warm() -> None:
    """Read the launcher classes' own names once (the zygote, before it forks: every check inherits them)."""
    from triton.runtime import autotuner, interpreter, jit
    for cls in (jit.JITFunction, autotuner.Autotuner, autotuner.Heuristics, interpreter.InterpretedFunction):
        launcher_own(cls)


@functools.lru_cache(maxsize=None)
def _self_stores(module_name: str) -> frozenset[str]:
    try:
        tree = pyparse.parse(inspect.getsource(sys.modules[module_name]), module_name)
    except (OSError, TypeError, SyntaxError):
        return frozenset()
    return frozenset(n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                     and isinstance(n.value, ast.Name) and n.value.id == "self")


def _launcher_parts(path: str, v: Any) -> list[tuple[str, Any]]:
    """What a launcher holds beyond Triton's own attributes (a counter or a dict the candidate set on its kernel)."""
    own = launcher_own(type(v))
    return [(f"{path}.{k}", x) for k, x in (_instance_dict(v) or {}).items() if k not in own]


def _interpreter_object(v: Any) -> bool:
    """An object of one of the interpreter's own C types (an iterator, a bound builtin method, a map)."""
    return _MODULE.__get__(type(v)) == "builtins" and not type(v).__flags__ & _HEAP_TYPE


def _whole(t: torch.Tensor) -> torch.Tensor:
    """What a state tensor's calls can reach: its whole storage (as bytes) where the tensor is a view of part of it,
    since `as_strided` reaches the rest (a zero-element view of a buffer would hide a store); else the tensor."""
    storage = t.untyped_storage()
    if storage.nbytes() == t.numel() * t.element_size():
        return t
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, 0, (storage.nbytes(),), (1,))


def _generator_state(g: torch.Generator) -> tuple:
    state = torch.Generator.get_state(g)
    return "generator", torch.Generator.initial_seed(g), hashlib.sha256(state.numpy().tobytes()).hexdigest()


_DICT_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))


# Read past any metaclass of the candidate's (its __getattribute__ would run on `cls.__mro__`).
_CLASS_DICT, _MRO, _QUALNAME, _MODULE, _NAME = (type.__dict__[k] for k in ("__dict__", "__mro__", "__qualname__",
                                                                             "__module__", "__name__"))


def _name(v: Any) -> str:
    return _QUALNAME.__get__(type(v))


def _instance_dict(v: Any) -> dict[str, Any] | None:
    """An object's attribute dict through the interpreter's own `__dict__` slot; None where it has none, or where a
    class of the candidate's puts something else (a property) in that slot's place."""
    for cls in _MRO.__get__(type(v)):
        slot = _CLASS_DICT.__get__(cls).get("__dict__")
        if slot is not None:
            return dict(slot.__get__(v, type(v))) if type(slot) is types.GetSetDescriptorType else None
    return None


def _attributes(v: Any) -> dict[str, Any]:
    """An object's attributes without running its class's code: its instance dict, then its filled slots."""
    attrs = _instance_dict(v) or {}
    for cls in _MRO.__get__(type(v)):
        for name, slot in _CLASS_DICT.__get__(cls).items():  # slot descriptors only: a property would run
            if type(slot) is types.MemberDescriptorType:     # the candidate's code
                try:
                    attrs[name] = slot.__get__(v, type(v))
                except AttributeError:  # an empty slot
                    pass
    return attrs


def _code_state(v: Any) -> Iterator[tuple[str, Any]]:
    """(path suffix, value) of the state a candidate's class or function holds, one at a time: a class's own
    attributes (dunders aside); a function's defaults, filled closure cells and attributes."""
    if _is(v, type):
        for k, x in list(_CLASS_DICT.__get__(v).items()):
            if not (k.startswith("__") and k.endswith("__")):
                yield f".{k}", x
    else:
        yield ".<defaults>", v.__defaults__
        yield ".<kwdefaults>", v.__kwdefaults__
        yield ".<closure>", tuple(c.cell_contents for c in v.__closure__ or () if _filled(c))
        yield ".<attributes>", dict(vars(v))


def _object(path: str, v: Any) -> tuple[Any, list[tuple[str, Any]]]:
    """An object that is no tensor, scalar, container, module, function or class: (its comparable value, the
    (path, value) pairs to walk below it)."""
    if _MODULE.__get__(type(v)) == "itertools":
        return repr(v)[:200], []  # count(n) and the like show their position
    if _is(v, (types.BuiltinMethodType, types.MethodWrapperType)):
        owner = v.__self__  # neither type can be subclassed: this reads the interpreter's own slot
        # not its id (a reduction below makes temporaries); `{...}.get`: the dict lives on as the method's object
        return (_name(v),), [] if _is(owner, types.ModuleType) else [(f"{path}.__self__", owner)]
    if _is(v, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
        raise StateRefused(f"`{path}` holds a generator, whose position carries from call to call unseen: "
                           "keep no generator in a model's state")
    if _is(v, torch.Generator):  # a subclass's state too, read through the base class's own methods
        return _generator_state(v), [(f"{path}.{k}", x) for k, x in _attributes(v).items()]
    if _launcher(v):
        return (_name(v), id(v)), _launcher_parts(path, v)
    if type(v) in _DICT_VIEWS:  # `{...}.values()`: the dict lives on behind the view
        items = list(itertools.islice(type(v).__iter__(v), MAX_ITEMS + 1))
        _within_limits(path, items=len(items))
        return (_name(v), len(items)), [(f"{path}[{i}]", x) for i, x in enumerate(items)]
    if _interpreter_object(v):
        try:  # the C type's own reduction: an iterator's source and position, a map's function and iterator
            parts = type(v).__reduce__(v)
        except Exception:  # noqa: BLE001 - a type that cannot be reduced shows as its name only
            parts = None
        below = [(f"{path}.<state>", tuple.__getitem__(parts, slice(1, None)))] if _is(parts, tuple) else []
        return (_name(v),), below + [(f"{path}.{k}", x) for k, x in _attributes(v).items()]  # a property's fget
    if _is(v, functools._lru_cache_wrapper):  # by type: a getattr would run a candidate's property
        return ("lru_cache", id(v), v.cache_info().currsize), []
    return (_name(v), id(v)), [(f"{path}.{k}", x) for k, x in _attributes(v).items()]


def _within_limits(path: str, entries: int = 0, depth: int = 0, items: int = 0) -> None:
    """Refuses state past the walk's limits, saying which, rather than leave the rest unseen."""
    if items > MAX_ITEMS:
        raise StateRefused(f"`{path}` holds more than {MAX_ITEMS} items, more than the harness looks at between "
                           "calls: keep large tables in tensors")
    if entries >= MAX_ENTRIES:
        raise StateRefused(f"the model's state holds more than {MAX_ENTRIES} values (at `{path}`), more than the "
                           "harness looks at between calls: keep large tables in tensors")
    if depth > MAX_DEPTH:
        raise StateRefused(f"the model's state is nested more than {MAX_DEPTH} levels deep (at `{path}`), deeper "
                           "than the harness looks between calls")


def snapshot(model: Any, module: types.ModuleType | None, candidate: str,
             injected: dict[str, Any] | None = None) -> tuple[dict[str, Any], list]:
    """(path -> comparable value, [(path, tensor)]) for the model and the candidate module's globals. `injected`:
    globals Triton's interpreter copies into a kernel's module when it first runs that kernel (its own module's
    globals, `np` among them), skipped where the module holds that very object."""
    injected = injected or {}
    values: dict[str, Any] = {}
    tensors: list[tuple[str, torch.Tensor]] = []
    seen: set[int] = set()
    alive: list[Any] = []

    def walk(path: str, v: Any, depth: int) -> None:
        _within_limits(path, len(values), depth)
        if _is(v, torch.Tensor):
            if type(v) not in TENSOR_TYPES:
                raise StateRefused(f"`{path}` holds a tensor subclass ({_name(v)}): tensors in a model's "
                                   "state must be plain torch.Tensor or nn.Parameter")
            values[path] = ("tensor", v.data_ptr(), tuple(v.shape), tuple(v.stride()), str(v.dtype))
            if id(v) not in seen:
                seen.add(id(v))
                tensors.append((path, _whole(v)))
                for k, x in (_instance_dict(v) or {}).items():  # `self.w.calls += 1`: an attribute set on a tensor
                    walk(f"{path}.{k}", x, depth + 1)
            return
        if type(v) not in _SCALARS:
            for base, plain in _PLAIN:
                if _is(v, base):
                    values[path] = (_name(v), repr(plain(v)))
                    return
        if type(v) is float:
            values[path] = repr(v)  # NaN equals itself
            return
        if type(v) in _SCALARS:
            values[path] = v
            return
        if id(v) in seen:
            values[path] = ("seen", _name(v))  # not its id: that of a temporary is not stable
            return
        seen.add(id(v))
        alive.append(v)  # no id is reused during the walk (the walk makes temporaries: attribute dicts, closures)
        if _is(v, (list, tuple, collections.deque, set, frozenset, dict)):
            items = _items(v)
            _within_limits(path, items=len(items))
            if _is(v, dict):
                values[path] = ("dict", len(items))
                for i, (k, x) in enumerate(items):
                    key = _key(k)
                    if key.startswith("<"):  # an object as a key: what it holds is state too
                        key = f"{i}:{key}"
                        walk(f"{path}.<key {i}>", k, depth + 1)
                    walk(f"{path}[{key}]", x, depth + 1)
                return
            values[path] = (_NAME.__get__(type(v)), len(items))
            items = sorted(items, key=_key) if _is(v, (set, frozenset)) else items
            for i, x in enumerate(items):
                walk(f"{path}[{i}]", x, depth + 1)
        elif _is(v, types.ModuleType):
            values[path] = ("module", v.__name__)
        elif _is(v, (types.FunctionType, type)):
            values[path] = (_NAME.__get__(type(v)), id(v))
            owner = _CLASS_DICT.__get__(v).get("__module__") if _is(v, type) else v.__module__
            if owner == candidate:
                for suffix, x in _code_state(v):
                    walk(path + suffix, x, depth + 1)
        else:
            values[path], parts = _object(path, v)
            for sub, x in parts:
                walk(sub, x, depth + 1)

    walk("model", model, 0)
    if module is not None:
        for k, x in list(vars(module).items()):
            if not (k.startswith("__") and k.endswith("__")) and injected.get(k, walk) is not x:
                walk(k, x, 0)
    return values, tensors


def installed_hooks(model: torch.nn.Module) -> str | None:
    """Where a hook is installed on the model, its submodules or its parameters, or globally for every module (they
    run the candidate's code around forward, at state_dict and parameter loading, outside the trace); None if none."""
    from torch.nn.modules import module as nn_module
    for name, table in vars(nn_module).items():
        if name.startswith("_global_") and name.endswith("hooks") and _is(table, dict) and dict.__len__(table):
            return f"a hook for every module ({name})"
    for path, sub in torch.nn.Module.named_modules(model):
        for name, table in (_instance_dict(sub) or {}).items():
            if name.endswith("hooks") and _is(table, dict) and dict.__len__(table):
                return f"`{'model.' + path if path else 'model'}.{name}`"
    for path, param in torch.nn.Module.named_parameters(model):
        if type(param) in TENSOR_TYPES and (param._backward_hooks or param._post_accumulate_grad_hooks):
            return f"a hook on parameter `{path}`"
    return None


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def difference(before: dict[str, Any], after: dict[str, Any]) -> str | None:
    """The first change between two snapshots, in words; None when equal."""
    if before == after:
        return None
    for path, new in after.items():
        if path not in before:
            return f"`{path}` appeared"
        old = before[path]
        if old != new:
            if isinstance(old, tuple) and old and old[0] == "tensor":
                return f"`{path}` now holds another tensor"
            if isinstance(old, tuple) and len(old) == 2 and isinstance(old[1], int) and isinstance(new, tuple) \
                    and old[0] == new[0] and old[0] in ("list", "tuple", "dict", "set", "deque", "frozenset"):
                return f"`{path}` had {old[1]} entries, now {new[1]}"
            return f"`{path}` was {_show(old)}, now {_show(new)}"
    gone = next(p for p in before if p not in after)
    return f"`{gone}` disappeared"


def _show(v: Any) -> str:
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], int) and isinstance(v[0], str):
        return f"a {v[0]}"
    return repr(v)[:80]


def signatures(tensors: list[tuple[str, torch.Tensor]]) -> list[Any]:
    """What each tensor holds now: a copy (small ones) or a checksum (large ones)."""
    sigs = []
    for _, t in tensors:
        if t.numel() * t.element_size() <= CLONE_BYTES:
            sigs.append(t.detach().clone())
        else:
            sigs.append(_checksum(t))
    return sigs


def _checksum(t: torch.Tensor) -> tuple[int | float, ...]:
    """Sums of the bits, whole and over two strided subsets (no copy of the tensor's size is made)."""
    kind = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size())
    v = t.detach().reshape(-1)
    v = v.view(kind) if kind and v.is_contiguous() else v.double()
    if kind:  # exact integers (int64 wraps, deterministically)
        return tuple(int(x.sum(dtype=torch.int64)) for x in (v, v[1::3], v[2::7]))
    return tuple(float(x.sum()) for x in (v, v[1::3], v[2::7]))


def written(tensors: list[tuple[str, torch.Tensor]], sigs: list[Any]) -> list[tuple[str, torch.Tensor]]:
    """The tensors whose contents differ from `sigs`."""
    out = []
    for (path, t), sig in zip(tensors, sigs):
        now_same = torch.equal(t.detach(), sig) if isinstance(sig, torch.Tensor) and sig.shape == t.shape and \
            sig.dtype == t.dtype else _checksum(t) == sig
        if not now_same:
            out.append((path, t))
    return out


def scramble(t: torch.Tensor, gen: torch.Generator) -> None:
    """Random bytes in every element of t (random bits for floats: NaN, Inf and huge values among them)."""
    with torch.no_grad():
        if t.numel() == 0:
            return
        if t.dtype == torch.bool:
            t.copy_(torch.randint(0, 2, t.shape, generator=gen, device=gen.device).to(t.device).bool())
            return
        size = t.element_size()
        raw = torch.randint(0, 256, (t.numel() * size,), dtype=torch.uint8, generator=gen, device=gen.device)
        t.copy_(raw.to(t.device).view(t.dtype).view(t.shape))
