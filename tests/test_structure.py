"""The code base's seams: no import cycles, the profiler below the sandbox, modules and functions a reader can hold.

Everything here is read from the source with `ast`; nothing is imported. An import inside a function is an edge like
one at the top of a module (it still ties the two modules together); one under `if TYPE_CHECKING:` is not.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "sandbox", "profiler", "seeds", "patching", "models")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80

# Each remaining exception, with why it stands. The lists may only shrink: a module or function that grows past the
# limit fails the test, and so does an entry here that no longer needs to be.
LONG_MODULES: dict[str, str] = {
}
LONG_FUNCTIONS: dict[str, str] = {
    "sandbox/trace.py:install": "the launch hooks share one closure over the tracer's state, which the candidate cannot reach",
}


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(tree: ast.Module, module: str, is_package: bool) -> list[str]:
    """Every absolute module name the tree imports (with `from X import y`, both X and X.y), outside TYPE_CHECKING."""
    names: list[str] = []
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for imported in _imported_names(tree, name, path.name == "__init__.py"):
            if imported in modules and imported != name:
                graph[name].add(imported)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each knot of mutually importing modules (first module repeated last), shortest first."""
    cycles = []
    for knot in _knots(graph):
        start = min(knot)
        # Breadth-first from start back to itself, inside the knot: the shortest cycle through it.
        parents: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in parents:
            following = []
            for node in frontier:
                for nxt in sorted(graph[node] & knot):
                    if nxt not in parents:
                        parents[nxt] = node
                        following.append(nxt)
            frontier = following
        cycle = [start]
        while (node := parents[cycle[-1]]) != start:
            cycle.append(node)
        cycles.append([start, *reversed(cycle[1:]), start])
    return sorted(cycles, key=lambda cycle: (len(cycle), cycle))


def _knots(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    knots: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                knots.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return knots


def _is_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A Triton or Gluon kernel (`@triton.jit`, `@gluon.jit`, `@jit`, with or without arguments)."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "jit":
            return True
    return False


def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    """Long modules and long functions (`path:qualified.name`) outside seeds/, with their line counts."""
    modules: dict[str, int] = {}
    functions: dict[str, int] = {}
    for package in PACKAGES:
        if package == "seeds":
            continue
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            source = path.read_text()
            if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
                modules[rel] = lines

            def visit(node: ast.AST, prefix: str) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.ClassDef):
                        visit(child, f"{prefix}{child.name}.")
                    elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        length = child.end_lineno - child.lineno + 1
                        if length > MAX_FUNCTION_LINES and not _is_kernel(child):
                            functions[f"{rel}:{prefix}{child.name}"] = length
                        visit(child, f"{prefix}{child.name}.")

            visit(ast.parse(source, filename=rel), "")
    return modules, functions


def test_the_import_graph_finds_a_cycle_when_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"a"}}
    assert _cycles(graph) == [["d", "e", "d"], ["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_imports_under_type_checking_are_not_edges_but_imports_in_functions_are():
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x.a\ndef f():\n    from . import b\n"
    assert _imported_names(ast.parse(source), "x.c", is_package=False) == ["typing", "typing.TYPE_CHECKING", "x", "x.b"]


def test_no_module_imports_itself_through_others():
    cycles = _cycles(_import_graph())
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_the_profiler_needs_nothing_from_the_sandbox_or_the_agent():
    graph = _import_graph()
    upward = sorted(
        f"{module} -> {imported}"
        for module, imports in graph.items()
        if module.split(".")[0] == "profiler"
        for imported in imports
        if imported.split(".")[0] in ("sandbox", "agent")
    )
    assert upward == [], "the profiler imports from above it: " + ", ".join(upward)


def test_modules_and_functions_stay_a_size_a_reader_can_hold():
    modules, functions = _sizes()
    assert sorted(modules) == sorted(LONG_MODULES), (
        f"modules over {MAX_MODULE_LINES} lines: {modules}; allowed: {sorted(LONG_MODULES)}"
    )
    assert sorted(functions) == sorted(LONG_FUNCTIONS), (
        f"functions over {MAX_FUNCTION_LINES} lines: {functions}; allowed: {sorted(LONG_FUNCTIONS)}"
    )
