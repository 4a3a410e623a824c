"""Can the code that runs in the candidate's process differ from the text the static stage checked?

The worker runs the checked text (sandbox/worker.py `_exec_source`), but Triton does not run a kernel from the code
object Python compiled: it reads the kernel's source again (inspect.getsourcelines, through the linecache entry
`_exec_source` puts there) and compiles that: to PTX on the GPU (JITFunction), and on the CPU interpreter to Python
again (FunctionRewriter.rewrite_ast), run inside the launch, where the trace stands aside and the audit hook trusts
everything. So any way to make "the kernel's source as Triton reads it" differ from "the kernel's code as the static
stage saw it" would run unchecked Python:

1. str.splitlines also breaks at \\v \\f \\x1c-\\x1e \\x85 \\u2028 \\u2029, Python's tokenizer only at \\n, \\r\\n,
   \\r: linecache lines split so would shift after a form feed in a comment, and inspect would find a kernel's
   source in a string the static stage saw as data. The worker splits as the tokenizer does.
2. The interpreter's rewriter takes the last line of a kernel's source that starts with `def ` as the definition
   (FunctionRewriter._find_def): a docstring line written so would become the kernel. The static stage refuses it.

The hidden code in these candidates only reports that it ran (gc.get_objects(), which the audit hook refuses outside
a trusted window); it could as well compute the answer in numpy, keep state, or fork.
"""
import inspect
import types
from pathlib import Path

import pytest

from sandbox.harness import CheckOptions, Harness
from sandbox.records import Reason, Stage

HERE = Path(__file__).parent
HONEST_ROW_MEAN = HERE / "candidates" / "row_mean_honest.py"
ROW_MEAN = HERE / "tasks" / "row_mean.py"
MARK = "HIDDEN CODE RAN"

# Line breaks for str.splitlines that the Python tokenizer reads as no line break (inside comments and strings).
SPLITLINES_ONLY = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def _shifted_source(ch: str) -> str:
    return ("# notes" + ch + "more notes\n"
            "S = '''\n"
            "def kernel():\n"
            "    return 'the string the static stage saw as data'\n"
            "'''\n"
            "def kernel():\n"
            "    return 'the checked code'\n")


@pytest.mark.parametrize("ch", SPLITLINES_ONLY, ids=[f"U+{ord(c):04X}" for c in SPLITLINES_ONLY])
def test_linecache_lines_are_the_lines_python_compiled(tmp_path, ch):
    """What inspect (and so Triton) reads as a function's source is the function the worker compiled, whatever
    characters a comment holds."""
    from sandbox import worker
    path = str(tmp_path / f"cand_{ord(ch):x}.py")
    text = _shifted_source(ch)
    Path(path).write_text(text, encoding="utf-8")
    module = types.ModuleType("linecache_shift")
    worker._exec_source(module, text, path)
    assert module.kernel() == "the checked code"
    assert "the checked code" in inspect.getsource(module.kernel), (
        f"inspect read the kernel's source from the wrong lines after a {ch!r} in a comment:\n"
        f"{inspect.getsource(module.kernel)}")


def test_the_gpu_jit_compiles_the_checked_kernel_source(tmp_path):
    """The same shift on the GPU path: triton's JITFunction takes its source (what it hashes, caches and compiles to
    PTX) from inspect, so it would compile the kernel written in a string. Shown without a GPU: the JITFunction's
    source text is built at decoration time."""
    from triton.runtime.jit import JITFunction

    from sandbox import worker
    text = ("import triton\nimport triton.language as tl\n"
            "# notes" + "\x0c" * 4 + "\n"
            "S = '''\n"
            "@triton.jit\n"
            "def kernel(x_ptr):\n"
            "    tl.store(x_ptr, 666)\n"
            "'''\n"
            "\n"
            "def kernel(x_ptr):\n"
            "    tl.store(x_ptr, 1)\n")
    path = str(tmp_path / "cand_jit.py")
    Path(path).write_text(text, encoding="utf-8")
    module = types.ModuleType("jit_source")
    worker._exec_source(module, text, path)
    jitted = JITFunction(module.kernel)
    assert "666" not in jitted.src, f"Triton would compile this kernel source, not the checked one:\n{jitted.src}"


@pytest.fixture(scope="module")
def harness():
    with Harness("cpu") as h:
        yield h


# What the hidden code does if it runs: report that it ran where the audit hook would refuse gc.get_objects().
HIDDEN_BODY = ("    raise RuntimeError('HIDDEN CODE RAN with the audit hook off: gc.get_objects() gave '\n"
               "                       + str(len(__import__('gc').get_objects())) + ' objects')\n")
KERNEL_DEF = "@triton.jit\ndef _row_mean_kernel(x_ptr, y_ptr, n_cols: tl.constexpr, stride_row, BLOCK: tl.constexpr):\n"
# The honest row mean, a comment of form feeds and, before its kernel, a kernel in a string: linecache lines split at
# each form feed would make inspect read the kernel's source from the string.
LINECACHE_SHIFT = ("# layout notes" + "\x0c" * 6 + " (form feeds)\n_NOTES = \"\"\"\n@triton.jit\n"
                   "def _row_mean_kernel(x_ptr, y_ptr, n_cols, stride_row, BLOCK):\n" + HIDDEN_BODY + '"""\n\n\n')
# The honest row mean whose kernel's docstring holds a line starting `def ` (the interpreter's rewriter compiles
# from the last such line: the docstring's text would be the kernel, the checked body dead code after it).
DOCSTRING_DEF = ('    """Layout notes.\ndef _row_mean_kernel(x_ptr, y_ptr, n_cols, stride_row, BLOCK):\n' + HIDDEN_BODY +
                 '#"""\n')


def _check(harness, tmp_path, before: str = "", after: str = ""):
    """The honest row mean with `before` its kernel's def and `after` it (its first body line), checked."""
    honest = HONEST_ROW_MEAN.read_text(encoding="utf-8")
    assert KERNEL_DEF in honest
    candidate = tmp_path / "candidate.py"
    candidate.write_text(honest.replace(KERNEL_DEF, before + KERNEL_DEF + after, 1), encoding="utf-8")
    result = harness.check(ROW_MEAN, candidate, CheckOptions(device="cpu", timeout_s=60))
    text = " ".join([result.message] + [f"{s.message} {s.error}" for s in result.stages])
    return result, text


def test_form_feeds_in_a_comment_do_not_run_a_kernel_hidden_in_a_string(harness, tmp_path):
    """Attack 1 through the harness: LINECACHE_SHIFT passes the static stage (its hidden kernel is a string); the
    check runs the checked kernel, an honest row mean, and the string's code never runs."""
    result, text = _check(harness, tmp_path, before=LINECACHE_SHIFT)
    assert MARK not in text, f"unchecked code ran in the candidate's process: {result.message}"
    assert result.accepted, (result.stage, result.reason, result.message)


def test_a_def_line_in_a_kernel_docstring_does_not_become_the_kernel(harness, tmp_path):
    """Attack 2: DOCSTRING_DEF gives the kernel a docstring with a line starting `def `, from which the
    CPU interpreter's rewriter would compile the kernel (the docstring's text would run, the checked body dead code
    after it). The static stage refuses a line starting with `def ` after a kernel's own `def` line."""
    result, text = _check(harness, tmp_path, after=DOCSTRING_DEF)
    assert MARK not in text, f"unchecked code ran in the candidate's process: {result.message}"
    assert (result.stage, result.reason) == (Stage.STATIC, Reason.FORBIDDEN_CALL), result.message
    assert "starts with `def `" in result.message
