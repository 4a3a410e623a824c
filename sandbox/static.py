"""The static stage: a default-deny check of a candidate's source. What it does not list as allowed is refused.

A candidate is code an LLM wrote to win a benchmark, so this stage allows only what an honest Triton candidate needs
and refuses the rest with one sentence (line, construct, what to do instead) that the LLM reads. The rules, in the
order their allow-lists appear in sandbox/allowlist.py (sandbox/static_names.py holds rules 1-3):

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
import re

from . import pyparse
from .allowlist import (
    ALLOWED_DECORATORS, ALLOWED_DUNDER_METHODS, FORBIDDEN_KEYWORDS, JIT_KEYWORDS, KERNEL_DECORATORS,
    LITERAL_NAME_BUILTINS, SEEDS_PACKAGE, tensor_methods,
)
from .records import Reason
from .static_names import NameChecker, Refused, StaticFinding, dotted, is_dunder, kernel_decorator, refuse


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
        return _check_tree(tree) or _kernel_lines(tree, source)
    except Refused as refused:
        return refused.finding
    except (RecursionError, MemoryError, ValueError) as exc:
        return StaticFinding(Reason.FORBIDDEN_CALL, f"the static check cannot analyse this source "
                             f"({type(exc).__name__}); nest it less deeply and keep it smaller")


def _check_tree(tree: ast.Module) -> StaticFinding | None:
    model_new = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"]
    if not model_new:
        return StaticFinding(Reason.NO_MODEL_NEW, "the candidate defines no top-level `class ModelNew`")
    for base in model_new[0].bases:
        if dotted(base).split(".")[-1] == "Model":
            return StaticFinding(Reason.SUBCLASSES_REFERENCE, f"line {model_new[0].lineno}: ModelNew inherits the "
                                 "reference Model; it must compute with its own kernels", model_new[0].lineno)
    uses_seeds = any(isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == SEEDS_PACKAGE
                     for n in tree.body)
    if not uses_seeds and not any(kernel_decorator(fn) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)):
        return StaticFinding(Reason.NO_TRITON_KERNEL, "the candidate defines no @triton.jit kernel")
    for node in ast.walk(tree):  # try/except first: its reason code is the one the loop keys on
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            return StaticFinding(Reason.TRY_EXCEPT, f"line {node.lineno}: try/except is not allowed: a failing kernel "
                                 "must fail, not fall back to another path", node.lineno)
    _Checker(tree).run()
    return None


def _kernel_lines(tree: ast.Module, source: str) -> StaticFinding | None:
    """Triton compiles a kernel again from its source lines (its decorators' first line to its end), from a line
    that starts with `def `: the first on the GPU (JITCallable: after dedent, `^def\\s+\\w+\\s*\\(`), the last on the
    CPU interpreter (FunctionRewriter._find_def). Such a line in a decorator's or the body's string would become the
    kernel, unchecked. In a kernel's lines only its own `def` line may start so; and none with a backslash, where
    the tokenizer inspect uses ends the kernel's block though Python's parser reads on."""
    lines = pyparse.source_lines(source)
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and kernel_decorator(fn):
            first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
            for n in range(first, min(len(lines), fn.end_lineno or fn.lineno) + 1):
                if n != fn.lineno and _DEF_LINE.match(lines[n - 1]):
                    return StaticFinding(Reason.FORBIDDEN_CALL, f"line {n}: a line in kernel `{fn.name}` starts with "
                                         "`def ` (in a string, Triton would take it for the kernel's start); reword "
                                         "it", n)
                if _CONTINUATION_LINE.match(lines[n - 1]):  # the tokenizer inspect uses ends the kernel there
                    return StaticFinding(Reason.FORBIDDEN_CALL, f"line {n}: a line in kernel `{fn.name}` starts with "
                                         "a backslash; join it to the line before", n)
    return None


_DEF_LINE = re.compile(r"\s*def\s")
_CONTINUATION_LINE = re.compile(r"\s*\\")


class _Checker(NameChecker):
    """The whole check: NameChecker's walk and rules 1-3, with calls, kernel bodies, definitions and statements."""

    # ---- calls ----------------------------------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if dotted(func) in KERNEL_DECORATORS | {"triton.autotune"} and id(node) not in self.decorating:
            refuse(node, f"`{dotted(func)}(...)` called as a function makes a kernel the static check does not see as "
                   f"one; write it as a decorator, `@{dotted(func)}`")
        for kw in node.keywords:
            if kw.arg is not None and (kw.arg in FORBIDDEN_KEYWORDS or "hook" in kw.arg):
                refuse(kw.value, f"keyword `{kw.arg}=` installs Python that runs at launch; it is not allowed")
            if kw.arg is not None and is_dunder(kw.arg):
                refuse(kw.value, f"keyword `{kw.arg}=` is not allowed")
        if isinstance(func, ast.Attribute) and func.attr == "data_ptr" and isinstance(func.value, ast.Call) and \
                isinstance(func.value.func, ast.Attribute) and func.value.func.attr == "untyped_storage":
            self.storage_ok.add(id(func.value.func))
        if isinstance(func, ast.Name):
            if func.id in LITERAL_NAME_BUILTINS and self._resolve(func.id) == "builtin":
                self._literal_getattr(node, func.id)
                if node.args:
                    self.module_ok.add(id(node.args[0]))  # `hasattr(tl, "name")`: read like `tl.name`
            self._read_name(func, func.id, call=True, args=len(node.args) + len(node.keywords))
            if func.id == "type" and self._resolve(func.id) == "builtin" and id(node) not in self.type_ok:
                refuse(node, "`type(x)` may only be compared (`type(x) is torch.Tensor`) or read from "
                       "(`type(x).__name__`), not bound or given attributes (a class taken from a value would keep "
                       "them past each call, unseen)")
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
        for operand in (node.left, *node.comparators):
            self.type_ok.add(id(operand))
        if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str) and len(node.ops) == 1 and \
                isinstance(node.ops[0], (ast.In, ast.NotIn)) and isinstance(right, ast.Call) and \
                isinstance(right.func, ast.Name) and right.func.id == "dir" and self._resolve("dir") == "builtin" \
                and len(right.args) == 1 and not right.keywords:
            self._kernel_only(node, "`dir`")
            self.module_ok.add(id(right.args[0]))
            self.visit(right.args[0])
            return
        self.generic_visit(node)

    def _literal_getattr(self, node: ast.Call, name: str) -> None:
        if len(node.args) < 2 or not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            refuse(node, f"`{name}` needs a literal attribute name (`{name}(x, \"shape\")`); better, write `x.shape`")
        attr = node.args[1].value
        if not attr.isidentifier():
            refuse(node, f"`{name}(..., {attr!r})` names no attribute")
        target = node.args[0]
        path = self._module_rooted(target) if isinstance(target, ast.Attribute) else (
            self.imported[target.id] if isinstance(target, ast.Name) and target.id in self.imported else None)
        self._attr_rules(node, attr, f"{path}.{attr}" if path else None, module_rooted=path is not None, owner=target)

    # ---- 4. kernel bodies ------------------------------------------------------------------------------------------
    def _kernel_call_name(self, node: ast.Call, name: str) -> None:
        where = self._resolve(name)
        if where == "builtin":
            return  # _read_name held it to KERNEL_BUILTINS
        if where == "module":
            kind = self.module_kind.get(name, "value")
            if kind in ("kernel", "alias") or (kind == "import" and self.imported[name].startswith("triton")):
                return
        refuse(node, f"a kernel body calls `{name}`, which is not a Triton function or a @triton.jit function of "
                "the module; make it a @triton.jit function")

    def _kernel_call_attr(self, node: ast.Call) -> None:
        func = node.func
        if not isinstance(func, ast.Attribute):
            refuse(node, "a kernel body may call only Triton functions, @triton.jit functions and tensor methods "
                    "(no launches or calls of computed values)")
        path = self._module_rooted(func)
        if path is not None:
            if not path.startswith("triton"):
                refuse(node, f"a kernel body calls `{dotted(func)}`; kernels may call only Triton (tl.*) "
                        "functions")
            return
        if func.attr not in tensor_methods():
            refuse(node, f"a kernel body calls `.{func.attr}()`, which is not a Triton tensor method; use tl.* "
                    "functions")

    def _kernel_only(self, node: ast.AST, what: str) -> None:
        if self.kernel_depth:
            refuse(node, f"{what} is not allowed in a kernel body (on the CPU interpreter it would run as Python); "
                    "write it with tl.* operations")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._kernel_only(node, f"a nested function (`def {node.name}`)")
        if is_dunder(node.name) and node.name not in ALLOWED_DUNDER_METHODS:
            refuse(node, f"defining `{node.name}` is not allowed; only __init__ among dunder methods")
        is_kernel = kernel_decorator(node)
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
        refuse(node, "async functions are not allowed in a candidate")

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
            refuse(node, f"class {node.name} takes keywords (`{node.keywords[0].arg}=`); plain classes only")
        for dec in node.decorator_list:
            self._check_decorator(dec)
        for base in node.bases:
            root = self._root(base)
            if not isinstance(root, ast.Name) or (root.id != "object" and self.module_kind.get(root.id) not in
                                                  ("class", "import")):
                refuse(base, f"class {node.name}'s base must be a class you define or import (not the type of a "
                       "value, such as a kernel's)")
            self.visit(base)
        self._in_scope(node, node.body)

    def _check_decorator(self, dec: ast.AST) -> None:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = dotted(target)
        if name == "triton.heuristics":
            refuse(dec, "@triton.heuristics runs Python at every launch; compute the value in the launcher and "
                    "pass it as a tl.constexpr argument")
        if name not in ALLOWED_DECORATORS:
            refuse(dec, f"decorator `@{name}` is not allowed; use only "
                    f"{', '.join('@' + d for d in sorted(ALLOWED_DECORATORS - {'jit'}))}")
        if isinstance(dec, ast.Call):
            self.decorating.add(id(dec))
        if isinstance(dec, ast.Call) and name in KERNEL_DECORATORS:
            for kw in dec.keywords:
                if kw.arg not in JIT_KEYWORDS:
                    refuse(dec, f"`@{name}({kw.arg}=...)` is not allowed; only "
                            f"{', '.join(sorted(JIT_KEYWORDS))}")
        self.visit(dec)

    def _annotation(self, ann: ast.AST) -> None:
        for node in ast.walk(ann):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                refuse(ann, "string annotations are not allowed (they are evaluated as code later); write the "
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
        refuse(node, "`global` state is not allowed: caching across calls is a known cheat")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        refuse(node, "`nonlocal` is not allowed; return the value instead")

    def visit_Match(self, node: ast.AST) -> None:
        refuse(node, "`match` is not allowed; use if/elif")

    def visit_With(self, node: ast.With) -> None:
        self._kernel_only(node, "`with`")
        self.generic_visit(node)

    def visit_Await(self, node: ast.AST) -> None:
        refuse(node, "`await` is not allowed in a candidate")

    def _no_kernel_generic(what: str):
        def visit(self, node):
            self._kernel_only(node, what)
            self.generic_visit(node)
        return visit

    visit_Yield = _no_kernel_generic("`yield`")
    visit_YieldFrom = _no_kernel_generic("`yield from`")
    visit_Delete = _no_kernel_generic("`del`")
    visit_Raise = NameChecker.generic_visit
