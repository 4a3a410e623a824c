"""The harness's static rules applied to a seed module without a ModelNew of its own (a kernel module another seed
imports, such as seeds/attention_gluon.py): a seed is a candidate, and what it imports runs in the candidate's
process, so the same check must accept it."""
from __future__ import annotations

import ast
from pathlib import Path

from sandbox.static import check_source


def assert_static_rules(path: str | Path) -> None:
    """sandbox/static.py's check_source accepts the module (given a stand-in ModelNew, which only the task's own
    seed file defines), and it names no hasattr either: the 3.6 / 3.9 API differences are picked by `dir()`."""
    source = Path(path).read_text(encoding="utf-8")
    finding = check_source(source + "\n\nclass ModelNew:\n    pass\n", str(path))
    assert finding is None, f"{path}: {finding.message} (line {finding.line})"
    hasattrs = [n.lineno for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name) and n.id == "hasattr"]
    assert not hasattrs, f"{path}: hasattr at lines {hasattrs}"
