"""Getting the candidate file out of replies as models really write them."""
from __future__ import annotations

import ast

import pytest

from agent.llm.extract import ExtractedCode, NoCode, extract_code

KERNEL = '''import triton
import triton.language as tl


@triton.jit
def _double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, 2 * tl.load(x_ptr + offs, mask=mask), mask=mask)'''

MODEL = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _double_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y'''

FULL = KERNEL + "\n\n\n" + MODEL


def fenced(code: str, lang: str = "python", fence: str = "```") -> str:
    return f"{fence}{lang}\n{code}\n{fence}"


def defined(source: str) -> set[str]:
    return {n.name for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def ok(reply: str) -> ExtractedCode:
    result = extract_code(reply)
    assert isinstance(result, ExtractedCode), result
    assert result.source.endswith("\n") and "```" not in result.source
    return result


@pytest.mark.parametrize("lang", ["python", "py", "Python3", ""])
def test_single_block_with_prose_around(lang):
    reply = f"Sure! This version fuses the loads.\n\n{fenced(FULL, lang)}\n\nIt should be about 2x faster."
    result = ok(reply)
    assert result.source == FULL + "\n" and result.parses and result.has_model_new and not result.merged


def test_tilde_fence_and_longer_fences_with_inner_backticks():
    inner = FULL + '\n\n"""Usage:\n```\nModelNew()(x)\n```\n"""\n'
    result = ok("~~~python\n" + FULL + "\n~~~\n")
    assert result.source == FULL + "\n"
    result = extract_code("````python\n" + inner + "````\n")  # a ``` line inside a ```` fence does not close it
    assert isinstance(result, ExtractedCode) and result.source == inner and result.parses


def test_indented_block_in_a_list_is_dedented():
    body = "\n".join("   " + line if line else line for line in FULL.split("\n"))
    result = ok("1. The file:\n   ```python\n" + body + "\n   ```\n")
    assert result.source == FULL + "\n"


def test_picks_the_block_that_defines_model_new_over_a_larger_one():
    usage = "import torch\n" + "\n".join(f"x{i} = torch.randn({i + 1})" for i in range(60))
    reply = f"{fenced(usage)}\n\nThe kernel:\n{fenced(FULL)}\n\nRun it with:\n```bash\npython run.py\n```"
    result = ok(reply)
    assert result.source == FULL + "\n" and result.blocks == 2


def test_takes_the_last_model_new_when_a_draft_comes_first():
    draft = FULL.replace("2 * tl.load", "3 * tl.load")
    result = ok(f"First attempt:\n{fenced(draft)}\nWait, that is wrong. Final:\n{fenced(FULL)}")
    assert "2 * tl.load" in result.source and "3 * tl.load" not in result.source
    assert any("took the last" in n for n in result.notes)


def test_kernels_and_model_new_split_over_blocks_are_merged():
    reply = (f"The kernel:\n{fenced(KERNEL)}\n\nAnd a quick test you can run:\n"
             f"{fenced('x = torch.randn(8)' + chr(10) + 'print(ModelNew()(x))')}\n\n"
             f"The module:\n{fenced(MODEL, 'py')}")
    result = ok(reply)
    assert result.merged and result.parses and result.has_model_new
    assert defined(result.source) == {"_double_kernel", "ModelNew"}
    assert "print(" not in result.source  # the usage snippet is not pulled in
    tree = ast.parse(result.source)
    # imports come before the kernel definition, so @triton.jit sees `triton`
    first_def = next(i for i, n in enumerate(tree.body) if isinstance(n, ast.FunctionDef))
    imported = {a.asname or a.name for n in tree.body[:first_def] if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    assert {"triton", "triton.language", "torch"} <= imported | {"triton.language"} and "tl" in imported
    namespace: dict = {}
    exec(compile(result.source, "merged.py", "exec"), namespace)  # it really imports and defines everything
    assert callable(namespace["ModelNew"])


def test_merge_pulls_transitive_helpers_only():
    helpers = ("import triton\nimport triton.language as tl\n\nBLOCK = 256\n\n"
               "@triton.jit\ndef _unused(x_ptr):\n    pass\n\n"
               "def pick_block(n):\n    return min(BLOCK, n)\n")
    model = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return pick_block(x)\n"
    result = ok(fenced(helpers) + "\n" + fenced(model))
    assert "def pick_block" in result.source and "BLOCK = 256" in result.source and "_unused" not in result.source


def test_unterminated_fence_with_trailing_prose():
    reply = f"Here:\n```python\n{FULL}\n\nThis kernel reads x once and writes y once, so it is memory bound."
    result = ok(reply)
    assert result.source == FULL + "\n" and result.parses


def test_unfenced_code_with_prose_before_and_after():
    reply = f"Here is the updated file.\n\n{FULL}\n\nLet me know if you need the backward pass."
    result = ok(reply)
    assert result.source == FULL + "\n"


def test_think_section_drafts_are_ignored():
    draft = FULL.replace("2 * tl.load", "4 * tl.load")
    reply = f"<think>Maybe:\n{fenced(draft)}\nno, simpler.</think>\nFinal answer:\n{fenced(FULL)}"
    assert "4 * tl.load" not in ok(reply).source


def test_code_only_inside_think_is_used_as_a_last_resort():
    result = ok(f"<think>{fenced(FULL)}</think>I ran out of time.")
    assert result.source == FULL + "\n" and "reasoning" in result.notes[-1]


def test_syntax_error_is_returned_for_the_harness_to_report():
    broken = FULL.replace("def forward(self, x):", "def forward(self, x)")
    result = ok(fenced(broken))
    assert not result.parses and result.has_model_new and "def forward(self, x)\n" in result.source


def test_no_model_new_falls_back_to_the_largest_python_block():
    result = ok(fenced("import torch") + "\n" + fenced(KERNEL))
    assert result.source == KERNEL + "\n" and not result.has_model_new
    assert "no block defines ModelNew" in result.notes[0]


def test_windows_line_endings():
    result = ok(fenced(FULL).replace("\n", "\r\n"))
    assert result.source == FULL + "\n"


@pytest.mark.parametrize("reply, reason", [
    ("", "the reply was empty"),
    ("   \n\n ", "the reply was empty"),
    (None, "the reply was empty"),
    ("I'm sorry, but I can't help with making this faster.", "the reply contains no Python code block"),
    ("Install it first:\n```bash\npip install triton\n```\n```json\n{\"a\": 1}\n```",
     "the reply's code blocks are not Python (bash, json)"),
    ("```\nThe answer is that the op is memory bound.\n```", "the reply's code blocks are not Python (unlabelled text)"),
    ("```python\n```", "the reply contains no Python code block"),
])
def test_no_usable_code_is_a_result_not_an_exception(reply, reason):
    assert extract_code(reply) == NoCode(reason)
