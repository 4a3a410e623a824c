"""The static check's walk over a candidate's scopes, and rules 1-3 of sandbox/static.py: imports, names, attributes.

Also what the rest of the check shares: the finding record and the refusal that carries it, the AST helpers (dotted
names, kernel decorators, the names a scope binds) and what the seeds' kernel files export to a candidate.
"""
from __future__ import annotations

import ast
import builtins
import functools
import importlib.util
from dataclasses import dataclass

from . import pyparse
from .allowlist import (
    ALLOWED_BUILTINS, ALLOWED_DUNDER_ATTRS, ALLOWED_DUNDER_METHODS, ALLOWED_DUNDER_NAMES, ALLOWED_IMPORTS,
    FORBIDDEN_ATTRS, FORBIDDEN_PATHS, IMPORT_NAMES, INJECTED_NAMES, KERNEL_BUILTINS, KERNEL_DECORATORS,
    LITERAL_NAME_BUILTINS, MODULE_OVERRIDES, PATH_EXCEPTIONS, SEEDS_DIR, SEEDS_PACKAGE, module_attrs, tensor_methods,
)
from .records import Reason


@dataclass(frozen=True)
class StaticFinding:
    reason: Reason
    message: str
    line: int = 0


class Refused(Exception):
    def __init__(self, finding: StaticFinding):
        super().__init__(finding.message)
        self.finding = finding


def refuse(node: ast.AST | int, text: str, reason: Reason = Reason.FORBIDDEN_CALL) -> None:
    line = node if isinstance(node, int) else getattr(node, "lineno", 0)
    raise Refused(StaticFinding(reason, f"line {line}: {text}", line))


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
            kinds[node.name] = "kernel" if kernel_decorator(node) else "def"
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
        refuse(node, f"`{module}` is not a module of crucible's seeds package; import names from one of its kernel "
                "files (`from seeds.rmsnorm import rmsnorm_fwd`)", Reason.FORBIDDEN_IMPORT)
    kinds = _seed_exports(module, path.stat().st_mtime)
    if "kernel" not in kinds.values() and kinds.get("ModelNew") != "class":  # seeds.registry: paths, file readers
        refuse(node, f"`{module}` defines no kernel; a candidate may import only from the seeds' kernel files",
                Reason.FORBIDDEN_IMPORT)
    return kinds


def kernel_decorator(fn: ast.FunctionDef) -> bool:
    return any(dotted(d.func if isinstance(d, ast.Call) else d) in KERNEL_DECORATORS for d in fn.decorator_list)


def dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    else:
        parts.append("<expr>")
    return ".".join(reversed(parts))


def is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


BUILTIN_NAMES = frozenset(dir(builtins))


def bound_in(scope: ast.AST) -> set[str]:
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


class NameChecker:
    """Walks the module once with a stack of scopes, holding imports, names and attributes to rules 1-3; the first
    refusal raises Refused. sandbox/static.py's checker adds calls, kernel bodies, definitions and statements."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.module_names: set[str] = set()
        self.imported: dict[str, str] = {}      # name -> dotted origin ("torch", "triton.language", "seeds.x.fn")
        self.module_kind: dict[str, str] = {}   # top-level name -> kernel | def | class | value | import
        self.scopes: list[tuple[ast.AST, set[str]]] = []
        self.kernel_depth = 0
        self.storage_ok: set[int] = set()      # ids of `.untyped_storage` nodes used as `.untyped_storage().data_ptr()`
        self.module_ok: set[int] = set()       # ids of module names read as `torch.x`, `hasattr(torch, "x")`, `dir(m)`
        self.type_ok: set[int] = set()         # ids of expressions compared (`type(x) is ...`)
        self.decorating: set[int] = set()      # ids of decorator calls (`@triton.jit(...)`), where a jit call belongs


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
        self.module_names = bound_in(self.tree)
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef):
                self.module_kind[node.name] = "kernel" if kernel_decorator(node) else "def"
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
            if isinstance(n, ast.Attribute) and self.imported.get(dotted(n).split(".")[0], "").split(".")[0] in (
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

    def private_attr(self, node: ast.AST, attr: str, base: ast.AST) -> None:
        """A private name only on the candidate's own object: the first parameter of a method, in that method (a
        kernel's `_src` or `_unsafe_update_src` is what Triton compiles, an interpreted kernel's rewriter what runs at
        its launch). Dunder names and modules' private names have rules of their own; a method is not called
        through its class with another object as its first argument (sandbox/static.py)."""
        if not attr.startswith("_") or is_dunder(attr):
            return
        fns = [i for i, (scope, _) in enumerate(self.scopes) if isinstance(scope, (ast.FunctionDef, ast.Lambda))]
        method = self.scopes[fns[-1]][0] if fns and fns[-1] > 0 and isinstance(self.scopes[fns[-1] - 1][0],
                                                                                 ast.ClassDef) else None
        first = (method.args.posonlyargs + method.args.args)[:1] if isinstance(method, ast.FunctionDef) and not any(
            dotted(d) == "staticmethod" for d in method.decorator_list) else []  # a static method's first: any object
        if not (first and isinstance(base, ast.Name) and base.id == first[0].arg):
            refuse(node, f"`.{attr}` is a private attribute of an object not the candidate's own (a kernel's private "
                   "attributes decide what Triton compiles); use public names, and `_` names only on `self` in a "
                   "method of your class")

    def instance_methods(self, class_name: str) -> set[str]:
        """The methods of a class the candidate defines at top level that take their instance first (not static
        or class methods)."""
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == class_name:
                return {f.name for f in node.body if isinstance(f, ast.FunctionDef) and not any(
                    dotted(d) in ("staticmethod", "classmethod") for d in f.decorator_list)}
        return set()

    def _in_scope(self, scope: ast.AST, children: list[ast.AST]) -> None:
        self.scopes.append((scope, bound_in(scope)))
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
                    refuse(node, f"`import {alias.name}` is not allowed; import names from it instead "
                            f"(`from {alias.name} import ...`)", Reason.FORBIDDEN_IMPORT)
                bound = alias.asname or alias.name.split(".")[0]
                self.imported[bound] = alias.name if alias.asname else alias.name.split(".")[0]
            return
        module = node.module or ""
        if node.level:
            refuse(node, "relative imports are not allowed; import from `seeds.<file>` by its full name",
                    Reason.FORBIDDEN_IMPORT)
        self._allowed_module(module, node)
        seed_kinds = _seed_module_kinds(module, node) if module.split(".")[0] == SEEDS_PACKAGE else None
        for alias in node.names:
            name = alias.name
            if name == "*":
                refuse(node, f"`from {module} import *` is not allowed; name what you import",
                        Reason.FORBIDDEN_IMPORT)
            if module in IMPORT_NAMES and name not in IMPORT_NAMES[module]:
                refuse(node, f"importing `{name}` from `{module}` is not allowed; only "
                        f"{', '.join(sorted(IMPORT_NAMES[module]))}", Reason.FORBIDDEN_IMPORT)
            if seed_kinds is not None:
                if name not in seed_kinds or is_dunder(name):
                    refuse(node, f"`{name}` is not a function, class or constant that `{module}` defines; a "
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
        refuse(node, f"import of `{name}` is not allowed; candidates may import only {', '.join(roots)} (and "
                "torch.nn, triton.language and the Triton submodules kernels use)", Reason.FORBIDDEN_IMPORT)

    def visit_Import(self, node: ast.Import) -> None:
        if not any(node is stmt for stmt in self.tree.body):
            for alias in node.names if isinstance(node, ast.Import) else [ast.alias(name=node.module or "")]:
                self._allowed_module(alias.name, node)
            refuse(node, "imports belong at the top level of the file, not inside a function, class or block",
                    Reason.FORBIDDEN_IMPORT)

    visit_ImportFrom = visit_Import

    # ---- 2. names and bindings ------------------------------------------------------------------------------------
    def _check_bindings(self, scope: ast.AST) -> None:
        """The module and class bodies may not bind a refused builtin's or an injected name."""
        for name in bound_in(scope):
            where = "the module" if scope is self.tree else f"class {scope.name}"
            if is_dunder(name) and not (scope is not self.tree and name in ALLOWED_DUNDER_METHODS):
                refuse(scope if scope is not self.tree else 1, f"{where} binds `{name}`; dunder names other than "
                        "__init__ are not allowed")
            if name in BUILTIN_NAMES and name not in ALLOWED_BUILTINS:
                refuse(self._binding_line(scope, name), f"{where} binds the builtin name `{name}`; choose another "
                        "name")
            if name in INJECTED_NAMES and not (scope is self.tree and name in self.imported):
                refuse(self._binding_line(scope, name), f"{where} binds `{name}`, a name Triton's interpreter "
                        "puts in a kernel's module; choose another name")
            if scope is not self.tree and name in module_attrs() and name not in MODULE_OVERRIDES:
                refuse(self._binding_line(scope, name), f"{where} redefines `{name}`, which torch.nn.Module "
                        "defines and the harness calls outside the launch trace; choose another name")
            if scope is not self.tree and name in tensor_methods():
                refuse(self._binding_line(scope, name), f"{where} defines `{name}`, the name of a Triton tensor "
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
                refuse(node, f"`del {node.id}` of a module or class name is not allowed")
            return
        if id(node) not in self.module_ok and node.id in self.imported and self._resolve(node.id) == "module" and \
                _is_module(self.imported[node.id]):
            refuse(node, f"the module `{node.id}` may be used only as `{node.id}.name`, not bound, passed or stored "
                    "(an attribute set on a module through another name would outlive each call unseen)")
        self._read_name(node, node.id, call=False)

    def _read_name(self, node: ast.AST, name: str, call: bool, args: int = 0) -> None:
        where = self._resolve(name)
        if is_dunder(name) and name not in ALLOWED_DUNDER_NAMES:
            refuse(node, f"`{name}` is not allowed in a candidate")
        if where == "builtin" or (where == "class" and name in BUILTIN_NAMES):
            if name in INJECTED_NAMES or name not in ALLOWED_BUILTINS:
                what = ("is not defined by the candidate (Triton's interpreter puts it in a kernel's module)"
                        if name in INJECTED_NAMES else "is not allowed" if name in BUILTIN_NAMES
                        else "is not defined by the candidate")
                refuse(node, f"`{name}` {what}; a candidate may read only names it imports or defines and the "
                        f"builtins {', '.join(sorted(ALLOWED_BUILTINS - {'True', 'False', 'None'}))}")
            if name in LITERAL_NAME_BUILTINS and not call:
                refuse(node, f"`{name}` may only be called with a literal attribute name, not passed around")
            if name == "type" and (not call or args != 1):
                refuse(node, "`type` may only be called with one argument (`type(x)`)")
            if self.kernel_depth and call and name not in KERNEL_BUILTINS:
                refuse(node, f"`{name}` is not available in a kernel body; use {', '.join(sorted(KERNEL_BUILTINS))} "
                        "or tl.* functions")
        if self.kernel_depth and where == "module":
            kind = self.module_kind.get(name, "value")
            if kind == "value":
                refuse(node, f"a kernel body reads `{name}`, a module-level value that is not a constant; pass it "
                        "to the kernel as an argument")
            if kind in ("def", "class"):
                refuse(node, f"a kernel body uses `{name}`, a plain Python {'function' if kind == 'def' else 'class'}"
                        " of the module; kernels may call only tl.* functions and other @triton.jit functions")
            if kind == "import" and not self.imported[name].startswith("triton"):
                refuse(node, f"a kernel body uses `{name}` (imported from {self.imported[name]}); kernels may "
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
            text = dotted(node)
            return self.imported[root.id] + text[len(root.id):]
        return None

    def _attr_rules(self, node: ast.AST, attr: str, path: str | None, module_rooted: bool,
                    reason: Reason = Reason.FORBIDDEN_CALL, owner: ast.AST | None = None) -> None:
        """The rules for `.attr` read (or set) on `owner`, or on the module `path` names where it is module-rooted."""
        shown = path or attr
        if is_dunder(attr) and attr not in ALLOWED_DUNDER_ATTRS:
            refuse(node, f"`.{attr}` (in `{shown}`) is not allowed; dunder attributes other than __init__ and "
                    "__name__ are refused", reason)
        if attr in ("format", "format_map"):
            refuse(node, f"`.{attr}` is not allowed (a format field can read attributes); use an f-string", reason)
        if "hook" in attr.lower():
            refuse(node, f"`.{attr}` (in `{shown}`) is not allowed: a hook runs Python outside the harness's watch "
                    "(module, tensor, state-dict and launch hooks alike)", reason)
        if attr in FORBIDDEN_ATTRS:
            refuse(node, f"`.{attr}` (in `{shown}`) is not allowed in a candidate: it reaches a module, the harness, "
                    "tensor data outside torch, a launch hook or a global setting; compute with your Triton kernels",
                    reason)
        if module_rooted and attr.startswith("_"):
            refuse(node, f"`{shown}` is a private name of an imported module; use its public API", reason)
        excepted = path and any(path == e or path.startswith(e + ".") for e in PATH_EXCEPTIONS)
        if path and not excepted and any(path == p or path.startswith(p + ".")
                                                        for p in FORBIDDEN_PATHS):
            refuse(node, f"`{shown}` is not allowed in a candidate", reason)
        if not module_rooted and owner is not None:
            self.private_attr(node, attr, owner)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.module_ok.add(id(node.value))
        if isinstance(node.ctx, ast.Load):
            self.type_ok.add(id(node.value))  # `type(x).__name__`; not `type(x).box = ...`
        self.visit(node.value)  # inner names first: `torch.sys.modules` is refused for `.sys`
        path = self._module_rooted(node)
        if node.attr == "untyped_storage" and id(node) not in self.storage_ok:
            refuse(node, "`.untyped_storage()` is allowed only as `.untyped_storage().data_ptr()`; "
                    "compare storages by address")
        self._attr_rules(node, node.attr, path, module_rooted=path is not None, owner=node.value)
        if isinstance(node.value, ast.Name) and self.module_kind.get(node.value.id) == "class" and \
                node.attr in self.instance_methods(node.value.id):
            refuse(node, f"`{node.value.id}.{node.attr}` is a method taken from its class, callable with any object "
                   "as its `self`; call it on an instance (`super().__init__()` for a base class)")
        if isinstance(node.ctx, (ast.Store, ast.Del)) and path is not None:
            refuse(node, f"setting `{path}` is not allowed: an attribute set on an imported module, or on a class or "
                    "function it defines, outlives each call unseen; keep what the forward needs on the model")
        if isinstance(node.ctx, ast.Store) and node.attr in tensor_methods():
            refuse(node, f"assigning `.{node.attr}`, the name of a Triton tensor method, is not allowed (a kernel "
                    "could call it as Python); choose another attribute name")


@functools.lru_cache(maxsize=None)
def _is_module(path: str) -> bool:
    """Whether an imported dotted path names a module (`torch.nn`), not a class or function (`torch.Tensor`)."""
    try:
        return importlib.util.find_spec(path) is not None
    except (ImportError, ValueError, AttributeError):
        return False
