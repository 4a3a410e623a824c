"""ast.parse behind one process-wide lock, with bounds on what it will try to analyse.

CPython's AST constructor keeps its recursion depth in interpreter-wide state, so two threads parsing at once can
corrupt it (3.11.7 here: "SystemError: AST constructor recursion depth mismatch"), and the lanes of `crucible batch
--gpus N` parse candidates, tuner variants and LLM replies on several threads. Every parse in crucible goes through
`parse`; the trees it returns are ordinary and may be walked anywhere.

Sources come from LLMs and users, so a parse must end in a tree or a SyntaxError, never in another exception: a
megabyte of `1+1+...` makes CPython raise RecursionError while it builds the tree, a long run of unary operators
MemoryError, and a tree that does parse can still be too deep for the recursive walkers downstream (ast.unparse,
NodeVisitor, the compiler). Such sources raise `Unanalysable`, a SyntaxError, so every caller that refuses bad
code already refuses these. Real kernels nest about 20 deep (the seeds, tests and benchmarks at most 20).
"""
from __future__ import annotations

import ast
import hashlib
import io
import threading
from collections import OrderedDict

_LOCK = threading.Lock()
MAX_SOURCE_CHARS = 1_000_000  # the largest file in the repository is under 100 kB
MAX_AST_DEPTH = 100
# The depths of the sources parsed last: a search parses one candidate several times (its extraction, flattening,
# normal form, niche, knobs; 2,600 lines for the attention seed), and the depth walk costs about what ast.parse does.
# Kept by the source's sha256: its digest, not the source, so 64 sources of up to a megabyte cost nothing to keep.
_DEPTHS: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
DEPTHS_KEPT = 64


def source_lines(source: str) -> list[str]:
    """The source's lines as Python's tokenizer numbers them and linecache reads a file: broken at \\n, \\r\\n and
    \\r only (str.splitlines also breaks at form feeds and other separators inside comments and strings). The
    static stage counts a kernel's lines so, and the candidate's process gives Triton the same lines."""
    return io.StringIO(source, newline=None).readlines()


class Unanalysable(SyntaxError):
    """The source is too large or too deeply nested to analyse safely."""


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse(source, filename), one thread at a time; SyntaxError as ast.parse raises it, and Unanalysable (a
    SyntaxError) for a source past the size or nesting bounds."""
    if len(source) > MAX_SOURCE_CHARS:
        raise _unanalysable(f"the source has {len(source):,} characters, more than the {MAX_SOURCE_CHARS:,} "
                            "that are analysed", filename)
    with _LOCK:
        try:
            tree = ast.parse(source, filename=filename)
        except SyntaxError:
            raise
        except (RecursionError, MemoryError):
            raise _unanalysable("the source nests expressions too deeply to analyse", filename) from None
        except ValueError as exc:  # e.g. null bytes, on Pythons that raise ValueError for them
            raise _unanalysable(f"the source cannot be parsed: {exc}", filename) from None
    key = hashlib.sha256(source.encode("utf-8", "surrogatepass")).digest()
    with _LOCK:
        known = _DEPTHS.get(key)
        if known is not None:
            _DEPTHS.move_to_end(key)
    depth, line = known or _depth(tree)
    if known is None:
        with _LOCK:
            _DEPTHS[key] = (depth, line)
            while len(_DEPTHS) > DEPTHS_KEPT:
                _DEPTHS.popitem(last=False)
    if depth > MAX_AST_DEPTH:
        raise _unanalysable(f"the source nests {depth} levels deep (near line {line}), more than the "
                            f"{MAX_AST_DEPTH} that are analysed", filename, line)
    return tree


def _depth(tree: ast.AST) -> tuple[int, int]:
    """The tree's depth and a line at its deepest point, without recursion (the tree may be very deep)."""
    best, line = 0, 0
    stack = [(tree, 1)]
    while stack:
        node, d = stack.pop()
        if d > best:
            best, line = d, getattr(node, "lineno", line)
        if d <= MAX_AST_DEPTH:  # past the bound the answer is known; do not walk a huge chain to its end
            stack.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return best, line


def _unanalysable(msg: str, filename: str, line: int = 1) -> Unanalysable:
    return Unanalysable(msg, (filename, line, 0, None))
