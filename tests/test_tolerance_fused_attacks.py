"""Attacks on the comparison (sandbox/tolerance.py and its kernels, sandbox/tolerance_fused.py): inputs on which
compare(..., fused=True) (the Triton kernels, here through the interpreter) and compare(..., fused=False) (the torch
passes) must say the same, strided and degenerate layouts, every NaN/Inf combination, and values at and past a dtype's
range, where the rules must still hold. Blocks and chunks are small (BLOCK 32, CHUNK 96) so that tiny tensors span
several of each. Triton's interpreter misreads bfloat16 subnormals (the GPU converts them exactly), so no test here
relies on them."""
import itertools
import math

import pytest
import torch

import sandbox.tolerance as tolerance_mod
import sandbox.tolerance_fused as fused_mod
from sandbox.tolerance import compare

NAN, INF = float("nan"), float("inf")
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(fused_mod, "BLOCK", 32)
    monkeypatch.setattr(tolerance_mod, "CHUNK", 96)
    monkeypatch.setattr(fused_mod, "_broken", [])  # a kernel failure here must not switch later tests to torch


def _report(m):
    if m is None or isinstance(m, tuple):
        return m
    return (m.mismatched, m.worst_index, m.first_nonfinite_diff, m.nonfinite_got, m.nonfinite_expected)


def _run(fused, got, ref, truth=None, alts=(), **kw):
    try:
        return compare("y", got, ref, truth, alternates=alts, fused=fused, **kw)
    except Exception as exc:  # noqa: BLE001 - a crash is an answer too
        return ("raised", type(exc).__name__)


def _both(got, ref, truth=None, alts=(), **kw):
    """(fused, torch) reports; the kernels must actually have run (no silent fall-back)."""
    a = _run(True, got, ref, truth, alts, **kw)
    assert not fused_mod._broken, fused_mod._broken
    return a, _run(False, got, ref, truth, alts, **kw)


def _assert_same(got, ref, truth=None, alts=(), **kw):
    a, b = _both(got, ref, truth, alts, **kw)
    assert _report(a) == _report(b), (a, b)
    if a is not None and not isinstance(a, tuple):
        for x, y in ((a.rel_l2_err, b.rel_l2_err), (a.max_abs_err, b.max_abs_err), (a.rel_l2_bound, b.rel_l2_bound)):
            assert (x != x and y != y) or x == pytest.approx(y, rel=1e-9), (a, b)
    return a


# ---------------------------------------------------------------- layouts and ranges


@pytest.mark.parametrize("layout", ["column of a 2-D tensor", "every other column"])
def test_strided_outputs_are_read_by_their_strides(layout):
    """A flattened 1-D strided tensor (x[:, 0], a diagonal, an expand) or one whose dimensions collapse to one stride
    (x[:, ::2]) is a view with a stride other than 1; the kernels read unit strides, so they are given a contiguous
    copy (a reference's output keeps its strides, and a candidate's need be contiguous only where the reference's is):
    read blind, an honest contiguous candidate was rejected and a wrong strided one accepted."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(40, 2, generator=g, dtype=torch.float64)
    base[:, 1] = 1e6  # what a stride-blind read picks up
    if layout == "column of a 2-D tensor":
        pick = lambda x: x[:, 0]  # noqa: E731
    else:
        base = base.reshape(8, 10)
        pick = lambda x: x[:, ::2]  # noqa: E731
    truth, ref = pick(base), pick(base.float())
    assert truth.reshape(-1).stride() == (2,)  # a view, not a contiguous copy
    wrong = base.float().clone()
    wrong += 1.0  # every element of the view off by 1 (atol x RMS is ~1e-5 x 1)
    wrong = pick(wrong)
    a, b = _both(wrong, ref, truth)
    assert b is not None and b.mismatched == ref.numel()
    assert a is not None, "the kernels accept a strided output off by 1 at every element"
    honest = ref.contiguous()
    a, b = _both(honest, ref, truth)
    assert b is None
    assert a is None, f"the kernels reject an exact copy of the reference: {_report(a)}"


def test_a_mask_filled_with_each_dtypes_smallest_value_is_judged_by_position():
    """A float16 model that fills masked elements with torch.finfo(dtype).min: the float64 truth holds float64's
    smallest (-1.8e308), the reference float16's (-65504), so PyTorch's worst element's error would be 3.4e38, every
    bound infinite and zeros accepted (the torch passes raised instead). A truth past twice the output dtype's range
    is judged by position: the candidate must saturate with its sign (float16's smallest, or -Inf)."""
    t = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ref = t.to(torch.float16)
    t[5], ref[5] = torch.finfo(torch.float64).min, torch.finfo(torch.float16).min
    got = torch.zeros_like(ref)
    got[5] = ref[5]
    a = _assert_same(got, ref, t)
    assert a is not None and a.mismatched > 32  # the zeros elsewhere are held to the other elements' bounds
    for masked in (ref[5], float("-inf")):
        honest = ref.clone()
        honest[5] = masked
        assert _assert_same(honest, ref, t) is None
    for wrong in (0.0, 65504.0, float("inf"), float("nan")):
        bad = ref.clone()
        bad[5] = wrong
        a = _assert_same(bad, ref, t)
        assert a is not None and a.mismatched == 1 and a.first_nonfinite_diff == (5,)
        assert "must saturate" in a.describe()


# ---------------------------------------------------------------- sums past float64's range


def test_float64_output_whose_error_squares_overflow_is_reported():
    """Where the sums of squares pass float64's range, the relative L2 error is inf / inf = NaN: that fails the L2
    bound and is reported as such (the report's non-finite branch, which has no non-finite element to name, is not
    taken)."""
    t = torch.tensor([1e160, 1.0, 2.0, 3.0], dtype=torch.float64)
    got = t.clone()
    got[0] = 2e160
    a = _assert_same(got, t.clone(), t)
    assert a is not None and not isinstance(a, tuple)
    t = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ref = t.float()
    t[5], ref[5] = torch.finfo(torch.float64).min, torch.finfo(torch.float32).min
    a = _assert_same(torch.zeros_like(ref), ref, t)
    assert a is not None and not isinstance(a, tuple)


def test_a_truth_past_the_outputs_range_needs_a_saturated_candidate():
    """Where the truth (1e300) lies past bfloat16's range and the reference overflowed to Inf, the truth clamped to
    float32's largest once let any value within rtol of 3.4e38 pass; now the candidate must saturate with the truth's
    sign: Inf or bfloat16's largest value, nothing smaller and not the other sign."""
    t = torch.full((8,), 1e300, dtype=torch.float64)
    ref = t.to(torch.bfloat16)
    assert torch.isinf(ref).all()
    for ok in (float("inf"), torch.finfo(torch.bfloat16).max):
        assert _assert_same(torch.full((8,), ok, dtype=torch.bfloat16), ref, t) is None
    for wrong in (3.0e38, -float("inf"), 1.0):
        a = _assert_same(torch.full((8,), wrong, dtype=torch.bfloat16), ref, t)
        assert a is not None and a.mismatched == 8


# ---------------------------------------------------------------- edge cases on which both paths agree


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_combination_of_nonfinite_values(dtype):
    """got x ref x truth x alternate over NaN, +Inf, -Inf, -0.0 and finite values, one element each."""
    gv, rv, tv, av = [NAN, INF, -INF, -0.0, 1.0, 5.0], [NAN, INF, -INF, 1.0], [NAN, INF, -INF, 1.0], [NAN, INF, 1.5]
    combos = list(itertools.product(gv, rv, tv, av))
    cols = [torch.tensor(c, dtype=torch.float64) for c in zip(*combos)]
    got, ref, truth, alt = cols[0].to(dtype), cols[1].to(dtype), cols[2], cols[3].to(dtype)
    for alts in ((), (alt,), (alt, alt.flip(0))):
        _assert_same(got, ref, truth, alts)
    _assert_same(got, ref, None)


@pytest.mark.parametrize("n", [1, 31, 32, 33, 95, 96, 97, 193])
def test_sizes_around_blocks_and_chunks(n):
    t = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    ref = t.to(torch.bfloat16)
    _assert_same(ref.clone(), ref, t)
    bad = ref.clone()
    bad[-1] += 4.0
    bad[0] = NAN
    a = _assert_same(bad, ref, t)
    assert a is not None and a.first_nonfinite_diff == (0,)


def test_zero_dimensional_and_odd_layouts():
    t = torch.tensor(1.25, dtype=torch.float64)
    _assert_same(t.float(), t.float(), t)
    assert _assert_same(torch.tensor(2.0), t.float(), t) is not None
    x = torch.randn(12, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ref = x.t().float()  # non-contiguous, but reshape(-1) copies: fine
    got = ref.clone()
    got[3, 4] = 9.0
    assert _assert_same(got, ref, x.t()).worst_index == (3, 4)
    _assert_same(got.contiguous(), ref.contiguous(), x.t())
    for gdt in DTYPES:  # got of another float dtype than the reference
        _assert_same(ref.to(gdt), ref, x.t())
    _assert_same(got.double(), ref.double(), x.t())  # float64 outputs


def test_three_alternates_leave_it_to_torch(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the kernels ran with three alternates")
    monkeypatch.setattr(fused_mod, "pass1", never)
    t = torch.randn(50, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    ref = t.to(torch.float16)
    assert compare("y", ref, ref, t, alternates=(ref, ref, ref), fused=True) is None
    assert not fused_mod._broken


def test_special_outputs():
    g = torch.Generator().manual_seed(5)
    t = torch.randn(100, dtype=torch.float64, generator=g)
    ref = t.to(torch.bfloat16)
    alt = ref.clone()
    alt[::7] = NAN  # an alternate's NaN where the truth is finite loosens nothing
    bad = ref.clone()
    bad[::7] += 1.0
    assert _assert_same(bad, ref, t, (alt,)) is not None
    _assert_same(torch.full_like(ref, NAN), ref, t)  # every element non-finite
    allnan = torch.full_like(ref, NAN)
    assert _assert_same(allnan, allnan, t) is None
    inf = torch.full_like(ref, INF)
    assert _assert_same(inf, inf, t.abs() * 1e300) is None
    zero = torch.zeros(100, dtype=torch.float64)  # an all-zero truth
    _assert_same(zero.float(), zero.float(), zero)
    assert _assert_same(zero.float() + 1e-30, zero.float(), zero) is not None
    near = torch.full((64,), 65504.0, dtype=torch.float64)  # float16 near its largest; one element overflowing
    near[3] = 65530.0
    r16 = near.to(torch.float16)
    g16 = r16.clone()
    g16[3] = 65504.0
    _assert_same(g16, r16, near)
    _assert_same(r16, r16, near)
    big = torch.full((64,), 3.0e38, dtype=torch.float64)  # bf16 past float32's range in the truth
    big[:5] = 1e39
    _assert_same(big.to(torch.bfloat16), big.to(torch.bfloat16), big)
    sub = torch.randn(64, dtype=torch.float64, generator=g) * 1e-310  # float64 subnormals
    _assert_same(sub.clone(), sub, sub)
    _assert_same(sub * 2, sub, sub)
    _assert_same(-ref, ref, t, scale=4.0)
    assert math.isfinite(_assert_same(bad, ref, None).rel_l2_err)
