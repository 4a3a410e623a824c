"""The static stage (sandbox/static.py): default-deny rules refuse each known way around them, and accept every honest
candidate crucible ships (seeds, honest test candidates, benchmark candidates, the prompt's example, tuner variants)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from agent.search.tuner import Tuner
from sandbox import static
from sandbox.records import Reason
from sandbox.static import check_source

ROOT = Path(__file__).resolve().parents[1]
ATTACKS = ROOT / "tests" / "candidates" / "attacks"


def _candidates() -> list[Path]:
    files = (sorted((ROOT / "seeds").glob("*.py")) + sorted((ROOT / "tests" / "candidates").glob("*.py"))
             + sorted((ROOT / "benchmarks" / "candidates").glob("*.py"))
             + sorted((ROOT / "agent" / "llm" / "prompts" / "examples").glob("*.py")))
    return [p for p in files if "class ModelNew" in p.read_text(encoding="utf-8")]


HONEST = _candidates()


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


# ---- no false rejects -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", HONEST, ids=_rel)
def test_every_shipped_candidate_passes(path):
    finding = check_source(path.read_text(encoding="utf-8"), path.name)
    assert finding is None, f"{_rel(path)}: {finding.message}"


def test_the_honest_corpus_is_what_the_brief_names():
    names = {_rel(p) for p in HONEST}
    assert "seeds/rmsnorm.py" in names and "tests/candidates/rmsnorm_honest.py" in names
    assert "agent/llm/prompts/examples/rmsnorm_fwd.py" in names
    assert any(n.startswith("benchmarks/candidates/") for n in names)
    assert sum(n.startswith("seeds/") for n in names) >= 20


@pytest.mark.parametrize("seed", ["rmsnorm", "softmax", "cross_entropy", "adamw"])
def test_tuner_variants_of_a_seed_pass(seed):
    source = (ROOT / "seeds" / f"{seed}.py").read_text(encoding="utf-8")
    tuner, known, variants = Tuner(random.Random(seed).randrange(1000)), set(), 0
    for _ in range(3):
        prop = tuner.mutate(source, known)
        if prop is None:
            break
        known.add(prop.source)
        finding = check_source(prop.source, f"{seed}_variant.py")
        assert finding is None, f"{seed} variant: {finding.message}"
        variants += 1
    assert variants >= 1


def test_a_candidate_may_import_what_a_seed_file_defines():
    src = ("from seeds.rmsnorm import ModelNew as _Seed, _rmsnorm_fwd_kernel\nfrom seeds.attention_gluon import tma_load\n"
           "\n\nclass ModelNew(_Seed):\n    pass\n")
    assert check_source(src) is None


# ---- the attack candidates ---------------------------------------------------------------------------------------------
ATTACK_EXPECTED = {
    "static_attrgetter_sys.py": (Reason.FORBIDDEN_IMPORT, "`operator`"),
    "static_conditional_shadow.py": (Reason.FORBIDDEN_CALL, "binds `np`"),
    "static_format_attr.py": (Reason.FORBIDDEN_CALL, "`.format`"),
    "static_injected_numpy.py": (Reason.FORBIDDEN_CALL, "`np` is not defined"),
    "static_launch_hook.py": (Reason.FORBIDDEN_CALL, "add_pre_run_hook"),
    "static_numpy_escape.py": (Reason.FORBIDDEN_CALL, "`.tolist`"),
    "static_python_in_kernel.py": (Reason.FORBIDDEN_CALL, "`_helper`"),
    "static_seed_module_handle.py": (Reason.FORBIDDEN_IMPORT, "`functools` is not a function"),
    "static_type_hints.py": (Reason.FORBIDDEN_IMPORT, "`typing`"),
}


def test_every_static_attack_file_has_an_expectation():
    assert sorted(p.name for p in ATTACKS.glob("static_*.py")) == sorted(ATTACK_EXPECTED)


@pytest.mark.parametrize("name", sorted(ATTACK_EXPECTED))
def test_attack_file_is_refused(name):
    reason, words = ATTACK_EXPECTED[name]
    finding = check_source((ATTACKS / name).read_text(encoding="utf-8"), name)
    assert finding is not None, name
    assert finding.reason is reason and words in finding.message, finding.message
    assert finding.line > 0 and finding.message.startswith(f"line {finding.line}:"), finding.message


# ---- one construct at a time, in a small honest frame -----------------------------------------------------------------
FRAME = '''import torch
import torch.nn as nn
import triton
import triton.language as tl
{top}

@triton.jit
def _k(x_ptr, y_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
{kernel}
    tl.store(y_ptr + offs, tl.load(x_ptr + offs))


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
{forward}
        _k[(1,)](x, y, N=x.numel())
        return y
'''


def frame(top: str = "", kernel: str = "", forward: str = "") -> str:
    indent = lambda text, n: "\n".join(" " * n + line for line in text.splitlines())  # noqa: E731
    return FRAME.format(top=top, kernel=indent(kernel, 4), forward=indent(forward, 8))


def test_the_frame_itself_passes():
    assert check_source(frame()) is None


REFUSED = [
    # imports (rule 1)
    ("import functools", "", "", "`functools`"),
    ("import itertools", "", "", "`itertools`"),
    ("import dataclasses", "", "", "import names from it"),
    ("from dataclasses import fields", "", "", "only dataclass, field"),
    ("from __future__ import barry_as_FLUFL", "", "", "only annotations"),
    ("import seeds._common", "", "", "import names from it"),
    ("from seeds import registry", "", "", "not a module of crucible's seeds"),
    ("from seeds.registry import SEEDS_DIR", "", "", "defines no kernel"),
    ("from seeds._common import torch", "", "", "`torch` is not a function"),
    ("import triton.runtime", "", "", "`triton.runtime`"),
    ("import triton.knobs", "", "", "`triton.knobs`"),
    ("from triton import knobs", "", "", "`.knobs`"),
    ("from torch import _C", "", "", "`.\u005fC`"),
    ("import sandbox.trace", "", "", "`sandbox.trace`"),
    ("", "", "import struct", "`struct`"),
    # names (rule 2)
    ("", "", "y = np.ones(3)", "`np` is not defined"),
    ("", "", "y = inspect.currentframe()", "`inspect` is not defined"),
    ("", "", "exit()", "`exit` is not allowed"),
    ("", "", "eval('1')", "`eval` is not allowed"),
    ("", "", "m = memoryview(x)", "`memoryview` is not allowed"),
    ("", "", "b = bytes(x)", "`bytes` is not allowed"),
    ("", "", "n = id(x)", "`id` is not allowed"),
    ("", "", "v = vars(torch)", "`vars` is not allowed"),
    ("", "", "d = dir(torch)", "`dir` is not allowed"),
    ("", "", "g = getattr(torch, 'sy' + 's')", "literal attribute name"),
    ("", "", "g = getattr(torch, 'sys')", "`.sys`"),
    ("", "", "h = hasattr(x, '__array__')", "`.__array__`"),
    ("", "", "f = getattr", "not passed around"),
    ("", "", "C = type('C', (), {})", "one argument"),
    ("", "", "o = object()", "`object` is not allowed"),
    ("", "", "raise SystemExit(0)", "`SystemExit` is not allowed"),
    ("", "", "w = __builtins__", "`__builtins__`"),
    ("if False:\n    open = print", "", "", "binds the builtin name `open`"),
    ("inspect = 1", "", "", "binds `inspect`"),
    ("del nn", "", "", "`del nn`"),
    # attributes (rule 3)
    ("", "", "a = x.numpy()", "`.numpy`"),
    ("", "", "a = x.item()", "`.item`"),
    ("", "", "a = torch.from_numpy(x)", "`.from_numpy`"),
    ("", "", "a = torch.frombuffer(x, dtype=torch.uint8)", "`.frombuffer`"),
    ("", "", "a = torch.as_tensor(x)", "`.as_tensor`"),
    ("", "", "a = x.__array__()", "`.__array__`"),
    ("", "", "a = x.untyped_storage()", "untyped_storage().data_ptr()"),
    ("", "", "a = x.storage()", "`.storage`"),
    ("", "", "x.set_(y)", "`.set_`"),
    ("", "", "a = x._base", "`._base`"),
    ("", "", "a = x.grad_fn", "`.grad_fn`"),
    ("", "", "a = torch.sys.modules", "`.sys`"),
    ("", "", "a = torch._foo", "private name"),
    ("", "", "a = tl.core._aggregate", "private name"),
    ("", "", "torch.ops.aten.mm(x, x)", "`.ops`"),
    ("", "", "torch.library.Library('x', 'DEF')", "`.library`"),
    ("", "", "torch.jit.script(x)", "`torch.jit`"),
    ("", "", "torch.load('f')", "`torch.load`"),
    ("", "", "torch.utils.dlpack", "`.utils`"),
    ("", "", "x.register_hook(print)", "`.register_hook`"),
    ("", "", "_k.add_pre_run_hook(print)", "`.add_pre_run_hook`"),
    ("", "", "a = _k.fn", "`.fn`"),
    ("", "", "triton.knobs.runtime.launch_enter_hook = print", "`.knobs`"),
    ("", "", "c = triton.Config({}, pre_hook=print)", "`pre_hook=`"),
    ("", "", "a = x.apply_(abs)", "`.apply_`"),
    ("", "", "s = '{0.__class__}'.format(x)", "`.format`"),
    ("", "", "s = '{x}'.format_map({'x': x})", "`.format_map`"),
    # kernel bodies (rule 4)
    ("def _py(v):\n    return v", "_py(offs)", "", "plain Python function"),
    ("def _py(a, b):\n    return a + b", "s = tl.reduce(offs, 0, _py)", "", "plain Python function"),
    ("_f = lambda v: v", "s = tl.reduce(offs, 0, _f)", "", "plain Python function"),
    ("class _C:\n    pass", "c = _C()", "", "plain Python class"),
    ("W = torch.ones(4)", "s = W.sum()", "", "not a constant"),
    ("import math\nLOG2E = math.log2(math.e)\nBIG = tl.constexpr(2 * LOG2E)", "s = LOG2E * BIG + W", "", "`W`"),
    ("", "f = lambda v: v", "", "a lambda"),
    ("", "s = [i for i in range(3)]", "", "a comprehension"),
    ("", "def inner():\n    return 1", "", "a nested function"),
    ("", "with tl.static_range(2):\n    pass", "", "`with`"),
    ("", "s = offs.numpy_like()", "", "not a Triton tensor method"),
    ("", "s = sorted(offs)", "", "not available in a kernel body"),
    ("", "s = torch.ones(3)", "", "may call only Triton"),
    ("", "s = tl.sum(torch.ones(3))", "", "may call only Triton"),
    ("", "s = offs.to(torch.float32)", "", "imported from torch"),
    ("", "s = math.sqrt(2.0)", "", "`math`"),
    ("class Box:\n    def sum(self, d):\n        return d", "", "", "Triton tensor method"),
    ("", "", "self.to = print", "`.to`"),
    ("class M(nn.Module):\n    def load_state_dict(self, sd, strict=True):\n        return sd", "", "", "torch.nn.Module"),
    ("class M(nn.Module):\n    def state_dict(self):\n        return {}", "", "", "outside the launch trace"),
    ("", "", "f = torch.nn.functional.functools", "`.functools`"),
    ("", "", "f = torch.overrides.TorchFunctionMode", "`.overrides`"),
    # strings as code (rule 5)
    ("def _f(v: 'torch.Tensor'):\n    return v", "", "", "string annotations"),
    ("def _f(v: list['Foo']):\n    return v", "", "", "string annotations"),
    ("X: 'int' = 3", "", "", "string annotations"),
    ("import typing", "", "", "`typing`"),
    # statements and decorators (rule 6)
    ("import functools\n@functools.lru_cache\ndef f():\n    return 1", "", "", "`functools`"),
    ("@staticmethod\n@print\ndef f():\n    return 1", "", "", "decorator `@print`"),
    ("@triton.heuristics({'N': lambda a: 4})\n@triton.jit\ndef _h(x):\n    pass", "", "", "@triton.heuristics"),
    ("@triton.jit(launch_metadata=print)\ndef _h(x):\n    pass", "", "", "launch_metadata="),
    ("@triton.autotune(configs=[], key=[], prune_configs_by={'early_config_prune': print})\n@triton.jit\n"
     "def _h(x):\n    pass", "", "", "`prune_configs_by=`"),
    ("class Meta(nn.Module, metaclass=type):\n    pass", "", "", "takes keywords"),
    ("class S:\n    __slots__ = ()", "", "", "`__slots__`"),
    ("class S:\n    def __del__(self):\n        pass", "", "", "`__del__`"),
    ("class S:\n    def __repr__(self):\n        return ''", "", "", "`__repr__`"),
    ("", "", "global CACHE", "`global`"),
    ("", "", "match x:\n    case _:\n        pass", "`match`"),
    ("", "", "import math", "top level"),
    # a kernel made by a call, not a decorator, would escape the kernel-body rules
    ("def _plain(x_ptr):\n    pass\n_k2 = triton.jit(_plain)", "", "", "called as a function"),
    ("def _plain(x_ptr):\n    pass\n_k2 = triton.autotune(configs=[], key=[])(triton.jit(_plain))", "", "",
     "called as a function"),
    # the CPU interpreter compiles a kernel from the last line of its source that starts with `def `
    ("", '"""Notes.\ndef x():\n"""', "", "starts with `def `"),
    # ... and on the GPU from the first, decorators included
    ('@triton.jit(do_not_specialize=["""\ndef evil(x_ptr):\n"""])\ndef _h(x_ptr):\n    pass', "", "",
     "starts with `def `"),
    # inspect's tokenizer ends a kernel's block at a line that starts with a backslash
    ("", "\\\n    v = 1", "", "starts with a backslash"),
    # a kernel's private attributes decide what Triton compiles: private names only on a method's own `self`
    ("def _f(self):\n    self._src = 'x'", "", "", "private attribute"),
    ("class _E:\n    @staticmethod\n    def s(k):\n        k._src = 'x'", "", "", "private attribute"),
    ("", "", "k = _k\nk._unsafe_update_src('def _k(x_ptr, y_ptr, N):\\n    pass')", "private attribute"),
    ("", "", "s = getattr(_k, '_src')", "private attribute"),
    ("", "", "r = _k.rewriter", "`.rewriter`"),
    ("class _E:\n    def f(self):\n        self._src = 'x'\n_E.f(_k)", "", "", "taken from its class"),
    ("class _E(type(_k)):\n    pass", "", "", "base must be a class"),
    ("_KT = type(_k)\nclass _E(_KT):\n    pass", "", "", "may only be compared"),
    ("", "", "type(x).box = 1", "may only be compared"),
    ("", "", "t = type(x)\nt.box = 1", "may only be compared"),
    ("_lib = torch", "", "", "may be used only as `torch.name`"),
    ("", "", "for m in (torch,):\n    m.box = 1", "may be used only as `torch.name`"),
]


@pytest.mark.parametrize("top, kernel, forward, words", REFUSED, ids=[r[3] for r in REFUSED])
def test_construct_is_refused(top, kernel, forward, words):
    finding = check_source(frame(top, kernel, forward))
    assert finding is not None, words
    assert words in finding.message, finding.message
    assert finding.reason in (Reason.FORBIDDEN_CALL, Reason.FORBIDDEN_IMPORT), finding.reason
    assert finding.line > 0 and finding.message.startswith(f"line {finding.line}:"), finding.message


ALLOWED = [
    ("from __future__ import annotations", "", "a: torch.Tensor | None = None"),
    ("from dataclasses import dataclass\n@dataclass(frozen=True)\nclass Cfg:\n    block: int = 4", "", ""),
    ("import math\nSCALE = math.sqrt(2.0)", "", "s = math.log2(x.shape[0] + 1)"),
    ("", "v = tl.load(x_ptr + offs).to(tl.float32)\nfor i in tl.static_range(2):\n    v = v * 2", ""),
    ("", "", "p = x.data_ptr() % 16\nsame = x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()"),
    ("", "", "ok = 'async_load' in dir(tl)"),
    ("", "", "s = getattr(x, 'shape')"),
    ("", "", "name = type(x).__name__"),
    ("def helper(input):\n    return input", "", "y = helper(y)"),
    ("", "", "keep = [t for t in (x, y) if t.numel()]\nbig = max(keep, key=lambda t: t.numel())"),
    ("from triton.language.extra import libdevice", "e = libdevice.exp(offs.to(tl.float32))", ""),
    ("from seeds._common import row_block", "", "b = row_block(x.shape[-1])"),
    ("class _C(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self._n = 4\n"
     "    def n(self):\n        return self._n\n    @classmethod\n    def make(cls):\n        cls._made = True\n"
     "        return cls()\n    @staticmethod\n    def twice(a):\n        return 2 * a", "", "b = _C.twice(2)"),
]


@pytest.mark.parametrize("top, kernel, forward", ALLOWED)
def test_honest_construct_is_accepted(top, kernel, forward):
    finding = check_source(frame(top, kernel, forward))
    assert finding is None, finding.message


# ---- the rest of the contract ------------------------------------------------------------------------------------------
def test_contract_findings_keep_their_reasons():
    assert check_source("import torch\n").reason is Reason.NO_MODEL_NEW
    assert check_source("import torch\nclass ModelNew:\n    pass\n").reason is Reason.NO_TRITON_KERNEL
    assert check_source(frame(forward="try:\n    pass\nexcept Exception:\n    pass")).reason is Reason.TRY_EXCEPT
    assert check_source("def f(:\n").reason is Reason.SYNTAX_ERROR
    sub = frame().replace("class ModelNew(nn.Module)", "class ModelNew(Model)")
    assert check_source(sub).reason is Reason.SUBCLASSES_REFERENCE


def test_source_it_cannot_analyse_is_refused_not_raised():
    deep = frame(forward="a = " + "(" * 5000 + "1" + ")" * 5000)
    finding = check_source(deep)
    assert finding is not None and finding.reason in (Reason.SYNTAX_ERROR, Reason.FORBIDDEN_CALL)
    deep_attr = frame(forward="a = x" + ".shape" * 30000)
    finding = check_source(deep_attr)
    assert finding is not None


def test_a_parser_failure_of_any_kind_becomes_a_finding(monkeypatch):
    def boom(source, filename="<unknown>"):
        raise RuntimeError("source larger than the parser's bound")
    monkeypatch.setattr(static.pyparse, "parse", boom)
    finding = check_source(frame())
    assert finding.reason is Reason.SYNTAX_ERROR and "larger than the parser's bound" in finding.message
