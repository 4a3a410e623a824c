"""`crucible archive export ID -o FILE.py`: a verified kernel as one standalone module a user can drop into a project.

The file holds the candidate's kernels, launcher and ModelNew, plus a docstring with the measured result and the
environment it was measured on. Candidates may import helpers from crucible's own `seeds` package (the harness
allows it); those are vendored: for each name imported from `seeds.*`, the definitions it needs (transitively, and
across seed modules) are copied in source order, so the file runs with torch and triton alone.
"""
from __future__ import annotations

import ast
import logging
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from agent.archive.records import Candidate
from agent.archive.browse import env_text, result_text, task_name
from sandbox import pyparse

log = logging.getLogger(__name__)
SEEDS_DIR = Path(__file__).resolve().parents[2] / "seeds"
OWN_PACKAGES = ("seeds", "agent", "sandbox", "profiler")


class ExportError(ValueError):
    """The candidate cannot be made standalone; the message says why in one sentence."""


@dataclass
class _Module:
    """One parsed source: its top-level statements and which names each import or definition binds."""

    name: str
    lines: list[str]
    body: list[ast.stmt]
    future: bool = False
    defs: dict[str, list[int]] = field(default_factory=dict)         # name -> statements that bind it
    imports: dict[str, str] = field(default_factory=dict)            # name -> one import line (not seeds)
    seed_imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (seed module, its name)
    docstring: str | None = None

    def segment(self, i: int) -> str:
        node = self.body[i]
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        return "".join(self.lines[start - 1:node.end_lineno]).rstrip() + "\n"


def _parse(name: str, source: str) -> _Module:
    try:
        tree = pyparse.parse(source)
    except SyntaxError as exc:
        raise ExportError(f"{name} does not parse (line {exc.lineno}: {exc.msg})") from None
    mod = _Module(name, source.splitlines(keepends=True), list(tree.body), docstring=ast.get_docstring(tree, False))
    for i, node in enumerate(mod.body):
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            mod.future = True
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "seeds" and node.level == 0:
            if node.module == "seeds":
                raise ExportError(f"{name}: `from seeds import ...` imports whole modules; import the names from "
                                  "seeds.<module> instead")
            for a in node.names:
                mod.seed_imports[a.asname or a.name] = (node.module.split(".", 1)[1], a.name)
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                alias = f" as {a.asname}" if a.asname else ""
                mod.imports[a.asname or a.name] = f"from {'.' * node.level}{node.module or ''} import {a.name}{alias}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in OWN_PACKAGES:
                    raise ExportError(f"{name} imports {a.name}, which is part of crucible; import names from "
                                      "seeds.<module> instead so they can be vendored")
                mod.imports[a.asname or a.name.split(".")[0]] = f"import {a.name}" + (f" as {a.asname}" if a.asname
                                                                                        else "")
        else:
            for bound in _bound_names(node):
                mod.defs.setdefault(bound, []).append(i)
    for node in mod.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in OWN_PACKAGES[1:]:
            raise ExportError(f"{name} imports from {node.module}, which is part of crucible and is not vendored")
    return mod


def _bound_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


def _used_names(node: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


class _Vendor:
    """Collects, across seed modules, the statements and imports that the requested names need."""

    def __init__(self, seeds_dir: Path):
        self.seeds_dir = seeds_dir
        self.modules: dict[str, _Module] = {}
        self.wanted: dict[str, set[int]] = {}
        self.aliases: dict[str, list[str]] = {}
        self.after: dict[str, set[str]] = {}     # module -> seed modules whose code must come first
        self.imports: dict[str, None] = {}       # ordered set of import lines
        self.future = False
        self._seen: set[tuple[str, str]] = set()

    def module(self, name: str) -> _Module:
        if name not in self.modules:
            path = self.seeds_dir / (name.replace(".", "/") + ".py")
            if not path.is_file():
                raise ExportError(f"the candidate imports seeds.{name}, which is not in {self.seeds_dir}; export it "
                                  "from a crucible checkout that has that seed")
            self.modules[name] = mod = _parse(f"seeds.{name}", path.read_text(encoding="utf-8"))
            self.wanted[name], self.aliases[name], self.after[name] = set(), [], set()
            self.future |= mod.future
        return self.modules[name]

    def need(self, module: str, name: str) -> None:
        if (module, name) in self._seen:
            return
        self._seen.add((module, name))
        mod = self.module(module)
        if name in mod.seed_imports:
            other, original = mod.seed_imports[name]
            self.after[module].add(other)
            self.need(other, original)
            if original != name:
                self.aliases[module].append(f"{name} = {original}\n")
        elif name in mod.imports:
            self.imports[mod.imports[name]] = None
        elif name in mod.defs:
            for i in mod.defs[name]:
                if i in self.wanted[module]:
                    continue
                self.wanted[module].add(i)
                for used in sorted(_used_names(mod.body[i])):
                    if used in mod.defs or used in mod.imports or used in mod.seed_imports:
                        self.need(module, used)
        else:
            raise ExportError(f"seeds.{module} defines no {name!r}; the candidate was written against another "
                              "version of crucible's seeds")

    def order(self) -> list[str]:
        done: list[str] = []

        def visit(m: str, path: tuple[str, ...]) -> None:
            if m in done or m in path:
                return
            for dep in sorted(self.after.get(m, ())):
                visit(dep, path + (m,))
            done.append(m)

        for m in sorted(self.modules):
            visit(m, ())
        return [m for m in done if self.wanted[m] or self.aliases[m]]


@dataclass(frozen=True)
class Exported:
    text: str
    vendored: dict[str, tuple[str, ...]]  # seed module -> names the candidate asked of it


def standalone(cand: Candidate, *, seeds_dir: Path = SEEDS_DIR) -> Exported:
    """The candidate's source as one module that imports nothing from crucible."""
    if not cand.accepted:
        raise ExportError(f"candidate #{cand.id} was {cand.verdict} ({cand.reason}); only kernels the harness "
                          "verified are exported")
    if not cand.source:
        raise ExportError(f"candidate #{cand.id} has no source in the archive")
    own = _parse(f"candidate #{cand.id}", cand.source)
    vendor = _Vendor(seeds_dir)
    aliases, asked_of = [], {}
    for local, (module, original) in own.seed_imports.items():
        vendor.need(module, original)
        asked_of.setdefault(module, set()).add(original)
        if local != original:
            aliases.append(f"{local} = {original}\n")

    # The candidate's own imports go to the top with the vendored ones (the vendored code runs decorators that
    # need triton at import time); its docstring joins the new one.
    dropped: set[int] = set()
    for node in own.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            dropped.update(range(node.lineno, node.end_lineno + 1))
    if own.docstring is not None:
        first = own.body[0]
        dropped.update(range(first.lineno, first.end_lineno + 1))
    own_imports = [line for line in own.imports.values()]
    imports = list(dict.fromkeys(own_imports + list(vendor.imports)))
    body = "".join(line for n, line in enumerate(own.lines, start=1) if n not in dropped).strip("\n") + "\n"

    sections = []
    for module in vendor.order():
        mod = vendor.modules[module]
        clashes = sorted(n for i in vendor.wanted[module] for n in _bound_names(mod.body[i]) if n in own.defs)
        if clashes:
            raise ExportError(f"the candidate defines {', '.join(clashes)}, which seeds.{module} also defines for "
                              "the helpers it imports; rename the candidate's own definition to export it")
        code = "\n\n".join(mod.segment(i) for i in sorted(vendor.wanted[module]))
        sections.append(f"# ---- vendored from crucible's seeds/{module.replace('.', '/')}.py "
                        f"(what this kernel uses) ----\n" + "".join(vendor.aliases[module]) + code)
    asked = {m: tuple(sorted(names)) for m, names in sorted(asked_of.items())}
    head = _docstring(cand, own.docstring, asked)
    if own.future or vendor.future:
        head += "from __future__ import annotations\n"
    head += "\n" + "".join(line + "\n" for line in imports)
    if sections:
        body = "# ---- the candidate ----\n" + "".join(aliases) + body
    text = "\n\n".join(part.strip("\n") + "\n" for part in [head, *sections, body])
    _check_standalone(text, cand.id)
    return Exported(text, asked)


def _docstring(cand: Candidate, original: str | None, vendored: dict[str, tuple[str, ...]]) -> str:
    parents = ", ".join(f"#{p}" for p in (cand.parent_id, cand.parent2_id) if p) or "none"
    lines = [
        f"{task_name(cand)}: a Triton kernel exported from a crucible archive (candidate #{cand.id}, uid {cand.uid}).",
        "",
        f"Task file: {Path(cand.task_path).name}. `ModelNew(*get_init_inputs())` replaces the task's `Model`; load "
        "the reference's state_dict into it to share parameters.",
        f"Harness verdict: {cand.message or cand.verdict} (last stage: {cand.stage}).",
        f"Measured: {result_text(cand)}.",
        f"Environment: {env_text(cand.env)}.",
        f"Proposed by {cand.proposer} ({cand.origin}) on {cand.created}; parents: {parents}.",
    ]
    if vendored:
        lines.append("Vendored from crucible's seeds package: "
                     + "; ".join(f"seeds.{m} ({', '.join(names)})" for m, names in vendored.items()) + ".")
    lines = [wrapped for line in lines for wrapped in (textwrap.wrap(line, 116, break_on_hyphens=False) or [""])]
    if original:
        lines += ["", "The candidate's own notes:", "", original.strip()]
    text = "\n".join(lines).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return f'"""{text}\n"""\n'


def _check_standalone(text: str, cand_id: int) -> None:
    tree = pyparse.parse(text)  # our own output: a failure here is a bug, not user input
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if any(n.split(".")[0] in OWN_PACKAGES for n in names):
            raise ExportError(f"candidate #{cand_id} imports crucible's {names[0]} inside a function or block, "
                              "where it cannot be vendored")


def write(cand: Candidate, out: Path) -> Exported:
    exported = standalone(cand)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(exported.text, encoding="utf-8")
    log.info("wrote candidate #%d to %s (%d lines)", cand.id, out, exported.text.count("\n"))
    return exported
