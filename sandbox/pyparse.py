"""ast.parse behind one process-wide lock.

CPython's AST constructor keeps its recursion depth in interpreter-wide state, so two threads parsing at once can
corrupt it (3.11.7 here: "SystemError: AST constructor recursion depth mismatch"), and the lanes of `crucible batch
--gpus N` parse candidates, tuner variants and LLM replies on several threads. Every parse in crucible goes through
`parse`; the trees it returns are ordinary and may be walked anywhere.
"""
from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse(source, filename), one thread at a time; SyntaxError as ast.parse raises it."""
    with _LOCK:
        return ast.parse(source, filename=filename)
