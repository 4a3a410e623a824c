"""A task file's integer constants as source: naming a tuple's elements, and placing new values where the file
assigns them.

A constant is a module-level integer (`N = 4096`) or an integer element of a module-level tuple, named
`input_shape[0]`. A task at another size is the file executed again with `NAME = value` inserted after each top-level
assignment to an overridden name (`pin_assignments`), so the values the file derives from it follow; `derived_names`
tells those derived values from the literal constants that may be rescaled on their own. sandbox/task.py uses these
when it loads a task.
"""
from __future__ import annotations

import ast
import re
import types
from typing import Any

from . import pyparse


def tuple_element(name: str) -> tuple[str, int] | None:
    """`input_shape[0]` -> ("input_shape", 0): the name of a tuple's element; None for a plain name."""
    m = re.fullmatch(r"([A-Za-z_]\w*)\[(\d+)\]", name)
    return (m.group(1), int(m.group(2))) if m else None


def constant_value(module: types.ModuleType, name: str) -> int:
    element = tuple_element(name)
    return int(getattr(module, element[0])[element[1]] if element else getattr(module, name))


def replaced(value: Any, elements: dict[int, int]) -> Any:
    """The tuple `value` with some elements replaced; a value that is no longer a tuple long enough is left alone."""
    if not isinstance(value, tuple) or max(elements) >= len(value):
        return value
    return tuple(elements.get(i, v) for i, v in enumerate(value))


def by_target(overrides: dict[str, int]) -> dict[str, Any]:
    """Overrides by the top-level name they replace: an int for a plain constant, {index: int} for a tuple's."""
    out: dict[str, Any] = {}
    for name, v in overrides.items():
        element = tuple_element(name)
        if element:
            out.setdefault(element[0], {})[element[1]] = v
        else:
            out[name] = v
    return out


def pin_assignments(tree: ast.Module, overrides: dict[str, int]) -> set[str]:
    """After each top-level assignment to an overridden name insert `NAME = value` (for a tuple's elements, the
    tuple with those elements replaced); the overrides placed."""
    placed: set[str] = set()
    targets = by_target(overrides)
    body = []
    for stmt in tree.body:
        body.append(stmt)
        names = assigned_names(stmt)
        for name in sorted(names & set(targets)):
            value = targets[name]
            if isinstance(value, dict):
                pin = pyparse.parse(f"{name} = _crucible_replaced({name}, {value!r})").body[0]
                placed |= {f"{name}[{i}]" for i in value}
            else:
                pin = ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=ast.Constant(value))
                placed.add(name)
            body.append(ast.copy_location(pin, stmt))
    tree.body = body
    ast.fix_missing_locations(tree)
    return placed


def assigned_names(stmt: ast.stmt) -> set[str]:
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = [stmt.target]
    names = set()
    for t in targets:
        names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def derived_names(tree: ast.Module) -> set[str]:
    """Top-level names the file computes from its own earlier names or assigns more than once: they follow their
    sources when those are rescaled and are never rescaled on their own (`int(1e6)` or `2**20` stays literal)."""
    assigned: set[str] = set()
    derived: set[str] = set()
    for stmt in tree.body:
        names = assigned_names(stmt)
        value = getattr(stmt, "value", None)
        reads = value is not None and any(isinstance(n, ast.Name) and n.id in assigned for n in ast.walk(value))
        if isinstance(stmt, ast.AugAssign) or reads or names & assigned:
            derived |= names
        assigned |= names
    return derived
