"""Getting the candidate file out of a model's reply.

Replies come with prose around the code, several fenced blocks (```python, ```py, bare ```, ~~~, an unterminated last
fence), a reasoning section (<think>...</think>) with drafts in it, or the kernels in one block and ModelNew in the
next. The rule: take the (last) Python block that defines `ModelNew`; pull in from the other blocks the top-level
definitions and imports it uses but does not define; with no ModelNew anywhere, take the largest Python block. Code
that does not parse is still returned (the harness reports the syntax error with its line number, which the model
can fix); a reply with no Python at all is a `NoCode`, a result, never an exception.
"""
from __future__ import annotations

import ast
import builtins
import functools
import re
import textwrap
from dataclasses import dataclass

from sandbox import pyparse

PY_LANGS = {"python", "py", "python3", "py3", "ipython", "triton", "pycon"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+#.-]*)[^\n`]*$")
_THINK = re.compile(r"<(think|thinking|reasoning)>.*?(</\1>|\Z)", re.S | re.I)
_MODEL_NEW = re.compile(r"^class[ \t]+ModelNew\b", re.M)
_CODE_START = re.compile(r"^(import |from [\w.]+ import |@|def |class |#!|\"\"\"|'''|[A-Z_][A-Z0-9_]* *=)")
_BUILTINS = set(dir(builtins)) | {"__name__", "__file__", "__doc__"}
MAX_TRIM = 80  # lines of stray prose we try dropping from either end of a block that does not parse


@dataclass(frozen=True)
class ExtractedCode:
    source: str  # the candidate file, ending with a newline
    blocks: int  # Python code blocks found in the reply
    merged: bool  # definitions were pulled in from other blocks
    parses: bool  # ast.parse accepts it (if not, the harness reports the syntax error)
    has_model_new: bool
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class NoCode:
    reason: str  # one sentence, recorded as the candidate's failure and shown to the model on the next turn


def extract_code(reply: str) -> ExtractedCode | NoCode:
    text = (reply or "").replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff")
    if not text.strip():
        return NoCode("the reply was empty")
    outside = _THINK.sub("", text)
    result = _extract(outside)
    if isinstance(result, NoCode) and outside != text:
        # Everything was inside the reasoning section: better its last draft than nothing.
        inner = _extract(text.replace("<think>", "").replace("</think>", ""))
        if isinstance(inner, ExtractedCode):
            return ExtractedCode(**{**inner.__dict__, "notes": inner.notes + ("taken from the reasoning section",)})
    return result


def outside_reasoning(reply: str) -> str:
    """The reply without its reasoning sections (<think>...</think>), whose drafts are not the answer."""
    return _THINK.sub("", (reply or "").replace("\r\n", "\n"))


def _extract(text: str) -> ExtractedCode | NoCode:
    blocks, other_langs = _fenced_blocks(text)
    python = [b for b in blocks if b.strip()]
    if not python:
        if other_langs:
            return NoCode(f"the reply's code blocks are not Python ({', '.join(sorted(other_langs))})")
        loose = _unfenced(text)
        if loose is None:
            return NoCode("the reply contains no Python code block")
        python = [loose]
    notes: list[str] = []
    with_model = [b for b in python if _MODEL_NEW.search(b)]
    if with_model:
        parsing = [b for b in with_model if _parses(b)]
        chosen = (parsing or with_model)[-1]
        if len(with_model) > 1:
            notes.append(f"{len(with_model)} blocks define ModelNew; took the last complete one")
    else:
        chosen = max(python, key=len)
        notes.append("no block defines ModelNew; took the largest Python block")
    chosen = _trim(chosen)
    merged = False
    if _parses(chosen) and len(python) > 1:
        combined = _merge(chosen, [b for b in python if b is not chosen])
        if combined != chosen:
            chosen, merged = combined, True
            notes.append("definitions merged from several blocks")
    source = chosen.strip("\n") + "\n"
    return ExtractedCode(source=source, blocks=len(python), merged=merged, parses=_parses(source),
                         has_model_new=bool(_MODEL_NEW.search(source)), notes=tuple(notes))


def _fenced_blocks(text: str) -> tuple[list[str], set[str]]:
    """Python-looking fenced blocks in order, and the other languages seen. An unterminated fence runs to the end."""
    lines = text.split("\n")
    blocks: list[str] = []
    others: set[str] = set()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group("fence"), m.group("lang").lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = lines[j].strip()
            if close and close[0] == fence[0] and set(close) == {fence[0]} and len(close) >= len(fence):
                break
            body.append(lines[j])
            j += 1
        code = textwrap.dedent("\n".join(body))
        if lang in PY_LANGS or (not lang and _looks_like_python(code)):
            blocks.append(code)
        elif lang and code.strip():
            others.add(lang)
        elif not lang and code.strip():
            others.add("unlabelled text")
        i = j + 1
    return blocks, others


def _unfenced(text: str) -> str | None:
    """Code written without fences: from the first line that starts Python to the last line that keeps it parsing."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
    if start is None:
        return None
    code = _trim("\n".join(lines[start:]))
    if not _parses(code) or not (_MODEL_NEW.search(code) or re.search(r"^\s*(import|from)\s+\w", code, re.M)):
        return None
    return code


def _trim(code: str) -> str:
    """Drop stray prose from the ends of a block that does not parse, keeping the ModelNew definition."""
    if _parses(code):
        return code
    lines = code.strip("\n").split("\n")
    need_model = bool(_MODEL_NEW.search(code))
    for tail in range(0, min(MAX_TRIM, len(lines))):
        kept = lines[:len(lines) - tail]
        if need_model and not _MODEL_NEW.search("\n".join(kept)):
            break
        for head in range(0, min(8, len(kept))):
            candidate = "\n".join(kept[head:])
            if need_model and not _MODEL_NEW.search(candidate):
                break
            if (head or tail) and _parses(candidate):
                return candidate
    return code


def _merge(chosen: str, others: list[str]) -> str:
    """Pull into `chosen` the top-level imports and definitions from `others` that it uses but does not define."""
    tree = pyparse.parse(chosen)
    bound = _bound_names(tree)
    needed = _free_names(tree) - bound
    pieces: list[tuple[str, bool]] = []  # (source, is_import)
    taken: set[int] = set()
    pool = [(b, pyparse.parse(b)) for b in others if _parses(b)]
    changed = True
    while needed and changed:
        changed = False
        for block, btree in pool:
            lines = block.split("\n")
            for node in btree.body:
                names = _defined_by(node)
                if id(node) in taken or not (names & needed):
                    continue
                taken.add(id(node))
                first = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
                pieces.append(("\n".join(lines[first - 1:node.end_lineno]), isinstance(node, (ast.Import,
                                                                                            ast.ImportFrom))))
                bound |= names
                needed = (needed | (_free_names(node) - bound)) - bound
                changed = True
    if not pieces:
        return chosen
    # Insert after the chosen block's leading docstring/imports so the pulled kernels see triton imported.
    chosen_lines = chosen.split("\n")
    at = 0
    for i, node in enumerate(tree.body):
        is_doc = i == 0 and isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant)
        if isinstance(node, (ast.Import, ast.ImportFrom)) or is_doc:
            at = node.end_lineno
        else:
            break
    present = {line.strip() for line in chosen_lines[:at]}
    imports = [p for p, is_imp in pieces if is_imp and p.strip() not in present]
    defs = [p for p, is_imp in pieces if not is_imp]
    parts = (["\n".join(imports)] if imports else []) + defs
    rest = "\n".join(chosen_lines[at:]).lstrip("\n")
    return "\n".join(chosen_lines[:at]) + "\n\n" + "\n\n\n".join(parts) + "\n\n\n" + rest


def _defined_by(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _bound_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= _defined_by(node)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _free_names(tree: ast.AST) -> set[str]:
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loaded - _BUILTINS - (_bound_names(tree) if not isinstance(tree, ast.Module) else set())


def _looks_like_python(code: str) -> bool:
    if not code.strip():
        return False
    has_python_lines = re.search(r"^\s*(import |from [\w.]+ import |def |class |@triton)", code, re.M) is not None
    return has_python_lines or _parses(code) and bool(re.search(r"\w+\s*\(", code))


@functools.lru_cache(maxsize=64)
def _parses(code: str) -> bool:
    try:
        pyparse.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


@functools.lru_cache(maxsize=64)  # each candidate's is asked for as it is proposed, admitted and recorded
def normal_form(source: str) -> str | None:
    """The code with comments, docstrings and formatting removed (its AST, dumped); None when it does not parse.
    Two files with one normal form run the same code: the second is not checked again."""
    try:
        tree = pyparse.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False, include_attributes=False)
