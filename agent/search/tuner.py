"""The offline tuner: an LLM-free proposer that edits a kernel's tunable constants, and crosses over two elites.

It reads the kernel's source with `ast` and finds the knobs a person would turn, in any kernel, LLM-written ones too:

- module-level UPPER_CASE ints with a tuning name (BLOCK_SIZE = 1024, NUM_WARPS = 4, ROWS_PER_PROGRAM = 2);
- int literals passed by keyword under a tuning name (num_warps=4, num_stages=3, BLOCK_M=128), in launches and in
  `triton.Config(...)`, and int values of tuning-named keys in dict literals ({"BLOCK_M": 128});
- literals in heuristics: int literals on the right of an assignment to a tuning name
  (`num_warps = 8 if n > 4096 else 4`, `block = min(4096, next_power_of_2(n))`) and in the returned tuple of a
  function named like a config/heuristic (`def fwd_config(...): return 1, row_warps(...)`);
- launch options: at `kernel[grid](...)` launches of non-autotuned kernels, `num_warps=` / `num_stages=` with a
  non-literal value or absent are set to a literal;
- helper options: a call to a function imported from this repository (`from seeds.rmsnorm import rmsnorm_bwd`) whose
  definition takes tuning keywords (`rows=None, num_warps=None`) gets them pinned. The helper's file is read with
  `ast`, never imported.

A proposal is returned as a `Reply` whose text carries the new source in a ```python block, exactly as a provider's
reply would, so the loop extracts and evaluates both alike. Proposals are deterministic under the tuner's seed and
never repeat a source whose sha256 the caller says is known. The loop tells the tuner of its variants rejected before
their timing (`learn`): a value whose one-knob change failed is not proposed again in the run; and of its verified
variants that compiled to the very kernels their parent ran (`learn_unchanged`): that knob lies in a branch the
task's shape never takes, and no value of it is proposed again (on the H200, 30 of 32 verified RMSNorm variants of a
search were such edits).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

from agent.archive.records import sha256
from agent.llm.chat import Reply, Usage
from sandbox import pyparse

TUNING_NAME = re.compile(r"block|warps|stages|rows|group|split|tile|chunk|persist|programs|per_sm|unroll|vec|ctas",
                         re.IGNORECASE)
CONFIG_FUNCTION = re.compile(r"config|heuristic|setting|tune", re.IGNORECASE)
WARPS = (1, 2, 4, 8, 16, 32)
STAGES = (1, 2, 3, 4, 5, 6)
LAUNCH_OPTIONS = {"num_warps": (2, 4, 8, 16, 32), "num_stages": (1, 2, 3, 4)}
# Values for a tuning keyword of a helper imported from the repository (seeds.rmsnorm.rmsnorm_bwd(..., rows=None)),
# by the kind its name implies; its default is decided inside the helper, so the tuner pins one of these.
OPTION_SCALES = {"warps": (2, 4, 8, 16, 32), "stages": (1, 2, 3, 4), "block": (1024, 2048, 4096, 8192, 16384),
                 "count": (1, 2, 4, 8)}
REPO_ROOT = Path(__file__).resolve().parents[2]
NAME = "tuner"


@dataclass(frozen=True)
class Knob:
    """One editable spot: source text [start, end) (absolute character offsets) holding `value`.

    `value` is None for a launch option that is absent (start == end: the edit inserts `, name=value`) or set from
    an expression (the edit replaces the expression).
    """

    name: str
    kind: str  # warps | stages | block | count | option
    value: int | None
    start: int
    end: int
    line: int
    insert: bool = False
    key: str = ""  # the same knob in another kernel of the lineage has the same key
    text: str = ""  # the source text at [start, end)
    scale: tuple[int, ...] = ()  # the values an option may take (its current value is not a literal)

    def choices(self) -> list[int]:
        """Values to try in place of the current one, nearest first."""
        if self.kind == "option":
            return [v for v in self.scale if v != self.value]
        v = self.value
        assert v is not None
        if self.kind in ("warps", "stages"):
            scale = WARPS if self.kind == "warps" else STAGES
            if v in scale:
                i = scale.index(v)
                near = [scale[j] for j in (i - 1, i + 1, i - 2, i + 2) if 0 <= j < len(scale)]
                return near
            return [x for x in scale if x != v][:3]
        low = 16 if self.kind == "block" and v >= 16 else 1
        return [x for x in (v * 2, v // 2, v * 4, v // 4) if low <= x <= 131072 and x != v]


@dataclass(frozen=True)
class Proposal:
    source: str
    reply: Reply
    description: str  # what was changed, e.g. "num_warps 4 -> 8 (line 57)"


def find_knobs(source: str) -> list[Knob]:
    """Every knob in the source, in source order; [] when it does not parse or has none."""
    return list(_knobs(source))


@functools.lru_cache(maxsize=64)  # a search asks again of the same sources (each proposal's parent, its niche)
def _knobs(source: str) -> tuple[Knob, ...]:
    try:
        tree = pyparse.parse(source)
    except SyntaxError:
        return ()
    offsets = _line_offsets(source)
    knobs: dict[tuple, Knob] = {}

    def literal(node: ast.AST, name: str, kind: str | None = None) -> None:
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 1:
            start, end = _span(node, offsets, source)
            knobs.setdefault((start, end), Knob(name, kind or _kind(name, node.value), node.value, start, end,
                                                node.lineno, text=source[start:end]))

    def literals_in(expr: ast.AST, name: str) -> None:
        # Thresholds (operands of a comparison) and factors scale as counts; warps/stages only where they fit.
        compared = {id(op) for sub in ast.walk(expr) if isinstance(sub, ast.Compare)
                    for op in [sub.left, *sub.comparators]}
        for sub in ast.walk(expr):
            if isinstance(sub, ast.Constant) and type(sub.value) is int and sub.value >= 2:
                v = sub.value
                kind = _kind(name, v)
                if id(sub) in compared or (kind == "warps" and v not in WARPS) or (kind == "stages" and v not in STAGES):
                    kind = "count"
                if v & (v - 1) == 0 or kind in ("warps", "stages"):
                    literal(sub, name, kind)

    jit_names, autotuned = _kernels(tree)
    helpers = _helpers(tree)
    # Inside a kernel body literals are semantics (x * 2, arange(0, 16)), except keyword knobs like tl.range(num_stages=).
    in_kernel = {id(sub) for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in jit_names
                 for sub in ast.walk(node)}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.isupper() and TUNING_NAME.search(name) and not name.startswith("CRUCIBLE_"):
                literal(node.value, name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            options = _call_options(node, jit_names, autotuned, helpers)
            _option_knobs(node, options, offsets, source, knobs)
            for kw in node.keywords:
                if kw.arg and TUNING_NAME.search(kw.arg) and kw.arg not in options:
                    literal(kw.value, kw.arg)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and TUNING_NAME.search(key.value):
                    literal(value, key.value)
        elif isinstance(node, ast.Assign) and id(node) not in in_kernel and not _is_module_level(node, tree):
            for target in node.targets:
                if isinstance(target, ast.Name) and TUNING_NAME.search(target.id):
                    literals_in(node.value, target.id)
        elif isinstance(node, ast.FunctionDef) and CONFIG_FUNCTION.search(node.name) and node.name not in jit_names:
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and ret.value is not None:
                    elts = ret.value.elts if isinstance(ret.value, ast.Tuple) else [ret.value]
                    for elt in elts:
                        literal(elt, f"{node.name}()", "count")
    ordered, seen = [], {}
    for k in sorted(knobs.values(), key=lambda k: k.start):
        base = k.key or k.name
        seen[base] = seen.get(base, 0) + 1
        ordered.append(dataclasses.replace(k, key=f"{base}#{seen[base]}"))
    return tuple(ordered)


def skeleton(source: str) -> str | None:
    """The source with knob values masked, launch options dropped and formatting normalised: two kernels of one
    lineage share it. None when the source has no knobs."""
    knobs = find_knobs(source)
    if not knobs:
        return None
    tree = pyparse.parse(_apply(source, [(k, 0) for k in knobs if not k.insert and k.kind != "option"]))
    jit, autotuned = _kernels(tree)
    helpers = _helpers(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            options = _call_options(node, jit, autotuned, helpers)
            node.keywords = [kw for kw in node.keywords if kw.arg not in options]
    return ast.unparse(tree)


class Tuner:
    """Proposes variants of a parent (mutation) or of two parents of one lineage (crossover)."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        # (knob key, value text) of single-knob variants rejected before their timing: not proposed again this run
        self.failed: set[tuple[str, str]] = set()
        # knob keys whose single change compiled to the parent's very kernels: no value of them is proposed again
        self.inert: set[str] = set()

    def learn(self, parent_source: str, source: str) -> None:
        """A variant of `parent_source` was rejected before its timing (it failed to compile, refused its
        arguments, or computed a wrong result): where it changed one knob, that knob's new value is not proposed
        again in this run (`subtiles=16384`, a block size the kernel breaks at). A variant of two changes blames
        neither."""
        changed = _changed(parent_source, source)
        if len(changed) == 1:
            self.failed.add((changed[0].key, changed[0].text))

    def learn_unchanged(self, parent_source: str, source: str) -> None:
        """A verified variant of `parent_source` ran the very kernels its parent did (`compiled_signature`): where it
        changed one knob, that knob sits in code the task's shape never runs, and no value of it is proposed again
        in this run. A variant of two changes says nothing of either alone."""
        changed = _changed(parent_source, source)
        if len(changed) == 1:
            self.inert.add(changed[0].key)

    def _choices(self, knob: Knob) -> list[int]:
        if knob.key in self.inert:
            return []
        return [v for v in knob.choices() if (knob.key, str(v)) not in self.failed]

    def mutate(self, parent_source: str, known: set[str]) -> Proposal | None:
        """A variant with one or two knobs changed whose sha256 is not in `known`; None when none is left."""
        started = time.monotonic()
        knobs = find_knobs(parent_source)
        if not knobs:
            return None
        for _ in range(48):
            count = 1 if len(knobs) == 1 or self.rng.random() < 0.7 else 2
            picked = self.rng.sample(knobs, count)
            options = [(k, self._choices(k)) for k in picked]
            edits = [(k, self.rng.choice(values)) for k, values in options if values]
            if not edits:
                continue
            source = _apply(parent_source, edits)
            if sha256(source) not in known and source != parent_source:
                return _proposal(source, edits, "mutation", started)
        for k in knobs:  # the random draws all hit known sources: walk every single change in order
            for v in self._choices(k):
                source = _apply(parent_source, [(k, v)])
                if sha256(source) not in known:
                    return _proposal(source, [(k, v)], "mutation", started)
        return None

    def crossover(self, a: str, b: str, known: set[str]) -> Proposal | None:
        """A configuration taking each knob from `a` or `b` (same lineage: equal skeletons), new to `known`."""
        started = time.monotonic()
        if skeleton(a) is None or skeleton(a) != skeleton(b):
            return None
        kb = {k.key: k for k in find_knobs(b)}
        # A knob absent in b (an unset launch option) has nothing to give; everything else can be taken from b.
        differing = [(x, kb[x.key]) for x in find_knobs(a)
                     if x.key in kb and not kb[x.key].insert and x.text != kb[x.key].text]
        if len(differing) < 2:
            return None  # a child would equal one of its parents
        for _ in range(32):
            take_b = [self.rng.random() < 0.5 for _ in differing]
            if all(take_b) or not any(take_b):
                continue
            edits = [(x, y.text) for (x, y), tb in zip(differing, take_b) if tb]
            source = _apply(a, edits)
            if sha256(source) not in known:
                return _proposal(source, edits, "crossover", started)
        return None


def compiled_signature(diagnostics: dict) -> str | None:
    """The compiled kernels a verified candidate ran (names, warps, stages, constexprs; from its timing report), as
    one string: two sources that compile to the same kernels (a tuner edit in a branch this shape never takes)
    share it. None where the report lists no kernels (a check without timing)."""
    kernels = (diagnostics.get("timing") or {}).get("kernels") or []
    if not kernels:
        return None
    return json.dumps(sorted([k.get("name"), k.get("num_warps"), k.get("num_stages"),
                              sorted((str(a), str(b)) for a, b in (k.get("constants") or {}).items())]
                             for k in kernels if isinstance(k, dict)), default=str)


# ---- internals -----------------------------------------------------------------------------------------------------

def _changed(parent_source: str, source: str) -> list[Knob]:
    """The knobs of `source` whose text differs from the same knob's in `parent_source`."""
    before = {k.key: k.text for k in find_knobs(parent_source)}
    return [k for k in find_knobs(source) if k.key in before and k.text != before[k.key]]


def _kind(name: str, value: int) -> str:
    low = name.lower()
    if low.startswith("num_") and not low.endswith(("warps", "stages")) or \
            low.rstrip("_").endswith(("tiles", "blocks", "chunks")):
        return "count"  # how many (subtiles, num_blocks), not how big
    if "warps" in low:
        return "warps"
    if "stages" in low:
        return "stages"
    if any(s in low for s in ("block", "tile", "chunk")):
        return "block"
    return "count"


def _kernels(tree: ast.Module) -> tuple[set[str], set[str]]:
    jit, autotuned = set(), set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            decos = [ast.unparse(d) for d in node.decorator_list]
            if any("jit" in d for d in decos):
                jit.add(node.name)
            if any("autotune" in d or "heuristics" in d for d in decos):
                autotuned.add(node.name)
    return jit, autotuned


def _is_launch(call: ast.Call, jit: set[str], autotuned: set[str]) -> bool:
    func = call.func
    return (isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and func.value.id in jit
            and func.value.id not in autotuned)


def _helpers(tree: ast.Module) -> dict[str, tuple[Path, str]]:
    """Names imported with `from package.module import name` where the module is a file of this repository."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            path = REPO_ROOT.joinpath(*node.module.split(".")).with_suffix(".py")
            if path.is_file():
                for alias in node.names:
                    found[alias.asname or alias.name] = (path, alias.name)
    return found


@functools.lru_cache(maxsize=256)
def _tuning_parameters(path: Path, mtime: float, name: str) -> tuple[str, ...]:
    """Keyword parameters with a tuning name and a default, of function `name` defined in `path`."""
    try:
        tree = pyparse.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return ()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            a = node.args
            positional = a.posonlyargs + a.args
            with_default = positional[len(positional) - len(a.defaults):] + [
                arg for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            return tuple(arg.arg for arg in with_default if TUNING_NAME.search(arg.arg))
    return ()


def _call_options(call: ast.Call, jit: set[str], autotuned: set[str],
                  helpers: dict[str, tuple[Path, str]]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The options a call can be given: {keyword: (knob key prefix, values)}; {} for any other call."""
    if _is_launch(call, jit, autotuned):
        kernel = call.func.value.id  # type: ignore[attr-defined]
        return {name: (f"{kernel}[]", scale) for name, scale in LAUNCH_OPTIONS.items()}
    if isinstance(call.func, ast.Name) and call.func.id in helpers:
        path, name = helpers[call.func.id]
        params = _tuning_parameters(path, path.stat().st_mtime, name)
        return {p: (f"{call.func.id}()", OPTION_SCALES[_kind(p, 0)]) for p in params}
    return {}


def _option_knobs(call: ast.Call, options: dict[str, tuple[str, tuple[int, ...]]], offsets: list[int], source: str,
                  knobs: dict[tuple, Knob]) -> None:
    """Each option of a call: a literal (tuned around its value), an expression or absent (pinned to a value)."""
    given = {kw.arg: kw for kw in call.keywords if kw.arg}
    for option, (prefix, scale) in options.items():
        kw = given.get(option)
        key = f"{prefix}.{option}"
        if kw is not None:
            value = kw.value.value if isinstance(kw.value, ast.Constant) and type(kw.value.value) is int else None
            start, end = _span(kw.value, offsets, source)
            kind = _kind(option, value or 0) if value in scale and _kind(option, 0) != "count" else "option"
            knobs.setdefault((start, end), Knob(option, kind, value, start, end, kw.value.lineno, key=key,
                                                text=source[start:end], scale=scale))
        elif (call.args or call.keywords) and all(k.arg for k in call.keywords):  # a `**cfg` may carry it already
            last = call.args[-1] if not call.keywords else call.keywords[-1]
            _, end = _span(last, offsets, source)
            # several absent options insert at the same spot: keyed by name too
            knobs.setdefault((end, end, option), Knob(option, "option", None, end, end, call.lineno, insert=True,
                                                      key=key, scale=scale))


def _is_module_level(node: ast.AST, tree: ast.Module) -> bool:
    return node in tree.body


def _line_offsets(source: str) -> list[int]:
    offsets, total = [0], 0
    for line in source.splitlines(keepends=True):
        total += len(line)
        offsets.append(total)
    return offsets


def _span(node: ast.AST, offsets: list[int], source: str) -> tuple[int, int]:
    # ast columns are UTF-8 byte offsets; convert through the line's bytes so non-ASCII comments cannot shift edits.
    def at(line: int, col: int) -> int:
        text = source[offsets[line - 1]:offsets[line]]
        return offsets[line - 1] + len(text.encode("utf-8")[:col].decode("utf-8", errors="ignore"))
    return at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)


def _apply(source: str, edits: list[tuple[Knob, int | str]]) -> str:
    out, pos = [], 0
    for knob, value in sorted(edits, key=lambda e: e[0].start):
        out.append(source[pos:knob.start])
        out.append(f", {knob.name}={value}" if knob.insert else str(value))
        pos = knob.end
    out.append(source[pos:])
    return "".join(out)


def _proposal(source: str, edits: list[tuple[Knob, int]], how: str, started: float) -> Proposal:
    changes = "; ".join(
        f"{k.name} {k.text or '(unset)'} -> {v} (line {k.line})" for k, v in edits)
    description = f"tuner {how}: {changes}"
    source = source.rstrip() + "\n"  # the file as the reply shows it, and as the loop admits it
    text = f"{description}\n\n```python\n{source}```\n"
    reply = Reply(text=text, model=NAME, provider=NAME, usage=Usage(), cost_usd=0.0,
                  latency_s=max(0.0, time.monotonic() - started), attempts=1)
    return Proposal(source=source, reply=reply, description=description)
