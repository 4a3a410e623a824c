"""Is the kernel code Triton compiles exactly a kernel the static stage checked as one? What Triton compiles is
not read from the file at launch but from state on the kernel object, which plain attribute syntax reaches:

* GPU (JITFunction): the code generator compiles `self._src` (JITFunction.parse); `k._unsafe_update_src(text)` and
  `k._src = text` would replace it with a string the static stage saw as data.
* CPU interpreter (InterpretedFunction): `self.rewrite()` -> `self.rewriter.rewrite_ast()` -> `_prepare_source`,
  compiled and run in the kernel's module globals inside the launch's trusted window; `k.rewriter._prepare_source`,
  `k.rewriter.rewrite_ast`, `k.rewrite`, or the class-wide dict `k.rewritten_fn` would put other code there.

The static stage refuses private attributes of any object but the candidate's own (`self._x`) and Triton's rewriter
names. The last test is a lesser divergence: Python's pure-Python tokenize (inspect.getblock) ends a kernel's block at
a line that is a lone backslash, which the C parser reads as a continuation, so Triton would compile only a prefix of
the checked kernel; the static stage refuses such a line in a kernel.
"""
from __future__ import annotations

import inspect
import types

import pytest
import torch

from sandbox import worker
from sandbox.static import check_source

HEAD = "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n\n"
KERNEL = ("@triton.jit\n"
          "def k(x_ptr):\n"
          "    tl.store(x_ptr, 1)\n"
          "\n\n")
TAIL = ("\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n"
        "        k[(1,)](x)\n"
        "        return x\n")
HIDDEN = "def k(x_ptr):\\n    tl.store(x_ptr, 666)\\n"  # as a Python string literal's body


def _load(tmp_path, monkeypatch, text: str, interpret: bool) -> types.ModuleType | None:
    """The candidate's module as the worker builds it, or None when the static stage refuses the text."""
    finding = check_source(text)
    if finding is not None:
        return None
    monkeypatch.setenv("TRITON_INTERPRET", "1" if interpret else "0")
    path = str(tmp_path / "candidate.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    module = types.ModuleType("kernel_state_candidate")
    module.__file__ = path
    worker._exec_source(module, text, path)
    return module


def _launch(module) -> int:
    x = torch.zeros(1, dtype=torch.int32)
    module.k[(1,)](x)
    return int(x[0])


# ---- GPU: JITFunction compiles `_src` ----------------------------------------------------------------------------
@pytest.mark.parametrize("statement", [
    f'k._unsafe_update_src("{HIDDEN}")\n',
    f'k._src = "{HIDDEN}"\n',
], ids=["_unsafe_update_src", "_src_store"])
def test_the_gpu_jit_source_cannot_be_replaced_by_a_string(tmp_path, monkeypatch, statement):
    from triton.runtime.jit import JITFunction
    module = _load(tmp_path, monkeypatch, HEAD + KERNEL + statement + TAIL, interpret=False)
    if module is None:
        return  # refused statically: fine
    assert isinstance(module.k, JITFunction)
    compiled = module.k.src  # what JITFunction.parse() hands the code generator
    assert "666" not in compiled and "tl.store(x_ptr, 1)" in compiled, (
        f"the static stage passed `{statement.strip()}`; Triton would compile this unchecked kernel:\n{compiled}")


# ---- CPU interpreter: the rewriter's state -------------------------------------------------------------------------
INTERPRETER_ATTACKS = {
    # the interpreter compiles and execs whatever text _prepare_source returns, in the module's globals
    "rewriter._prepare_source": ("def _other_source(lines):\n"
                                 f'    return "{HIDDEN}"\n\n\n'
                                 "k.rewriter._prepare_source = _other_source\n"),
    # a plain Python function (checked as one, not as a kernel) becomes the kernel body run in the launch
    "rewriter.rewrite_ast": ("_CALLS = []\n\n\n"
                             "def _plain(x_ptr):\n"
                             "    _CALLS.append(x_ptr)  # module state: no kernel body may do this\n"
                             "    tl.store(x_ptr, 666)\n\n\n"
                             "def _rewrite_ast():\n"
                             "    return _plain\n\n\n"
                             "k.rewriter.rewrite_ast = _rewrite_ast\n"),
    "rewrite": ("_CALLS = []\n\n\n"
                "def _plain(x_ptr):\n"
                "    _CALLS.append(x_ptr)\n"
                "    tl.store(x_ptr, 666)\n\n\n"
                "def _rewrite():\n"
                "    return _plain\n\n\n"
                "k.rewrite = _rewrite\n"),
}


@pytest.mark.parametrize("name", list(INTERPRETER_ATTACKS))
def test_the_interpreter_compiles_the_checked_kernel(tmp_path, monkeypatch, name):
    module = _load(tmp_path, monkeypatch, HEAD + KERNEL + INTERPRETER_ATTACKS[name] + TAIL, interpret=True)
    if module is None:
        return
    value = _launch(module)
    assert value == 1, f"the static stage passed `k.{name} = ...`; the launch ran other code than the checked " \
                       f"kernel (it stored {value})"


def test_the_interpreters_shared_rewrite_cache_cannot_be_repointed(tmp_path, monkeypatch):
    """InterpretedFunction.rewritten_fn is one dict for every kernel, reachable as `k.rewritten_fn`: after a first
    launch, the candidate points its entries at a plain function (no `.fn` needed: it iterates the keys)."""
    swap = ("_CALLS = []\n\n\n"
            "def _plain(x_ptr):\n"
            "    _CALLS.append(x_ptr)\n"
            "    tl.store(x_ptr, 666)\n\n\n"
            "def _swap():\n"
            "    for key in list(k.rewritten_fn):\n"
            "        k.rewritten_fn[key] = _plain\n")
    module = _load(tmp_path, monkeypatch, HEAD + KERNEL + swap + TAIL, interpret=True)
    if module is None:
        return
    assert _launch(module) == 1
    module._swap()  # what forward would do after its first launch
    try:
        value = _launch(module)
    finally:  # the dict is class-wide: leave no plain function in it for other tests
        type(module.k).rewritten_fn.pop(module.k.fn, None)
    assert value == 1, f"the launch ran a plain Python function as the kernel (it stored {value})"


# ---- the pure-Python tokenizer ends the block early (Python <= 3.11) ---------------------------------------------
def test_a_column_zero_backslash_line_does_not_cut_the_compiled_kernel(tmp_path, monkeypatch):
    """`\\` alone in column 0 inside a kernel: CPython's parser reads it as a continuation (the next line keeps its
    own indentation, so the kernel goes on), tokenize.generate_tokens (inspect.getblock, 3.11) as a dedent, so
    getsourcelines returns the kernel up to that line and Triton compiles a prefix of the checked kernel: statements
    the static stage saw in it never run."""
    from triton.runtime.jit import JITFunction
    kernel = ("@triton.jit\n"
              "def k(x_ptr):\n"
              "    tl.store(x_ptr, 1)\n"
              "\\\n"
              "    tl.store(x_ptr + 1, 2)\n"
              "\n\n")
    module = _load(tmp_path, monkeypatch, HEAD + kernel + TAIL, interpret=False)
    if module is None:
        return
    assert "tl.store(x_ptr + 1, 2)" in JITFunction(module.k.fn).src, inspect.getsource(module.k.fn)


# ---- end to end through the CPU harness ---------------------------------------------------------------------------
# The honest row mean with the kernel's rewriter pointed at a string, inserted before its ModelNew.
PREPARE_SOURCE = """def _other_source(lines):
    return ("def _row_mean_kernel(x_ptr, y_ptr, n_cols, stride_row, BLOCK):\\n"
            "    raise RuntimeError('HIDDEN CODE RAN: gc.get_objects() gave '"
            " + str(len(__import__('gc').get_objects())) + ' objects')\\n")


_row_mean_kernel.rewriter._prepare_source = _other_source


"""


def test_a_string_does_not_run_as_the_kernel_through_the_harness(tmp_path):
    """The rewriter attack end to end: the string's code runs in the launch's trusted window, where the audit hook
    lets `gc.get_objects()` (and `__import__`) through."""
    from pathlib import Path

    from sandbox.harness import CheckOptions, Harness
    from sandbox.records import Stage
    candidate = tmp_path / "prepare_source.py"
    honest = (Path(__file__).parent / "candidates" / "row_mean_honest.py").read_text(encoding="utf-8")
    candidate.write_text(honest.replace("class ModelNew", PREPARE_SOURCE + "class ModelNew", 1), encoding="utf-8")
    row_mean = Path(__file__).parent / "tasks" / "row_mean.py"
    with Harness("cpu") as harness:
        result = harness.check(row_mean, candidate, CheckOptions(device="cpu", timeout_s=60))
    text = " ".join([result.message] + [f"{s.message} {s.error}" for s in result.stages])
    assert "HIDDEN CODE RAN" not in text, f"unchecked code ran in the candidate's process: {result.message}"
    assert result.stage is Stage.STATIC and "`.rewriter`" in result.message, result.message
