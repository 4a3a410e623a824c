"""profiler.timing's allocator reserve: the watched function's outputs are held for the later fingerprint re-check,
so without a reserve every timed call allocated its outputs with a cudaMalloc inside its host time (the
AdamW seed host-bound in `crucible bench`). The sizing is arithmetic (CPU); the effect needs a GPU:
    CRUCIBLE_TEST_DEVICE=cuda python3 -m pytest -q tests/test_timing_reserve.py
"""
import pytest
import torch

from profiler import device_memory, timing

MB = 1 << 20


def test_held_at_once_counts_the_recheck_budget_and_the_burst():
    assert device_memory.held_at_once(315 * MB, 8 << 30, 30, 1) == 27      # the AdamW task: 26 held + the call's own
    assert device_memory.held_at_once(315 * MB, 8 << 30, 3, 10) == 30      # never more than the timed calls
    assert device_memory.held_at_once(16 << 30, 8 << 30, 30, 1) == 2       # over budget: one held, one new
    assert device_memory.held_at_once(0, 8 << 30, 30, 1) == 0              # no outputs, no reserve


def test_storages_of_cpu_outputs_reserve_nothing():
    flat = torch.empty(64)
    assert device_memory.storages(flat.split(16)) == []


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _carved(args):
    """Like the AdamW seed: one new flat buffer a call, handed back as views (64 MiB of outputs)."""
    x = args[0]
    flat = torch.empty(4 * x.numel(), device=x.device)
    outs = flat.split(x.numel())
    for o in outs:
        o.copy_(x)
    return outs


@cuda
def test_storages_count_a_shared_buffer_once():
    outs = _carved([torch.ones(1024, device="cuda")])
    assert device_memory.storages(outs) == [4 * 1024 * 4]


@cuda
@pytest.mark.parametrize("reserve", [False, True])
def test_held_outputs_need_no_cudamalloc_in_the_timed_rounds(reserve):
    torch.cuda.empty_cache()  # a cold cache, as in a fresh candidate process
    sets = [[torch.randn(4 * MB, device="cuda")] for _ in range(8)]
    m = timing.measure({"carved": _carved}, sets, reps=12, warmup=2, hold_bytes=512 * MB, reserve=reserve)
    segments = m["config"]["allocator_segments_timed"]
    if reserve:
        assert m["config"]["reserved_bytes"] >= 9 * 64 * MB and segments == 0, m["config"]
    else:  # the timer before the fix: held outputs grow the allocator inside timed calls
        assert m["config"]["reserved_bytes"] == 0 and segments >= 5, m["config"]
    assert not m["fingerprint_mismatches"]
