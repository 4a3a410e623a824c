"""sandbox/pyparse.py: crucible's one way to parse Python. CPython 3.11's AST constructor keeps its recursion depth in
interpreter-wide state, so parses on several threads at once (the lanes of `crucible batch --gpus N`) failed here
with "SystemError: AST constructor recursion depth mismatch" (tests/test_batch_lanes.py, 2 of 2 runs before the
lock, 3 of 3 clean after)."""
import ast
import threading
from pathlib import Path

import pytest

from sandbox import pyparse

ROOT = Path(__file__).resolve().parent.parent
SOURCE = (ROOT / "agent" / "search" / "tuner.py").read_text(encoding="utf-8")  # a large module with deep expressions


def test_parses_on_many_threads_at_once():
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def work() -> None:
        start.wait()
        for _ in range(15):
            try:
                tree = pyparse.parse(SOURCE)
                assert isinstance(tree, ast.Module) and tree.body
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
                errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"{len(errors)} parses failed; first: {type(errors[0]).__name__}: {errors[0]}"


def test_syntax_errors_are_ast_parses():
    try:
        pyparse.parse("def f(:\n", filename="bad.py")
    except SyntaxError as exc:
        assert exc.filename == "bad.py"
    else:
        raise AssertionError("a syntax error must raise SyntaxError")


def test_no_module_parses_around_the_lock():
    """Every parse in agent/ and sandbox/ goes through pyparse (a bare ast.parse on a lane's thread races)."""
    bare = [f"{p.relative_to(ROOT)}:{i}" for d in ("agent", "sandbox", "profiler") for p in (ROOT / d).rglob("*.py")
            if p.name != "pyparse.py"
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "ast.parse(" in line]
    assert not bare, f"ast.parse outside sandbox/pyparse.py: {bare}"


BOMBS = {
    "a long sum": "x = " + "1+" * 100_000 + "1\n",
    "unary operators": "x = " + "-" * 100_000 + "1\n",
    "nested lists": "x = " + "[" * 100_000 + "]" * 100_000 + "\n",
    "nested parentheses": "x = " + "(" * 100_000 + "1" + ")" * 100_000 + "\n",
    "a chain of calls": "x = f" + "()" * 100_000 + "\n",
    "a sum that parses but nests past the bound": "x = " + "1+" * 300 + "1\n",
    "a null byte": "x = 1\0\n",
    "over a megabyte": "x = 1\n" * 200_000,
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_sources_past_the_bounds_raise_a_syntax_error(name):
    """Whatever the source, the parse ends in a tree or a SyntaxError: never RecursionError or MemoryError."""
    with pytest.raises(SyntaxError):
        pyparse.parse(BOMBS[name], filename="bomb.py")
    assert pyparse.parse("x = 1 + 2\n").body  # the parser's state is intact afterwards


def test_deep_but_real_code_parses():
    src = "x = " + "1+" * (pyparse.MAX_AST_DEPTH - 10) + "1\n"
    assert pyparse.parse(src).body


def test_a_source_parsed_again_is_still_bounded_and_gets_a_tree_of_its_own():
    """The depth of a source parsed lately is remembered (a search parses each candidate several times): a source
    past the bound is refused every time, and each parse returns a fresh tree a caller may change (normal forms
    drop docstrings from theirs)."""
    deep = "x = " + "1+" * 300 + "1\n"  # parses, and nests past the bound
    for _ in range(2):
        with pytest.raises(pyparse.Unanalysable, match="levels deep"):
            pyparse.parse(deep)
    source = 'def f():\n    "doc"\n    return 1\n'
    first = pyparse.parse(source)
    first.body[0].body = first.body[0].body[1:]
    again = pyparse.parse(source)
    assert again is not first and len(again.body[0].body) == 2
