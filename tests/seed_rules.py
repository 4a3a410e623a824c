"""The harness's static rules and a seed module without a ModelNew of its own (a kernel module another seed imports,
such as seeds/attention_gluon.py). The seeds package is crucible's own reviewed code, trusted like torch and Triton
(sandbox/static.py's docstring), so the module itself is not held to the candidate rules; what the check guards is
the boundary: a candidate may take every kernel, launcher and class the module defines."""
from __future__ import annotations

import ast
from pathlib import Path

from sandbox.static import check_source


def assert_static_rules(path: str | Path) -> None:
    """sandbox/static.py's check_source accepts a candidate that imports every function and class the module defines,
    and the module names no hasattr: the 3.6 / 3.9 API differences are picked by `dir()`."""
    path = Path(path)
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("__")]
    assert names, f"{path}: defines nothing to import"
    candidate = f"from seeds.{path.stem} import {', '.join(names)}\n\n\nclass ModelNew:\n    pass\n"
    finding = check_source(candidate, f"uses_{path.name}")
    assert finding is None, f"{path}: {finding.message} (line {finding.line})"
    hasattrs = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "hasattr"]
    assert not hasattrs, f"{path}: hasattr at lines {hasattrs}"
