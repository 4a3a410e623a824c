"""What a candidate's source may use: the data the static check (sandbox/static.py) reads, rule by rule.

The sections follow the rules of sandbox/static.py's docstring. Everything not listed here as allowed is refused;
the FORBIDDEN_ lists name what is refused even where a broader rule would let it through (an attribute of any
object, a dotted path, a keyword argument), and FORBIDDEN_NAMES is what the LLM's rules show.
"""
from __future__ import annotations

import functools
from pathlib import Path

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
LITERAL_NAME_BUILTINS = {"getattr": 2, "hasattr": 2}
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
    # what Triton compiles and runs for a kernel: its source, the interpreter's rewriter and the rewritten functions
    "raw_src", "rewriter", "rewrite", "rewritten_fn",
    # numeric flags, streams, graphs, the allocator
    "set_flush_denormal", "use_deterministic_algorithms", "allow_tf32", "set_float32_matmul_precision",
    "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction", "Stream", "stream",
    "ExternalStream", "set_stream", "empty_cache", "_cached", "CUDAGraph", "graph", "graphs", "memory",
    "format", "format_map",
})
# Dotted paths refused where their last name alone is fine elsewhere (tl.load is a kernel's, torch.load unpickles).
FORBIDDEN_PATHS = frozenset({"torch.load", "torch.save", "triton.heuristics", "triton.tools", "torch.jit", "torch.autograd.graph", "torch.autograd.grad"})
PATH_EXCEPTIONS = {"triton.tools.tensor_descriptor"}
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


@functools.lru_cache(maxsize=None)
def tensor_methods() -> frozenset[str]:
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
def module_attrs() -> frozenset[str]:
    """What torch.nn.Module defines: a candidate class redefines only MODULE_OVERRIDES of these."""
    import torch
    return frozenset(dir(torch.nn.Module))
