"""One standalone file from a kernel that imports seed code: the model must see, and may edit, every kernel that runs.

The seeds share code (`from seeds._common import sm_count`, `from seeds.swiglu import glu_fwd`). A prompt that showed
only the importing file would hide the kernels that actually run, and the model could not change them. `flatten`
replaces each `from seeds.X import a, b as c` at the top level by the definitions it needs from seeds/X.py: `a` and
`b`, and, transitively, every top-level definition, import and constant they use (imports from further seed modules
resolved the same way), in the modules' own order, dependencies first; `c = b` keeps an alias. A definition whose code
uses, itself, an import a candidate may not make (a host-side helper cached with functools, say) stays imported from
its seed module: the kernels are copied, such helpers are not.

The result runs the same code (the definitions are copied verbatim). Where it cannot be made safely — a name defined
differently by two of the modules or imported from two places (the later would shadow the earlier in one file), a
seed module that is not a file, an import of a whole seed module, copied code the harness's static checks refuse in
a candidate (e.g. an import only seed modules may make) — the file is returned unchanged with the reason, and the
run goes on with the file as it was.
"""
from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass
from pathlib import Path

from sandbox import pyparse

SEEDS_DIR = Path(__file__).resolve().parents[2] / "seeds"
_BUILTINS = set(dir(builtins)) | {"__name__", "__file__", "__doc__"}
MAX_KEPT = 12  # definitions the static checks may send back to their module before the file is left as it was


@dataclass(frozen=True)
class Flat:
    source: str
    modules: tuple[str, ...] = ()  # the seed modules code was taken from, e.g. ("seeds._common",)
    problem: str | None = None  # why the file was left as it was, when it imports seed code


class _Cant(Exception):
    pass


def flatten(source: str, seeds_dir: Path = SEEDS_DIR) -> Flat:
    """`source` with its top-level imports of seed code replaced by the code they import."""
    if "seeds" not in source:  # no import of seed code can be there (most replies): nothing to parse
        return Flat(source)
    try:
        tree = pyparse.parse(source)
    except SyntaxError:
        return Flat(source)
    imports = [n for n in tree.body if _seed_import(n)]
    if not imports and not any(isinstance(n, ast.Import) and any(a.name.startswith("seeds.") or a.name == "seeds"
                                                                  for a in n.names) for n in tree.body):
        return Flat(source)
    from sandbox.static import check_source

    if check_source(source, "original.py") is not None:
        keep_checking = False  # the file fails the checks as it is: flattening does not change that verdict
    else:
        keep_checking = True
    keep: set[tuple[str, str]] = set()
    for _ in range(MAX_KEPT):
        try:
            flat, placed = _flatten(source, tree, imports, seeds_dir, keep)
        except _Cant as exc:
            return Flat(source, problem=str(exc))
        # The copied code must pass the checks a candidate passes: a seed module may do what a candidate may not
        # (a dunder method, an import). The definition a finding points at stays imported from its module.
        finding = check_source(flat.source, "flattened.py") if keep_checking else None
        if finding is None:
            return flat
        m = re.match(r"line (\d+)\b", finding.message)
        culprit = next((key for key, lo, hi in placed if m and lo <= int(m.group(1)) <= hi), None)
        if culprit is None or culprit <= keep:
            break
        keep |= culprit
    return Flat(source, problem=f"the seed code it imports would not pass the static checks in the file "
                                f"({finding.message.split(';')[0]})")


def _seed_import(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("seeds.")


class _Module:
    def __init__(self, name: str, seeds_dir: Path):
        path = seeds_dir / f"{name.split('.', 1)[1].replace('.', '/')}.py"
        if not path.is_file():
            raise _Cant(f"{name} is not a file in {seeds_dir}")
        self.name, self.text = name, path.read_text(encoding="utf-8")
        self.lines = self.text.split("\n")
        self.body = pyparse.parse(self.text).body
        self.future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in self.body)
        self.defines: dict[str, list[int]] = {}
        for i, node in enumerate(self.body):
            for name_ in _defines(node):
                self.defines.setdefault(name_, []).append(i)

    def segment(self, i: int) -> str:
        node = self.body[i]
        first = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        return "\n".join(self.lines[first - 1:node.end_lineno])


def _flatten(source: str, tree: ast.Module, imports: list[ast.stmt], seeds_dir: Path,
             keep: set[tuple[str, str]]) -> tuple[Flat, list[tuple[frozenset, int, int]]]:
    """The flattened file, and where each copied definition landed: ((module, name) pairs, first line, last line).
    The names in `keep` stay imported."""
    if any(isinstance(n, ast.Import) and any(a.name.startswith("seeds") for a in n.names) for n in tree.body):
        raise _Cant("it imports a whole seed module (import seeds.X); only `from seeds.X import name` is inlined")
    work, aliases = _requested(imports)
    walk = _Walk(seeds_dir, keep)
    walk.take(work)
    order = _topological(walk.deps)
    future, head, sections = _copied(walk, order, tree)
    head += [f"from {mod} import {', '.join(sorted(names))}" for mod, names in sorted(walk.kept.items())]
    text = _spliced(source, imports, head, sections, aliases)
    if future and "from __future__ import annotations" not in source:
        text = _with_future(text)
    try:
        pyparse.parse(text)
    except SyntaxError as exc:  # pragma: no cover - the copied statements parsed where they came from
        raise _Cant(f"the flattened file does not parse ({exc.msg})") from None
    return Flat(text if text.endswith("\n") else text + "\n", tuple(order)), _placed(text, walk, order)


def _requested(imports: list[ast.stmt]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The (module, name) pairs the file's seed imports ask for, and the (alias, name) assignments they imply."""
    work: list[tuple[str, str]] = []
    aliases: list[tuple[str, str]] = []  # (alias, name) assignments after the copied code
    for node in imports:
        for a in node.names:
            if a.name == "*":
                raise _Cant(f"`from {node.module} import *` does not say which names it needs")
            work.append((node.module, a.name))
            if a.asname and a.asname != a.name:
                aliases.append((a.asname, a.name))
    return work, aliases


class _Walk:
    """The walk over the seed modules' definitions: which statements of each module to copy, which names stay
    imported, and which seed modules each takes names from."""

    def __init__(self, seeds_dir: Path, keep: set[tuple[str, str]]):
        self.seeds_dir, self.keep = seeds_dir, keep
        self.modules: dict[str, _Module] = {}
        self.taken: dict[str, set[int]] = {}  # module -> statement indexes to copy
        self.deps: dict[str, set[str]] = {}  # module -> seed modules it takes names from
        # module -> names still imported: their code needs what a candidate may not import
        self.kept: dict[str, set[str]] = {}

    def module(self, name: str) -> _Module:
        """The seed module `name`, read on first use."""
        if name not in self.modules:
            self.modules[name] = _Module(name, self.seeds_dir)
            self.taken[name], self.deps[name] = set(), set()
        return self.modules[name]

    def needs_forbidden(self, mod_name: str, name: str) -> bool:
        """The definition of `name` uses, itself, a name bound by an import a candidate may not make."""
        m = self.module(mod_name)
        forbidden = {n for node in m.body if isinstance(node, (ast.Import, ast.ImportFrom))
                     and not _seed_import(node) and not _allowed(node) for n in _defines(node)}
        return any(_free(m.body[i]) & forbidden for i in m.defines.get(name, [])
                   if not isinstance(m.body[i], (ast.Import, ast.ImportFrom)))

    def take(self, work: list[tuple[str, str]]) -> None:
        """Take each (module, name) in `work` and, transitively, every definition it uses."""
        done: set[tuple[str, str]] = set()
        while work:
            mod_name, name = work.pop()
            if (mod_name, name) in done:
                continue
            done.add((mod_name, name))
            m = self.module(mod_name)
            if name not in m.defines:
                raise _Cant(f"{mod_name} defines no top-level {name!r}")
            if (mod_name, name) in self.keep or self.needs_forbidden(mod_name, name):
                self.kept.setdefault(mod_name, set()).add(name)
                continue
            for i in m.defines[name]:
                if i in self.taken[mod_name]:
                    continue
                node = m.body[i]
                if _seed_import(node):
                    for a in node.names:
                        if (a.asname or a.name) == name:
                            work.append((node.module, a.name))
                            self.deps[mod_name].add(node.module)
                            if a.asname and a.asname != a.name:
                                raise _Cant(f"{mod_name} imports {a.name} as {a.asname}; aliases inside seed "
                                            "modules are not inlined")
                    continue
                self.taken[mod_name].add(i)
                for free in _free(node):
                    if free in m.defines:
                        work.append((mod_name, free))


def _copied(walk: _Walk, order: list[str], tree: ast.Module) -> tuple[bool, list[str], list[str]]:
    """The taken code in module order: whether any module uses `from __future__ import annotations`, the imports
    the file lacks, and one section of copied definitions per module. A name bound to two things is refused: defined
    by the file and a module, defined differently by two modules, or imported from two places (seeds/attention.py's
    TensorDescriptor is triton.tools', the Gluon modules' is Gluon's), one of them or defined by another."""
    own = {n for node in tree.body if not _seed_import(node) and not isinstance(node, (ast.Import, ast.ImportFrom))
           for n in _defines(node)}
    seen_imports = {ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    defined_by: dict[str, tuple[str, str]] = {}
    # name -> (where, what it is bound to) for every name an import binds: the file's own, then each copied one
    imported: dict[str, tuple[str, tuple]] = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not _seed_import(node):
            for name, what in _import_bindings(node):
                imported.setdefault(name, ("the file", what))
    future = False
    head: list[str] = []
    sections: list[str] = []
    for mod_name in order:
        m = walk.modules[mod_name]
        future |= m.future
        body: list[str] = []
        for i in sorted(walk.taken[mod_name]):
            node = m.body[i]
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                    continue
                for name, what in _import_bindings(node):
                    if name in own or name in defined_by:
                        raise _Cant(f"{'the file' if name in own else defined_by[name][0]} defines {name!r} and "
                                    f"{mod_name} imports it")
                    if name in imported and imported[name][1] != what:
                        raise _Cant(f"{imported[name][0]} and {mod_name} import different things as {name!r} "
                                    f"({_what(imported[name][1])}; {_what(what)})")
                    imported.setdefault(name, (mod_name, what))
                text = ast.unparse(node)
                if text not in seen_imports:
                    seen_imports.add(text)
                    head.append(text)
                continue
            segment = m.segment(i)
            for name in _defines(node):
                if name in own:
                    raise _Cant(f"the file and {mod_name} both define {name!r}")
                if name in imported:
                    raise _Cant(f"{imported[name][0]} imports {name!r} and {mod_name} defines it")
                if name in defined_by and defined_by[name][1] != segment:
                    raise _Cant(f"{defined_by[name][0]} and {mod_name} define {name!r} differently")
                defined_by[name] = (mod_name, segment)
            body.append(segment)
        if body:
            origin = mod_name.replace(".", "/")
            sections.append(f"# ---- copied from the seed module {origin}.py ----\n" + "\n\n\n".join(body))
    for mod_name, names in walk.kept.items():  # stays `from seeds.X import name`: one meaning for its name too
        for name in names:
            binding = ("from", mod_name, name)
            if name in own or name in defined_by or imported.get(name, ("", binding))[1] != binding:
                raise _Cant(f"{name!r} stays imported from {mod_name}, and the file or another module binds it too")
    return future, head, sections


def _spliced(source: str, imports: list[ast.stmt], head: list[str], sections: list[str],
             aliases: list[tuple[str, str]]) -> str:
    """`source` with its seed imports replaced, where the first of them stood, by the imports, the copied sections
    and the alias assignments."""
    lines = source.split("\n")
    first = imports[0]
    before = lines[:first.lineno - 1]
    skip = {ln for node in imports for ln in range(node.lineno, node.end_lineno + 1)}
    after = [line for ln, line in enumerate(lines[first.lineno - 1:], first.lineno) if ln not in skip]
    inlined = (["\n".join(head)] if head else []) + sections + (
        ["\n".join(f"{alias} = {name}" for alias, name in aliases)] if aliases else [])
    return "\n".join(before).rstrip("\n") + "\n" + ("\n\n\n".join(inlined)) + "\n\n\n" + "\n".join(after).lstrip("\n")


def _placed(text: str, walk: _Walk, order: list[str]) -> list[tuple[frozenset, int, int]]:
    """Where each copied definition landed in `text`: ((module, name) pairs, first line, last line)."""
    placed = []
    for mod_name in order:
        m = walk.modules[mod_name]
        for i in sorted(walk.taken[mod_name]):
            if isinstance(m.body[i], (ast.Import, ast.ImportFrom)):
                continue
            at = text.find(m.segment(i))
            if at >= 0:
                lo = text[:at].count("\n") + 1
                placed.append((frozenset((mod_name, n) for n in _defines(m.body[i])), lo,
                               lo + m.segment(i).count("\n")))
    return placed


def _allowed(node: ast.Import | ast.ImportFrom) -> bool:
    """A candidate may make this import (the harness's static allow-list)."""
    from sandbox.allowlist import ALLOWED_IMPORTS

    roots = [a.name.split(".")[0] for a in node.names] if isinstance(node, ast.Import) else \
        [(node.module or "").split(".")[0]]
    return all(r in ALLOWED_IMPORTS for r in roots)


def _with_future(text: str) -> str:
    """`from __future__ import annotations` after the module docstring, where Python requires it."""
    tree = pyparse.parse(text)
    at = 0
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant):
        at = tree.body[0].end_lineno
    lines = text.split("\n")
    return "\n".join(lines[:at] + ["from __future__ import annotations"] + lines[at:])


def _topological(deps: dict[str, set[str]]) -> list[str]:
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in path:
            raise _Cant(f"seed modules import each other in a cycle ({' -> '.join(path + (name,))})")
        for dep in sorted(deps.get(name, ())):
            visit(dep, path + (name,))
        order.append(name)

    for name in sorted(deps):
        visit(name, ())
    return order


def _defines(node: ast.stmt) -> set[str]:
    """Names a top-level statement binds in the module's namespace."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
        names: set[str] = set()
        for field in ("body", "orelse", "finalbody", "handlers"):
            for child in getattr(node, field, []) or []:
                if isinstance(child, ast.ExceptHandler):
                    for c in child.body:
                        names |= _defines(c)
                else:
                    names |= _defines(child)
        return names
    return set()


def _free(node: ast.stmt) -> set[str]:
    """Names a statement reads that it does not bind itself (over-approximated: never misses one)."""
    loaded = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loaded - _BUILTINS


def _import_bindings(node: ast.Import | ast.ImportFrom) -> list[tuple[str, tuple]]:
    """(name, what it is bound to) for each name a top-level import binds: `import a.b` binds a to module a,
    `import a.b as c` c to module a.b, `from m import x as y` y to m's attribute x."""
    if isinstance(node, ast.Import):
        return [(a.asname, ("module", a.name)) if a.asname else (a.name.split(".")[0], ("module", a.name.split(".")[0]))
                for a in node.names]
    return [(a.asname or a.name, ("from", "." * node.level + (node.module or ""), a.name))
            for a in node.names if a.name != "*"]


def _what(what: tuple) -> str:
    return f"module {what[1]}" if what[0] == "module" else f"{what[1]}.{what[2]}"
