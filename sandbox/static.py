"""The static stage: AST checks on a candidate's source. A cheap first filter, not the defence.

What is refused, and why (THREATS.md numbers):
  - no `class ModelNew`, or no `@triton.jit` kernel                                      (the task contract, #2)
  - `class ModelNew(Model)`: inheriting the reference                                    (#3)
  - try/except anywhere: a fallback to torch when the kernel fails                       (#3)
  - imports outside the allow-list: threads, processes, sockets, ctypes, gc, inspect…    (#14, #19, #25)
  - torch.compile / torch._dynamo / torch._C / dispatch internals, eval/exec/open…       (#1, #17, #21, #25)
The runtime checks (launch trace, audit hook, output checks) stand behind every one of these.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from . import pyparse
from .records import Reason

ALLOWED_IMPORTS = {
    "torch", "triton", "math", "typing", "functools", "dataclasses", "enum", "__future__", "itertools",
    "operator", "collections", "numbers", "abc", "seeds",
}
# Submodules refused even under an allowed root.
FORBIDDEN_MODULES = (
    "torch._dynamo", "torch._inductor", "torch._C", "torch.utils._python_dispatch", "torch.overrides",
    "torch.multiprocessing", "torch.cuda._sanitizer", "torch.compiler", "torch._subclasses", "torch.library",
    "triton.testing", "triton.runtime.interpreter", "triton.knobs",
)
FORBIDDEN_NAMES = {
    "eval", "exec", "compile", "__import__", "open", "globals", "locals", "vars", "breakpoint", "input",
    "getattr", "setattr", "delattr", "memoryview", "type", "object",
}
FORBIDDEN_ATTRS = {
    "compile",            # torch.compile
    "_C", "_dynamo", "_inductor", "_python_dispatch", "__subclasses__", "__globals__", "__code__",
    "__builtins__", "__dict__", "__class__", "__bases__", "__mro__", "f_back", "f_globals", "f_locals",
    "gi_frame", "tb_frame", "_getframe", "set_flush_denormal", "use_deterministic_algorithms",
    "allow_tf32", "set_float32_matmul_precision", "allow_fp16_reduced_precision_reduction",
    "allow_bf16_reduced_precision_reduction", "Stream", "stream", "ExternalStream", "set_stream",
    "launch_enter_hook", "launch_exit_hook", "empty_cache", "_cached", "CUDAGraph", "graph",
    # Modules an allowed module happens to hold as attributes (torch.sys, torch.os, torch.ctypes, ...): the way
    # around the import allow-list, and to sys.modules, where the harness's own state lives.
    "sys", "os", "ctypes", "subprocess", "importlib", "builtins", "gc", "inspect", "threading", "_thread",
    "multiprocessing", "socket", "signal", "shutil", "pickle", "io", "mmap", "resource", "weakref", "tempfile",
    "pathlib", "warnings", "traceback", "hub", "utils", "serialization", "distributed",
}

ALLOWED_DUNDERS = {"__init__", "__name__"}


@dataclass(frozen=True)
class StaticFinding:
    reason: Reason
    message: str
    line: int = 0


def check_source(source: str, filename: str = "candidate.py") -> StaticFinding | None:
    """None when the source passes; else the first finding, with its line."""
    try:
        tree = pyparse.parse(source, filename=filename)
    except pyparse.Unanalysable as exc:
        return StaticFinding(Reason.SYNTAX_ERROR, f"the candidate cannot be analysed: {exc.msg}", exc.lineno or 0)
    except SyntaxError as exc:
        return StaticFinding(Reason.SYNTAX_ERROR, f"syntax error at line {exc.lineno}: {exc.msg}", exc.lineno or 0)

    model_new = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"]
    if not model_new:
        return StaticFinding(Reason.NO_MODEL_NEW, "the candidate defines no top-level `class ModelNew`")
    for base in model_new[0].bases:
        if _dotted(base).split(".")[-1] == "Model":
            return StaticFinding(Reason.SUBCLASSES_REFERENCE,
                                 "ModelNew inherits the reference Model; it must compute with its own kernels",
                                 model_new[0].lineno)

    # Kernels come from the candidate itself, or from crucible's own verified seeds package (a seed for one task
    # may launch the kernels of its family file); the launch trace checks at run time which ones actually ran.
    uses_seeds = any(isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "seeds" or
                     isinstance(n, ast.Import) and any(a.name.split(".")[0] == "seeds" for a in n.names)
                     for n in ast.walk(tree))
    if not uses_seeds and not any(_is_triton_jit(fn) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)):
        return StaticFinding(Reason.NO_TRITON_KERNEL, "the candidate defines no @triton.jit kernel")

    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            return StaticFinding(Reason.TRY_EXCEPT, "try/except is not allowed: a failing kernel must fail, "
                                 "not fall back to another path", line)
        if isinstance(node, ast.Import):
            for alias in node.names:
                bad = _bad_module(alias.name)
                if bad:
                    return StaticFinding(Reason.FORBIDDEN_IMPORT, bad, line)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                return StaticFinding(Reason.FORBIDDEN_IMPORT, "relative imports are not allowed", line)
            bad = _bad_module(node.module or "")
            if not bad:
                for alias in node.names:
                    bad = _bad_module(f"{node.module}.{alias.name}", check_root=False)
                    if bad or alias.name in FORBIDDEN_ATTRS or alias.name in FORBIDDEN_NAMES:
                        bad = bad or f"importing {node.module}.{alias.name} is not allowed"
                        break
            if bad:
                return StaticFinding(Reason.FORBIDDEN_IMPORT, bad, line)
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            return StaticFinding(Reason.FORBIDDEN_CALL, f"`{node.id}` is not allowed in a candidate", line)
        elif isinstance(node, ast.Attribute) and (node.attr in FORBIDDEN_ATTRS or (
                node.attr.startswith("__") and node.attr not in ALLOWED_DUNDERS)):
            return StaticFinding(Reason.FORBIDDEN_CALL, f"`.{node.attr}` is not allowed in a candidate "
                                 f"(in `{_dotted(node)}`)", line)
        elif isinstance(node, ast.Name) and node.id.startswith("__") and node.id not in ("__name__", "__file__"):
            return StaticFinding(Reason.FORBIDDEN_CALL, f"`{node.id}` is not allowed in a candidate", line)
        elif isinstance(node, ast.Global):
            return StaticFinding(Reason.FORBIDDEN_CALL, "`global` state is not allowed: caching across calls is "
                                 "a known cheat", line)
    return None


def _bad_module(name: str, check_root: bool = True) -> str | None:
    root = name.split(".")[0]
    if check_root and root not in ALLOWED_IMPORTS:
        return (f"import of `{name}` is not allowed; candidates may import only "
                f"{', '.join(sorted(ALLOWED_IMPORTS))}")
    for bad in FORBIDDEN_MODULES:
        if name == bad or name.startswith(bad + "."):
            return f"import of `{name}` is not allowed"
    return None


def _is_triton_jit(fn: ast.FunctionDef) -> bool:
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if _dotted(target) in ("triton.jit", "jit", "triton.autotune", "triton.heuristics"):
            return True
    return False


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))
