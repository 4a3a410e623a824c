"""The static stage: a default-deny check of a candidate's source. What it does not list as allowed is refused.

A candidate is code an LLM wrote to win a benchmark, so this stage allows only what an honest Triton candidate needs
and refuses the rest with one sentence (line, construct, what to do instead) that the LLM reads. The rules, in the
order the allow-lists below appear:

1. Imports: only ALLOWED_IMPORTS (exact module names). `__future__` and `dataclasses` give only the names in
   IMPORT_NAMES; `import dataclasses` as a module would hand over its `sys`, `inspect` and `copy` attributes.
   `from seeds.X import name` takes a function, class or constant that seeds/X.py defines itself (never a module
   that file imported), and X must be a kernel file (seeds.registry, which holds paths, is not): the seeds package is crucible's own reviewed code, trusted like torch and Triton, so its
   files are not held to these rules; the check guards the boundary, which names a candidate may take from it.
2. Names: every name read must be bound by the candidate (import, def, class, assignment, parameter) or be one of
   ALLOWED_BUILTINS. Names the Triton interpreter injects into a kernel's module after its first launch (`np`,
   `inspect`, `time`, ...) are refused unless the candidate imports them itself, and the module and its classes may
   not bind a refused builtin's or an injected name (a binding that did not run would fall back to the real one).
   getattr / hasattr only with a literal name (checked as an attribute); setattr, eval, exec, compile, open,
   globals, vars, id, memoryview, bytes, ... are not on the list. `type` takes one argument; `dir` appears only as `"name" in dir(module)` (picking
   between Triton versions' names).
3. Attributes: no dunder except `__init__` and `__name__`; none of FORBIDDEN_ATTRS on any object (module and harness
   handles, data taken to numpy or Python, launch hooks, numeric flags, streams and graphs); no `_private` attribute
   of an imported module (`torch._foo`, `triton._C`); none of FORBIDDEN_PATHS (`torch.jit`, `torch.load`, ...).
   `.untyped_storage()` only as `.untyped_storage().data_ptr()` (an aliasing check). `.data_ptr()` is allowed: it is
   an int, nothing a candidate can import turns it into memory, and caching by address fails on fresh inputs.
   Keyword arguments that install Python callbacks (`pre_hook=`, `prune_configs_by=`, `launch_metadata=`, ...)
   are refused.
4. Kernel bodies (@triton.jit / @gluon.jit, whose bodies are plain Python on the CPU interpreter): calls only to
   Triton (`tl.*`, `triton.*`, names imported from triton), other kernels of the module or seeds, KERNEL_BUILTINS and
   Triton tensor methods; no lambda, nested def or class, import, with, comprehension, or plain Python function or
   class of the module. A candidate class may not define a method named like a Triton tensor method (it could be
   passed to a kernel and called there), nor redefine what torch.nn.Module defines other than forward (the harness
   calls `to`, `eval`, `load_state_dict`... outside the launch trace).
5. Strings as code: no string annotations (typing.get_type_hints, which Triton's aggregates call, evaluates them).
   `from __future__ import annotations` is allowed: the annotations it turns into strings are expressions in the
   source, checked by these same rules. No `str.format` / `format_map` (a format field reads attributes); use
   f-strings.
6. No global / nonlocal, try/except, match, `class ModelNew(Model)`, class keywords (metaclass=), decorators other
   than ALLOWED_DECORATORS, `del` of a module or class name, triton.heuristics (its callables run at launch).
7. Source the stage cannot analyse (too deep, too large) is refused.
The runtime checks (launch trace, audit hook, output checks) stand behind every one of these (docs/threats.md).
"""
from __future__ import annotations

import ast
import builtins
import functools
from dataclasses import dataclass
from pathlib import Path

from . import pyparse
from .records import Reason

# ---- 1. imports -----------------------------------------------------------------------------------------------------
ALLOWED_IMPORTS = frozenset({
    "torch", "torch.nn", "torch.nn.functional", "math",
    "triton", "triton.language", "triton.language.extra", "triton.language.extra.libdevice",
    "triton.language.extra.cuda", "triton.language.extra.cuda.libdevice", "triton.tools.tensor_descriptor",
    "triton.experimental", "triton.experimental.gluon", "triton.experimental.gluon.language",
    "triton.experimental.gluon.language.nvidia", "triton.experimental.gluon.language.nvidia.hopper",
    "triton.experimental.gluon.language.nvidia.ampere", "triton.experimental.gluon.language.nvidia.blackwell",
    "triton.experimental.gluon.nvidia", "triton.experimental.gluon.nvidia.hopper",
    "seeds", "__future__", "dataclasses",
})
# Modules that may only be imported from (`from M import n`), and only these names.
IMPORT_NAMES = {"__future__": {"annotations"}, "dataclasses": {"dataclass", "field"}}
SEEDS_PACKAGE = "seeds"
SEEDS_DIR = Path(__file__).resolve().parent.parent / SEEDS_PACKAGE

# ---- 2. names -------------------------------------------------------------------------------------------------------
ALLOWED_BUILTINS = frozenset({
    "True", "False", "None", "Ellipsis", "NotImplemented",
    "range", "len", "min", "max", "abs", "int", "float", "bool", "str", "repr", "tuple", "list", "dict", "set",
    "frozenset", "slice", "isinstance", "issubclass", "callable", "zip", "enumerate", "map", "filter", "iter", "next",
    "reversed", "sorted", "sum", "any", "all", "round", "divmod", "pow", "print", "super", "staticmethod",
    "classmethod", "property", "getattr", "hasattr", "type",
    "Exception", "ValueError", "TypeError", "RuntimeError", "NotImplementedError", "AssertionError", "IndexError",
    "KeyError", "ZeroDivisionError", "ArithmeticError", "OverflowError", "LookupError",
})
# Shown in the LLM's rules; every other builtin is refused too (ALLOWED_BUILTINS is the rule).
FORBIDDEN_NAMES = frozenset({
    "eval", "exec", "compile", "__import__", "open", "globals", "locals", "vars", "dir", "breakpoint", "input",
    "help", "setattr", "delattr", "memoryview", "bytes", "bytearray", "object", "id", "hash", "format",
})
# Builtins that are fine as values but need a literal argument: getattr(x, "name"), hasattr(x, "name"), type(x).
_LITERAL_NAME_BUILTINS = {"getattr": 2, "hasattr": 2}
ALLOWED_DUNDER_NAMES = {"__name__"}
# Names Triton's CPU interpreter copies into a kernel's module (its own globals, where the module lacks them).
INJECTED_NAMES = frozenset({
    "np", "inspect", "ast", "textwrap", "time", "dataclasses", "dataclass", "partial", "annotations", "math", "tl",
    "triton", "Callable", "Dict", "List", "Optional", "Tuple", "TypeVar", "T", "TensorHandle", "TensorDescHandle",
    "TensorDescriptor", "GridExecutor", "InterpretedFunction", "InterpreterBuilder", "InterpreterError",
    "InterpreterOptions", "KernelInterface", "FunctionRewriter", "ASTTransformer", "ExtraFunctions", "ReduceOps",
    "ScanOps", "ReduceScanOpInterface", "TritonSemantic", "interpreter_builder", "interpreter_semantic",
    "np_erf_fp32", "np_erf_fp64", "np_umulhi_u64",
})

# ---- 3. attributes --------------------------------------------------------------------------------------------------
ALLOWED_DUNDER_ATTRS = {"__init__", "__name__"}
FORBIDDEN_ATTRS = frozenset({
    # module handles an allowed module holds (torch.sys, dataclasses.inspect): the way to sys.modules and the harness
    "sys", "os", "ctypes", "subprocess", "importlib", "builtins", "gc", "inspect", "threading", "_thread",
    "multiprocessing", "socket", "signal", "shutil", "pickle", "io", "mmap", "resource", "weakref", "tempfile",
    "pathlib", "warnings", "traceback", "types", "copyreg", "marshal", "modules", "numpy", "np", "operator",
    "functools", "itertools", "typing", "linecache", "dis", "code", "codeop", "runpy", "pkgutil", "site", "posix",
    "atexit", "faulthandler", "tracemalloc", "sysconfig", "logging", "contextlib", "overrides",
    "get_type_hints", "ForwardRef", "_evaluate",
    # more handles, found by walking the public attributes of torch's and Triton's modules and classes for modules of
    # the standard library (torch.glob.re.enum.bltns is builtins, torch.cuda.tunable.mp is multiprocessing); "torch"
    # because torch.nn.functional.torch is torch again, past FORBIDDEN_PATHS (tests/test_redteam.py repeats the walk)
    "torch", "ao", "numbers", "dataclasses", "glob", "platform", "textwrap", "collections", "ast", "re", "string",
    "enum", "concurrent", "mp", "bisect", "json", "abc",
    # standard-library modules that other imports may leave on a Triton or torch module at run time (the suite saw
    # triton.language.standard.time): named before any walk finds them
    "time", "datetime", "random", "struct", "select", "queue",
    "sandbox", "trace", "policy", "worker", "channel", "harness", "zygote", "profiler", "agent",
    "hub", "utils", "serialization", "distributed", "library", "ops", "_C", "_dynamo", "_inductor",
    "_python_dispatch", "fx", "package", "onnx", "export", "testing", "backends", "classes", "compiler",
    "runtime", "driver", "knobs",
    # data taken out of torch to numpy or Python
    "tolist", "item", "from_numpy", "frombuffer", "as_tensor", "from_dlpack", "to_dlpack", "storage", "set_",
    "_base", "grad_fn", "apply_", "map_", "map2_", "share_memory_", "from_file",
    # Python run at launch while the trace stands aside
    "pre_hook", "post_hook", "add_pre_run_hook", "pre_run_hooks", "launch_enter_hook", "launch_exit_hook",
    "register_hook", "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
    "register_backward_hook", "register_full_backward_pre_hook", "compile",
    # frames, code and class internals
    "f_back", "f_globals", "f_locals", "f_builtins", "gi_frame", "cr_frame", "tb_frame", "tb_next", "_getframe",
    "fn", "src",
    # numeric flags, streams, graphs, the allocator
    "set_flush_denormal", "use_deterministic_algorithms", "allow_tf32", "set_float32_matmul_precision",
    "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction", "Stream", "stream",
    "ExternalStream", "set_stream", "empty_cache", "_cached", "CUDAGraph", "graph", "graphs", "memory",
    "format", "format_map",
})
# Dotted paths refused where their last name alone is fine elsewhere (tl.load is a kernel's, torch.load unpickles).
FORBIDDEN_PATHS = frozenset({"torch.load", "torch.save", "triton.heuristics", "triton.tools", "torch.jit", "torch.autograd.graph", "torch.autograd.grad"})
_PATH_EXCEPTIONS = {"triton.tools.tensor_descriptor"}
# Keyword arguments whose value is Python the launcher runs (Triton's autotuner and jit), whatever the callee.
FORBIDDEN_KEYWORDS = frozenset({"pre_hook", "post_hook", "hook", "prune_configs_by", "early_config_prune",
                                "perf_model", "do_bench", "launch_metadata", "repr", "key_fn"})

# ---- 4. kernel bodies, 6. decorators --------------------------------------------------------------------------------
KERNEL_DECORATORS = {"triton.jit", "jit", "gluon.jit"}
ALLOWED_DECORATORS = KERNEL_DECORATORS | {"triton.autotune", "staticmethod", "classmethod", "property", "dataclass",
                                          "torch.no_grad"}
JIT_KEYWORDS = {"do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline"}
KERNEL_BUILTINS = {"range", "min", "max", "len", "int", "float", "bool", "isinstance", "print", "abs", "tuple"}
ALLOWED_DUNDER_METHODS = {"__init__", "__post_init__"}
# nn.Module's own methods and attributes a candidate class may redefine: the harness calls the others (to, eval,
# load_state_dict, state_dict, parameters...) outside the launch trace.
MODULE_OVERRIDES = {"__init__", "forward", "extra_repr"}


@dataclass(frozen=True)
class StaticFinding:
    reason: Reason
    message: str
    line: int = 0


class _Refused(Exception):
    def __init__(self, finding: StaticFinding):
        super().__init__(finding.message)
        self.finding = finding


def check_source(source: str, filename: str = "candidate.py") -> StaticFinding | None:
    """None when the source passes; else the first finding, with its line."""
    try:
        tree = pyparse.parse(source, filename=filename)
    except SyntaxError as exc:
        return StaticFinding(Reason.SYNTAX_ERROR, f"syntax error at line {exc.lineno}: {exc.msg}", exc.lineno or 0)
    except (RecursionError, MemoryError, ValueError, OverflowError) as exc:
        return StaticFinding(Reason.SYNTAX_ERROR, f"the source cannot be parsed ({type(exc).__name__}: {exc}); "
                             "write it flatter and smaller")
    except Exception as exc:  # pyparse's own bounds: whatever it raises is a refusal, never a harness error
        return StaticFinding(Reason.SYNTAX_ERROR, f"the source was refused before analysis ({exc}); write it "
                             "flatter and smaller")
    try:
        return _check_tree(tree)
    except _Refused as refused:
        return refused.finding
    except (RecursionError, MemoryError, ValueError) as exc:
        return StaticFinding(Reason.FORBIDDEN_CALL, f"the static check cannot analyse this source "
                             f"({type(exc).__name__}); nest it less deeply and keep it smaller")


def _check_tree(tree: ast.Module) -> StaticFinding | None:
    model_new = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"]
    if not model_new:
        return StaticFinding(Reason.NO_MODEL_NEW, "the candidate defines no top-level `class ModelNew`")
    for base in model_new[0].bases:
        if _dotted(base).split(".")[-1] == "Model":
            return StaticFinding(Reason.SUBCLASSES_REFERENCE, f"line {model_new[0].lineno}: ModelNew inherits the "
                                 "reference Model; it must compute with its own kernels", model_new[0].lineno)
    uses_seeds = any(isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == SEEDS_PACKAGE
                     for n in tree.body)
    if not uses_seeds and not any(_kernel_decorator(fn) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)):
        return StaticFinding(Reason.NO_TRITON_KERNEL, "the candidate defines no @triton.jit kernel")
    for node in ast.walk(tree):  # try/except first: its reason code is the one the loop keys on
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            return StaticFinding(Reason.TRY_EXCEPT, f"line {node.lineno}: try/except is not allowed: a failing kernel "
                                 "must fail, not fall back to another path", node.lineno)
    _Checker(tree).run()
    return None


def _refuse(node: ast.AST | int, text: str, reason: Reason = Reason.FORBIDDEN_CALL) -> None:
    line = node if isinstance(node, int) else getattr(node, "lineno", 0)
    raise _Refused(StaticFinding(reason, f"line {line}: {text}", line))


@functools.lru_cache(maxsize=None)
def _tensor_methods() -> frozenset[str]:
    """Public methods of Triton's tensor types: what a kernel body may call on a value."""
    import triton.language as tl
    classes = [tl.tensor, tl.core.tensor_descriptor_base]
    try:
        from triton.experimental.gluon import language as gl
        classes += [gl.tensor, gl.shared_memory_descriptor]
    except ImportError:  # a Triton without Gluon: its kernels cannot be written anyway
        pass
    names = set()
    for cls in classes:
        for klass in cls.__mro__:
            names.update(n for n, v in vars(klass).items() if not n.startswith("_") and callable(v))
    return frozenset(names)


@functools.lru_cache(maxsize=None)
def _module_attrs() -> frozenset[str]:
    import torch
    return frozenset(dir(torch.nn.Module))


@functools.lru_cache(maxsize=64)
def _seed_exports(module: str, mtime: float) -> dict[str, str]:
    """What seeds/<module>.py binds at top level by def / class / assignment: name -> kernel | def | class | alias | value."""
    path = SEEDS_DIR.joinpath(*module.split(".")[1:]).with_suffix(".py")
    tree = pyparse.parse(path.read_text(encoding="utf-8"), filename=str(path))
    kinds: dict[str, str] = {}
    todo = list(tree.body)  # top-level statements, and those of top-level blocks (a name picked by Triton version)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.If, ast.For, ast.While, ast.With)):
            todo.extend(node.body + node.orelse if not isinstance(node, ast.With) else node.body)
            continue
        if isinstance(node, ast.FunctionDef):
            kinds[node.name] = "kernel" if _kernel_decorator(node) else "def"
        elif isinstance(node, ast.ClassDef):
            kinds[node.name] = "class"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and getattr(node, "value", None) is not None:
            kind = "alias" if isinstance(node.value, ast.Attribute) else "value"  # tma_load = tma.async_load
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        kinds[name.id] = kind
    return kinds


def _seed_module_kinds(module: str, node: ast.AST) -> dict[str, str]:
    parts = module.split(".")
    path = SEEDS_DIR.joinpath(*parts[1:]).with_suffix(".py")
    if len(parts) < 2 or not all(p.isidentifier() and not p.startswith("__") for p in parts) or not path.is_file():
        _refuse(node, f"`{module}` is not a module of crucible's seeds package; import names from one of its kernel "
                "files (`from seeds.rmsnorm import rmsnorm_fwd`)", Reason.FORBIDDEN_IMPORT)
    kinds = _seed_exports(module, path.stat().st_mtime)
    if "kernel" not in kinds.values() and kinds.get("ModelNew") != "class":  # seeds.registry: paths, file readers
        _refuse(node, f"`{module}` defines no kernel; a candidate may import only from the seeds' kernel files",
                Reason.FORBIDDEN_IMPORT)
    return kinds


def _kernel_decorator(fn: ast.FunctionDef) -> bool:
    return any(_dotted(d.func if isinstance(d, ast.Call) else d) in KERNEL_DECORATORS for d in fn.decorator_list)


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    else:
        parts.append("<expr>")
    return ".".join(reversed(parts))


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


_BUILTIN_NAMES = frozenset(dir(builtins))
_SCOPE_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
                ast.DictComp, ast.GeneratorExp)


def _bound_in(scope: ast.AST) -> set[str]:
    """Names a function, lambda, class body or comprehension binds itself (Python's own scoping)."""
    names: set[str] = set()
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = scope.args
        names.update(p.arg for p in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x])
    if isinstance(scope, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        for gen in scope.generators:
            names.update(n.id for n in ast.walk(gen.target) if isinstance(n, ast.Name))
        return names
    body = scope.body if isinstance(scope.body, list) else [scope.body]
    todo = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            todo.extend(node.decorator_list)
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            # a walrus inside a comprehension binds in the enclosing scope
            names.update(n.target.id for n in ast.walk(node) if isinstance(n, ast.NamedExpr))
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        todo.extend(ast.iter_child_nodes(node))
    return names


class _Checker:
    """Walks the module once with a stack of scopes; the first refusal raises _Refused."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.module_names: set[str] = set()
        self.imported: dict[str, str] = {}      # name -> dotted origin ("torch", "triton.language", "seeds.x.fn")
        self.module_kind: dict[str, str] = {}   # top-level name -> kernel | def | class | value | import
        self.scopes: list[tuple[ast.AST, set[str]]] = []
        self.kernel_depth = 0
        self.storage_ok: set[int] = set()      # ids of `.untyped_storage` nodes used as `.untyped_storage().data_ptr()`

    # ---- the walk -------------------------------------------------------------------------------------------------
    def run(self) -> None:
        self._collect_module()
        self._check_bindings(self.tree)
        self.scopes.append((self.tree, self.module_names))
        for stmt in self.tree.body:
            self.visit(stmt)

    def _collect_module(self) -> None:
        for node in self.tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._check_import(node)
        self.module_names = _bound_in(self.tree)
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef):
                self.module_kind[node.name] = "kernel" if _kernel_decorator(node) else "def"
            elif isinstance(node, ast.ClassDef):
                self.module_kind[node.name] = "class"
        # Module-level assignments, in blocks too: an alias of a Triton function may be called from a kernel; an
        # alias of Python code (a lambda, a def, a class) is Python code; anything else is a value.
        rank = {"alias": 0, "const": 1, "value": 2, "def": 3}
        for node in ast.walk(self.tree):
            if not isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) or node.value is None:
                continue
            root = self._root(node.value)
            kind = ("def" if any(isinstance(n, ast.Lambda) or isinstance(n, ast.Name) and
                                 self.module_kind.get(n.id) in ("def", "class") for n in ast.walk(node.value))
                    else "alias" if isinstance(node.value, ast.Attribute) and isinstance(root, ast.Name) and
                    self.imported.get(root.id, "").startswith("triton")
                    else "const" if self._constant(node.value) else "value")
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name) and n.id not in self.module_kind or \
                            isinstance(n, ast.Name) and rank.get(self.module_kind[n.id], 3) < rank[kind]:
                        self.module_kind[n.id] = kind
        for name in self.module_names:
            self.module_kind.setdefault(name, "import" if name in self.imported else "value")

    def _constant(self, expr: ast.AST) -> bool:
        """Numbers, strings, tuples and arithmetic of them, Triton / math names and calls (tl.constexpr(128),
        math.log2(math.e)), min / max / int / float: what a kernel body may read from the module."""
        for n in ast.walk(expr):
            if isinstance(n, (ast.Constant, ast.Tuple, ast.UnaryOp, ast.BinOp, ast.BoolOp, ast.Compare, ast.IfExp,
                              ast.Load, ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.keyword)):
                continue
            if isinstance(n, ast.Name) and (n.id in ("min", "max", "int", "float", "abs") or
                                            self.imported.get(n.id, "").split(".")[0] in ("triton", "math") or
                                            self.module_kind.get(n.id) in ("const", "alias")):
                continue
            if isinstance(n, ast.Attribute) and self.imported.get(_dotted(n).split(".")[0], "").split(".")[0] in (
                    "triton", "math"):
                continue
            if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute)):
                continue  # its func and arguments are held to the same test
            return False
        return True

    def visit(self, node: ast.AST) -> None:
        method = getattr(self, f"visit_{type(node).__name__}", None)
        if method is not None:
            method(node)
        else:
            self.generic_visit(node)

    def generic_visit(self, node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            self.visit(child)

    def _in_scope(self, scope: ast.AST, children: list[ast.AST]) -> None:
        self.scopes.append((scope, _bound_in(scope)))
        if isinstance(scope, ast.ClassDef):
            self._check_bindings(scope)
        for child in children:
            self.visit(child)
        self.scopes.pop()

    # ---- 1. imports -----------------------------------------------------------------------------------------------
    def _check_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                self._allowed_module(alias.name, node)
                if alias.name in IMPORT_NAMES or alias.name.split(".")[0] == SEEDS_PACKAGE:
                    _refuse(node, f"`import {alias.name}` is not allowed; import names from it instead "
                            f"(`from {alias.name} import ...`)", Reason.FORBIDDEN_IMPORT)
                bound = alias.asname or alias.name.split(".")[0]
                self.imported[bound] = alias.name if alias.asname else alias.name.split(".")[0]
            return
        module = node.module or ""
        if node.level:
            _refuse(node, "relative imports are not allowed; import from `seeds.<file>` by its full name",
                    Reason.FORBIDDEN_IMPORT)
        self._allowed_module(module, node)
        seed_kinds = _seed_module_kinds(module, node) if module.split(".")[0] == SEEDS_PACKAGE else None
        for alias in node.names:
            name = alias.name
            if name == "*":
                _refuse(node, f"`from {module} import *` is not allowed; name what you import",
                        Reason.FORBIDDEN_IMPORT)
            if module in IMPORT_NAMES and name not in IMPORT_NAMES[module]:
                _refuse(node, f"importing `{name}` from `{module}` is not allowed; only "
                        f"{', '.join(sorted(IMPORT_NAMES[module]))}", Reason.FORBIDDEN_IMPORT)
            if seed_kinds is not None:
                if name not in seed_kinds or _is_dunder(name):
                    _refuse(node, f"`{name}` is not a function, class or constant that `{module}` defines; a "
                            "candidate may take only those from the seeds", Reason.FORBIDDEN_IMPORT)
            elif seed_kinds is None and module not in IMPORT_NAMES:
                full = f"{module}.{name}"
                if full not in ALLOWED_IMPORTS:
                    self._attr_rules(node, name, full, module_rooted=True, reason=Reason.FORBIDDEN_IMPORT)
            bound = alias.asname or name
            self.imported[bound] = f"{module}.{name}"
            if seed_kinds is not None:  # the seeds are trusted: their module-level values count as constants
                self.module_kind[bound] = "const" if seed_kinds[name] == "value" else seed_kinds[name]

    def _allowed_module(self, name: str, node: ast.AST) -> None:
        if name.split(".")[0] == SEEDS_PACKAGE or name in ALLOWED_IMPORTS:
            return
        roots = sorted({m.split(".")[0] for m in ALLOWED_IMPORTS})
        _refuse(node, f"import of `{name}` is not allowed; candidates may import only {', '.join(roots)} (and "
                "torch.nn, triton.language and the Triton submodules kernels use)", Reason.FORBIDDEN_IMPORT)

    def visit_Import(self, node: ast.Import) -> None:
        if not any(node is stmt for stmt in self.tree.body):
            for alias in node.names if isinstance(node, ast.Import) else [ast.alias(name=node.module or "")]:
                self._allowed_module(alias.name, node)
            _refuse(node, "imports belong at the top level of the file, not inside a function, class or block",
                    Reason.FORBIDDEN_IMPORT)

    visit_ImportFrom = visit_Import

    # ---- 2. names and bindings ------------------------------------------------------------------------------------
    def _check_bindings(self, scope: ast.AST) -> None:
        """The module and class bodies may not bind a refused builtin's or an injected name."""
        for name in _bound_in(scope):
            where = "the module" if scope is self.tree else f"class {scope.name}"
            if _is_dunder(name) and not (scope is not self.tree and name in ALLOWED_DUNDER_METHODS):
                _refuse(scope if scope is not self.tree else 1, f"{where} binds `{name}`; dunder names other than "
                        "__init__ are not allowed")
            if name in _BUILTIN_NAMES and name not in ALLOWED_BUILTINS:
                _refuse(self._binding_line(scope, name), f"{where} binds the builtin name `{name}`; choose another "
                        "name")
            if name in INJECTED_NAMES and not (scope is self.tree and name in self.imported):
                _refuse(self._binding_line(scope, name), f"{where} binds `{name}`, a name Triton's interpreter "
                        "puts in a kernel's module; choose another name")
            if scope is not self.tree and name in _module_attrs() and name not in MODULE_OVERRIDES:
                _refuse(self._binding_line(scope, name), f"{where} redefines `{name}`, which torch.nn.Module "
                        "defines and the harness calls outside the launch trace; choose another name")
            if scope is not self.tree and name in _tensor_methods():
                _refuse(self._binding_line(scope, name), f"{where} defines `{name}`, the name of a Triton tensor "
                        "method (a kernel could call it as Python); choose another name")

    @staticmethod
    def _binding_line(scope: ast.AST, name: str) -> int:
        for node in ast.walk(scope):
            if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store) or \
                    isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                return node.lineno
        return getattr(scope, "lineno", 1)

    def _resolve(self, name: str) -> str:
        """local | class | module | builtin: where a read of `name` finds it."""
        innermost = True
        for scope, names in reversed(self.scopes):
            if isinstance(scope, ast.ClassDef) and not innermost:
                continue
            innermost = False
            if name in names:
                if scope is self.tree:
                    return "module"
                return "class" if isinstance(scope, ast.ClassDef) else "local"
        return "builtin"

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            if isinstance(node.ctx, ast.Del) and self._resolve(node.id) in ("module", "class"):
                _refuse(node, f"`del {node.id}` of a module or class name is not allowed")
            return
        self._read_name(node, node.id, call=False)

    def _read_name(self, node: ast.AST, name: str, call: bool, args: int = 0) -> None:
        where = self._resolve(name)
        if _is_dunder(name) and name not in ALLOWED_DUNDER_NAMES:
            _refuse(node, f"`{name}` is not allowed in a candidate")
        if where == "builtin" or (where == "class" and name in _BUILTIN_NAMES):
            if name in INJECTED_NAMES or name not in ALLOWED_BUILTINS:
                what = ("is not defined by the candidate (Triton's interpreter puts it in a kernel's module)"
                        if name in INJECTED_NAMES else "is not allowed" if name in _BUILTIN_NAMES
                        else "is not defined by the candidate")
                _refuse(node, f"`{name}` {what}; a candidate may read only names it imports or defines and the "
                        f"builtins {', '.join(sorted(ALLOWED_BUILTINS - {'True', 'False', 'None'}))}")
            if name in _LITERAL_NAME_BUILTINS and not call:
                _refuse(node, f"`{name}` may only be called with a literal attribute name, not passed around")
            if name == "type" and (not call or args != 1):
                _refuse(node, "`type` may only be called with one argument (`type(x)`)")
            if self.kernel_depth and call and name not in KERNEL_BUILTINS:
                _refuse(node, f"`{name}` is not available in a kernel body; use {', '.join(sorted(KERNEL_BUILTINS))} "
                        "or tl.* functions")
        if self.kernel_depth and where == "module":
            kind = self.module_kind.get(name, "value")
            if kind == "value":
                _refuse(node, f"a kernel body reads `{name}`, a module-level value that is not a constant; pass it "
                        "to the kernel as an argument")
            if kind in ("def", "class"):
                _refuse(node, f"a kernel body uses `{name}`, a plain Python {'function' if kind == 'def' else 'class'}"
                        " of the module; kernels may call only tl.* functions and other @triton.jit functions")
            if kind == "import" and not self.imported[name].startswith("triton"):
                _refuse(node, f"a kernel body uses `{name}` (imported from {self.imported[name]}); kernels may "
                        "use only Triton")

    # ---- 3. attributes --------------------------------------------------------------------------------------------
    def _root(self, node: ast.AST) -> ast.AST:
        while isinstance(node, ast.Attribute):
            node = node.value
        return node

    def _module_rooted(self, node: ast.Attribute) -> str | None:
        """The dotted module path of `torch.x.y` (names resolved through the imports), else None."""
        root = self._root(node)
        if isinstance(root, ast.Name) and root.id in self.imported and self._resolve(root.id) == "module":
            dotted = _dotted(node)
            return self.imported[root.id] + dotted[len(root.id):]
        return None

    def _attr_rules(self, node: ast.AST, attr: str, path: str | None, module_rooted: bool,
                    reason: Reason = Reason.FORBIDDEN_CALL) -> None:
        shown = path or attr
        if _is_dunder(attr) and attr not in ALLOWED_DUNDER_ATTRS:
            _refuse(node, f"`.{attr}` (in `{shown}`) is not allowed; dunder attributes other than __init__ and "
                    "__name__ are refused", reason)
        if attr in ("format", "format_map"):
            _refuse(node, f"`.{attr}` is not allowed (a format field can read attributes); use an f-string", reason)
        if "hook" in attr.lower():
            _refuse(node, f"`.{attr}` (in `{shown}`) is not allowed: a hook runs Python outside the harness's watch "
                    "(module, tensor, state-dict and launch hooks alike)", reason)
        if attr in FORBIDDEN_ATTRS:
            _refuse(node, f"`.{attr}` (in `{shown}`) is not allowed in a candidate: it reaches a module, the harness, "
                    "tensor data outside torch, a launch hook or a global setting; compute with your Triton kernels",
                    reason)
        if module_rooted and attr.startswith("_"):
            _refuse(node, f"`{shown}` is a private name of an imported module; use its public API", reason)
        excepted = path and any(path == e or path.startswith(e + ".") for e in _PATH_EXCEPTIONS)
        if path and not excepted and any(path == p or path.startswith(p + ".")
                                                        for p in FORBIDDEN_PATHS):
            _refuse(node, f"`{shown}` is not allowed in a candidate", reason)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.visit(node.value)  # inner names first: `torch.sys.modules` is refused for `.sys`
        path = self._module_rooted(node)
        if node.attr == "untyped_storage" and id(node) not in self.storage_ok:
            _refuse(node, "`.untyped_storage()` is allowed only as `.untyped_storage().data_ptr()`; "
                    "compare storages by address")
        self._attr_rules(node, node.attr, path, module_rooted=path is not None)
        if isinstance(node.ctx, ast.Store) and node.attr in _tensor_methods():
            _refuse(node, f"assigning `.{node.attr}`, the name of a Triton tensor method, is not allowed (a kernel "
                    "could call it as Python); choose another attribute name")

    # ---- calls ----------------------------------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        for kw in node.keywords:
            if kw.arg is not None and (kw.arg in FORBIDDEN_KEYWORDS or "hook" in kw.arg):
                _refuse(kw.value, f"keyword `{kw.arg}=` installs Python that runs at launch; it is not allowed")
            if kw.arg is not None and _is_dunder(kw.arg):
                _refuse(kw.value, f"keyword `{kw.arg}=` is not allowed")
        if isinstance(func, ast.Attribute) and func.attr == "data_ptr" and isinstance(func.value, ast.Call) and \
                isinstance(func.value.func, ast.Attribute) and func.value.func.attr == "untyped_storage":
            self.storage_ok.add(id(func.value.func))
        if isinstance(func, ast.Name):
            if func.id in _LITERAL_NAME_BUILTINS and self._resolve(func.id) == "builtin":
                self._literal_getattr(node, func.id)
            self._read_name(func, func.id, call=True, args=len(node.args) + len(node.keywords))
            if self.kernel_depth:
                self._kernel_call_name(node, func.id)
            for child in node.args + [k.value for k in node.keywords]:
                self.visit(child)
            return
        if self.kernel_depth:
            self._kernel_call_attr(node)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        # `"async_load" in dir(tma)`: the one use of dir, picking between Triton versions' names (like hasattr)
        right = node.comparators[0]
        if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str) and len(node.ops) == 1 and \
                isinstance(node.ops[0], (ast.In, ast.NotIn)) and isinstance(right, ast.Call) and \
                isinstance(right.func, ast.Name) and right.func.id == "dir" and self._resolve("dir") == "builtin" \
                and len(right.args) == 1 and not right.keywords:
            self._kernel_only(node, "`dir`")
            self.visit(right.args[0])
            return
        self.generic_visit(node)

    def _literal_getattr(self, node: ast.Call, name: str) -> None:
        if len(node.args) < 2 or not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            _refuse(node, f"`{name}` needs a literal attribute name (`{name}(x, \"shape\")`); better, write `x.shape`")
        attr = node.args[1].value
        if not attr.isidentifier():
            _refuse(node, f"`{name}(..., {attr!r})` names no attribute")
        target = node.args[0]
        path = self._module_rooted(target) if isinstance(target, ast.Attribute) else (
            self.imported[target.id] if isinstance(target, ast.Name) and target.id in self.imported else None)
        self._attr_rules(node, attr, f"{path}.{attr}" if path else None, module_rooted=path is not None)

    # ---- 4. kernel bodies ------------------------------------------------------------------------------------------
    def _kernel_call_name(self, node: ast.Call, name: str) -> None:
        where = self._resolve(name)
        if where == "builtin":
            return  # _read_name held it to KERNEL_BUILTINS
        if where == "module":
            kind = self.module_kind.get(name, "value")
            if kind in ("kernel", "alias") or (kind == "import" and self.imported[name].startswith("triton")):
                return
        _refuse(node, f"a kernel body calls `{name}`, which is not a Triton function or a @triton.jit function of "
                "the module; make it a @triton.jit function")

    def _kernel_call_attr(self, node: ast.Call) -> None:
        func = node.func
        if not isinstance(func, ast.Attribute):
            _refuse(node, "a kernel body may call only Triton functions, @triton.jit functions and tensor methods "
                    "(no launches or calls of computed values)")
        path = self._module_rooted(func)
        if path is not None:
            if not path.startswith("triton"):
                _refuse(node, f"a kernel body calls `{_dotted(func)}`; kernels may call only Triton (tl.*) "
                        "functions")
            return
        if func.attr not in _tensor_methods():
            _refuse(node, f"a kernel body calls `.{func.attr}()`, which is not a Triton tensor method; use tl.* "
                    "functions")

    def _kernel_only(self, node: ast.AST, what: str) -> None:
        if self.kernel_depth:
            _refuse(node, f"{what} is not allowed in a kernel body (on the CPU interpreter it would run as Python); "
                    "write it with tl.* operations")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._kernel_only(node, f"a nested function (`def {node.name}`)")
        if _is_dunder(node.name) and node.name not in ALLOWED_DUNDER_METHODS:
            _refuse(node, f"defining `{node.name}` is not allowed; only __init__ among dunder methods")
        is_kernel = _kernel_decorator(node)
        for dec in node.decorator_list:
            self._check_decorator(dec)
        a = node.args
        for default in a.defaults + [d for d in a.kw_defaults if d is not None]:
            self.visit(default)
        for ann in [p.annotation for p in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]
                    if p is not None] + [node.returns]:
            if ann is not None:
                self._annotation(ann)
        self.kernel_depth += is_kernel
        self._in_scope(node, node.body)
        self.kernel_depth -= is_kernel

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        _refuse(node, "async functions are not allowed in a candidate")

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._kernel_only(node, "a lambda")
        for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            self.visit(default)
        self._in_scope(node, [node.body])

    def _comprehension(self, node: ast.AST, parts: list[ast.AST]) -> None:
        self._kernel_only(node, "a comprehension")
        # the first iterable is evaluated in the enclosing scope; the rest in the comprehension's
        self.visit(node.generators[0].iter)
        rest = [node.generators[0].target] + node.generators[0].ifs
        for gen in node.generators[1:]:
            rest += [gen.target, gen.iter] + gen.ifs
        self._in_scope(node, rest + parts)

    def visit_ListComp(self, node: ast.ListComp) -> None:
        self._comprehension(node, [node.elt])

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node: ast.DictComp) -> None:
        self._comprehension(node, [node.key, node.value])

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._kernel_only(node, f"a class (`class {node.name}`)")
        if node.keywords:
            _refuse(node, f"class {node.name} takes keywords (`{node.keywords[0].arg}=`); plain classes only")
        for dec in node.decorator_list:
            self._check_decorator(dec)
        for base in node.bases:
            self.visit(base)
        self._in_scope(node, node.body)

    def _check_decorator(self, dec: ast.AST) -> None:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = _dotted(target)
        if name == "triton.heuristics":
            _refuse(dec, "@triton.heuristics runs Python at every launch; compute the value in the launcher and "
                    "pass it as a tl.constexpr argument")
        if name not in ALLOWED_DECORATORS:
            _refuse(dec, f"decorator `@{name}` is not allowed; use only "
                    f"{', '.join('@' + d for d in sorted(ALLOWED_DECORATORS - {'jit'}))}")
        if isinstance(dec, ast.Call) and name in KERNEL_DECORATORS:
            for kw in dec.keywords:
                if kw.arg not in JIT_KEYWORDS:
                    _refuse(dec, f"`@{name}({kw.arg}=...)` is not allowed; only "
                            f"{', '.join(sorted(JIT_KEYWORDS))}")
        self.visit(dec)

    def _annotation(self, ann: ast.AST) -> None:
        for node in ast.walk(ann):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                _refuse(ann, "string annotations are not allowed (they are evaluated as code later); write the "
                        "type itself")
        self.visit(ann)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._annotation(node.annotation)
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def visit_arg(self, node: ast.arg) -> None:
        return  # annotations were visited with their function

    # ---- 6. statements ----------------------------------------------------------------------------------------------
    def visit_Global(self, node: ast.Global) -> None:
        _refuse(node, "`global` state is not allowed: caching across calls is a known cheat")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        _refuse(node, "`nonlocal` is not allowed; return the value instead")

    def visit_Match(self, node: ast.AST) -> None:
        _refuse(node, "`match` is not allowed; use if/elif")

    def visit_With(self, node: ast.With) -> None:
        self._kernel_only(node, "`with`")
        self.generic_visit(node)

    def visit_Await(self, node: ast.AST) -> None:
        _refuse(node, "`await` is not allowed in a candidate")

    def _no_kernel_generic(what: str):
        def visit(self, node):
            self._kernel_only(node, what)
            self.generic_visit(node)
        return visit

    visit_Yield = _no_kernel_generic("`yield`")
    visit_YieldFrom = _no_kernel_generic("`yield from`")
    visit_Delete = _no_kernel_generic("`del`")
    visit_Raise = generic_visit

