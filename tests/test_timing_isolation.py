"""THREATS #5 in the timing stage: a baseline's results, freed into the caching allocator, must never be handed to
the candidate's allocations. Every function of a round sees the same input set, so a baseline that ran first has
just freed the very answer the candidate is asked for. GPU only (the caching allocator):
`CRUCIBLE_TEST_DEVICE=cuda python3 -m pytest -q tests/test_timing_isolation.py`."""
from __future__ import annotations

import pytest
import torch

from profiler import device_memory, timing
from tests.conftest import needs_gpu

pytestmark = needs_gpu
SHAPE = (2048, 4096)
GRABS = 48  # free blocks of the output's size the scavenger inspects per call


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.float(), -1).to(x.dtype)


def _softmax_grad(x: torch.Tensor) -> torch.Tensor:
    """d sum(softmax(x) * w) / dx through autograd, whose backward allocates on its own thread."""
    with torch.enable_grad():
        xx = x.detach().requires_grad_()
        y = torch.softmax(xx.float(), -1)
        (g,) = torch.autograd.grad((y * torch.linspace(0, 1, x.shape[-1], device=x.device)).sum(), xx)
    return g


def _scavenger(op, found: list[int]):
    """A cheat: computes one row honestly, then looks through freshly allocated blocks of the output's size for one
    whose first row is that answer (a freed result of somebody else's call) and returns it; else computes."""
    def call(args):
        (x,) = args
        want = op(x[:1])
        blocks = [torch.empty(SHAPE, dtype=want.dtype, device=x.device) for _ in range(GRABS)]
        for b in blocks:
            if torch.equal(b[:1], want):
                found.append(1)
                return b
        return op(x)
    return call


def _run(op, isolate: bool, reserve: bool) -> list[int]:
    found: list[int] = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = [[torch.randn(SHAPE, device="cuda", generator=gen, dtype=torch.bfloat16)] for _ in range(24)]
    fns = {"candidate": _scavenger(op, found), "eager": lambda args: op(args[0])}
    timing.measure(fns, sets, reps=16, warmup=4, watch="candidate", fresh_inputs=["eager"],
                   isolate=["eager"] if isolate else (), reserve=reserve)
    return found


@pytest.mark.parametrize("op", [_softmax, _softmax_grad], ids=["forward", "autograd"])
def test_the_scavenger_finds_a_baseline_result_without_isolation(op):
    """The threat is real on this allocator: the control for the test below."""
    assert _run(op, isolate=False, reserve=False), "no freed baseline result was found: the test below proves nothing"


@pytest.mark.parametrize("op", [_softmax, _softmax_grad], ids=["forward", "autograd"])
@pytest.mark.parametrize("reserve", [False, True])
def test_isolated_baselines_leave_nothing_to_find(op, reserve):
    assert not _run(op, isolate=True, reserve=reserve)


def test_isolate_must_not_name_the_watched_function():
    with pytest.raises(ValueError, match="isolate names"):
        timing.measure({"a": lambda args: None}, [[torch.zeros(1, device="cuda")]], watch="a", isolate=["a"])


@pytest.mark.parametrize("op", [_softmax, _softmax_grad], ids=["forward", "autograd"])
def test_a_baselines_first_call_made_apart_leaves_nothing_to_find(op):
    """The timing calls each baseline once before its measurement (device_memory.first_call): that call's results go
    back to the allocator as NaN bytes too. Control: the same call made plainly leaves its result to be found."""
    gen = torch.Generator("cuda").manual_seed(1)
    control, x = (torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    found: list[int] = []
    plain = op(control)  # on other values: its result, found and freed again, stays in the cache unscrubbed
    del plain
    _scavenger(op, found)([control])
    assert found, "the plain call's freed result was not found: the assertion below proves nothing"
    found.clear()
    assert device_memory.first_call(lambda args: op(args[0]), [x], torch.cuda.current_device()) is None
    _scavenger(op, found)([x])
    assert not found
