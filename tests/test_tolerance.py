"""The one tolerance module, directly: what passes and what fails, per dtype, and what the report says."""
import pytest
import torch

from sandbox.stage_runners import _contiguous
from sandbox.tolerance import REF_FACTOR, TAIL_FACTOR, compare, tolerance_for

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _refs(dtype, shape=(64, 257), scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    truth = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    return truth.to(dtype), truth


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_output_rounded_to_the_dtype_passes(dtype, scale):
    ref, truth = _refs(dtype, scale=scale)
    assert compare("out", ref.clone(), ref, truth) is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_zeros_fail_even_for_a_small_valued_output(dtype):
    ref, truth = _refs(dtype, scale=1e-3)
    m = compare("out", torch.zeros_like(ref), ref, truth)
    assert m is not None and m.rel_l2_err == pytest.approx(1.0) and m.mismatched > 0


def test_float32_fails_at_tf32_precision_unless_the_task_allows_it():
    ref, truth = _refs(torch.float32)
    tf32_like = (truth * (1 + 3e-4 * torch.randn(truth.shape, dtype=torch.float64))).float()
    assert compare("out", tf32_like, ref, truth) is not None
    assert compare("out", tf32_like, ref, truth, allow_tf32=True) is None


def test_the_bound_follows_pytorchs_own_error():
    """An error of PyTorch's own size, falling on other elements (another summation order), passes; twice the
    allowed factor fails."""
    ref, truth = _refs(torch.bfloat16)
    g = torch.Generator().manual_seed(1)

    def noisy(sigma):
        return (truth + sigma * torch.randn(truth.shape, generator=g, dtype=torch.float64)).to(torch.bfloat16)

    pytorch = noisy(0.05)
    assert compare("out", noisy(0.05), pytorch, truth) is None
    assert compare("out", noisy(0.05 * REF_FACTOR * 2), pytorch, truth) is not None


def test_no_element_is_held_closer_than_the_references_worst():
    """PyTorch's own errors have a tail: a candidate whose one element lies past 4x PyTorch's RMS error, but within
    twice PyTorch's worst element, passes (the larger of two honest tails' maxima is a coin toss); past that, it
    fails."""
    truth = torch.linspace(-1.0, 1.0, 1 << 16, dtype=torch.float64)
    pytorch = truth.clone()
    pytorch[10] += 0.04  # PyTorch's tail: one element off by 0.04, every other exact
    got = truth.clone()
    got[5000] += 0.035  # past 4x PyTorch's RMS error (about 1.6e-4 here), within its worst: passes
    assert compare("o", got.float(), pytorch.float(), truth) is None
    got[5000] = truth[5000] + 0.06  # past PyTorch's worst, within twice it: passes
    assert TAIL_FACTOR == 2.0 and compare("o", got.float(), pytorch.float(), truth) is None
    got[5000] = truth[5000] + 0.1  # past twice PyTorch's worst (float32's own slack is about 1e-4): fails
    bad = compare("o", got.float(), pytorch.float(), truth)
    assert bad is not None and bad.worst_index == (5000,)


def test_nan_where_the_reference_is_finite_is_reported_with_its_position():
    ref, truth = _refs(torch.bfloat16)
    got = ref.clone()
    got[3, 5] = float("nan")
    m = compare("out", got, ref, truth)
    assert m is not None and m.first_nonfinite_diff == (3, 5) and m.nonfinite_got == 1
    assert "NaN/Inf" in m.describe() and "[3, 5]" in m.describe()


def test_matching_infinities_pass_and_integer_outputs_must_be_exact():
    ref = torch.tensor([1.0, float("inf"), -float("inf")], dtype=torch.float16)
    assert compare("out", ref.clone(), ref) is None
    assert compare("out", torch.tensor([1.0, float("inf"), float("inf")], dtype=torch.float16), ref) is not None
    labels = torch.tensor([3, 1, 4])
    assert compare("idx", labels.clone(), labels) is None
    assert compare("idx", torch.tensor([3, 1, 5]), labels).mismatched == 1


def test_tolerance_scale_and_unknown_dtypes():
    base = tolerance_for(torch.bfloat16)
    assert tolerance_for(torch.bfloat16, scale=2.0).rtol == pytest.approx(2 * base.rtol)
    with pytest.raises(KeyError):
        tolerance_for(torch.int8)


@pytest.mark.parametrize("shape,strides,ok", [
    ([4, 8], [8, 1], True), ([4, 8], [1, 4], False), ([2, 1, 9, 128], [1152, 128, 128, 1], True),
    ([2, 1, 9, 128], [1152, 1152, 128, 1], True), ([], [], True), ([3], [2], False), ([3], [1, 1], False)])
def test_contiguity_ignores_size_one_dimensions(shape, strides, ok):
    assert _contiguous(shape, strides) is ok


def test_chunked_comparison_reports_what_one_pass_would(monkeypatch):
    """compare walks big outputs CHUNK elements at a time (a 2 GB output would otherwise need tens of GB of float64
    temporaries); the verdict and the report do not depend on where the chunks fall."""
    import sandbox.tolerance as tolerance_mod

    g = torch.Generator().manual_seed(3)
    truth = torch.randn(9, 13, generator=g, dtype=torch.float64)
    ref = truth.to(torch.bfloat16)
    bad = ref.clone()
    bad[6, 4] += 3.0                      # past the first chunks
    nan = ref.clone()
    nan[8, 12] = float("nan")             # in the last chunk
    noisy = (truth * (1 + 0.05 * torch.randn(9, 13, generator=g, dtype=torch.float64))).to(torch.bfloat16)
    reports = {}
    for chunk in (1 << 24, 5):
        monkeypatch.setattr(tolerance_mod, "CHUNK", chunk)
        reports[chunk] = [compare("y", c, ref, truth) for c in (ref.clone(), bad, nan, noisy)]
    whole, small = reports[1 << 24], reports[5]
    assert whole[0] is None and small[0] is None
    for a, b in zip(whole[1:], small[1:]):
        assert a is not None and b is not None
        assert (a.mismatched, a.worst_index, a.first_nonfinite_diff) == (b.mismatched, b.worst_index,
                                                                          b.first_nonfinite_diff)
        assert a.rel_l2_err == pytest.approx(b.rel_l2_err, rel=1e-12) or (a.rel_l2_err != a.rel_l2_err)
    assert small[1].worst_index == (6, 4) and small[2].first_nonfinite_diff == (8, 12)


def test_an_alternate_honest_implementation_widens_the_bound_where_it_errs_too():
    # cuDNN's attention backward is exact where FlashAttention-2's (and any FA-style kernel's) is a few ulps off:
    # with FA2 named as an alternate, a candidate as good as FA2 passes; without, it fails (as on the H200)
    torch.manual_seed(0)
    truth = torch.randn(4096, dtype=torch.float64)
    ref = truth.to(torch.bfloat16)  # the accurate reference: error <= half an ulp everywhere
    alt = ref.clone()
    alt[:8] = (truth[:8] * 1.05).to(torch.bfloat16)  # an honest kernel with a few 5% errors
    got = ref.clone()
    got[:8] = (truth[:8] * 1.06).to(torch.bfloat16)  # within 4x the alternate's error, far outside the reference's
    assert compare("dq", got, ref, truth) is not None
    assert compare("dq", got, ref, truth, alternates=(alt,)) is None
    worse = ref.clone()
    worse[:8] = (truth[:8] * 1.5).to(torch.bfloat16)  # 10x the alternate's error: still rejected
    assert compare("dq", worse, ref, truth, alternates=(alt,)) is not None
    alt_worst = float((alt.double() - truth).abs().max())
    elsewhere = ref.clone()
    elsewhere[100:108] = (truth[100:108] + 3 * alt_worst).to(torch.bfloat16)  # where the alternate was accurate,
    assert compare("dq", elsewhere, ref, truth, alternates=(alt,)) is not None  # past twice its worst: rejected
    tail = ref.clone()  # within twice the alternate's worst element's error, where both were accurate: an honest
    tail[100:102] = (truth[100:102] + 1.5 * alt_worst).to(torch.bfloat16)  # rounding tail at other elements
    assert compare("dq", tail, ref, truth) is not None
    assert compare("dq", tail, ref, truth, alternates=(alt,)) is None


def test_an_alternates_overflow_loosens_nothing_and_needs_a_truth():
    truth = torch.randn(1024, dtype=torch.float64)
    ref = truth.to(torch.bfloat16)
    alt = ref.clone()
    alt[:4] = float("nan")
    alt[4:8] = float("inf")
    got = ref.clone()
    got[:8] = (truth[:8] * 1.2).to(torch.bfloat16)
    assert compare("o", got, ref, truth, alternates=(alt,)) is not None
    # without a float64 truth there is no error to take from an alternate: it is ignored
    far = ref.clone()
    far[:8] += 1.0
    assert compare("o", far, ref, None, alternates=(far,)) is not None


def _rules(got, ref, truth, alternates=()):
    """The module docstring's rules written out plainly (one float64 pass, elements selected by mask): the number of
    elements compare must count as mismatched, and whether the relative L2 bound holds."""
    tol = tolerance_for(ref.dtype)
    c, r, t = got.double().reshape(-1), ref.double().reshape(-1), truth.double().reshape(-1)
    alts = [a.double().reshape(-1) for a in alternates]
    same_nf = (c.isfinite() == r.isfinite()) & (c.isnan() == r.isnan()) & ((c == r) | c.isnan() | c.isfinite())
    nf_bad = int((~(same_nf | (~r.isfinite() & t.isfinite() & c.isfinite()))).sum())
    fin = c.isfinite() & r.isfinite() & t.isfinite()  # the sums: where all three are finite
    own = [(r - t)[fin].abs()] + [(torch.where(a.isfinite(), a, t) - t)[fin].abs() for a in alts]
    worst2 = max(float(e.pow(2).sum()) for e in own)
    rms_t, n = float(t[fin].pow(2).mean().sqrt()), int(fin.sum())
    l2_ok = float((c - t)[fin].norm()) <= max(tol.rel_l2, REF_FACTOR * worst2 ** 0.5 / float(t[fin].norm())) * \
        float(t[fin].norm())
    held = c.isfinite() & t.isfinite()  # elementwise: wherever candidate and truth are, the reference's error 0 where
    ref_err = torch.where(r.isfinite(), (r - t).abs(), 0.0)  # it overflowed
    for a in alts:
        ref_err = torch.maximum(ref_err, (torch.where(a.isfinite(), a, t) - t).abs())
    bound = tol.atol * max(rms_t, 1e-30) + tol.rtol * t.abs() + \
        (REF_FACTOR * ref_err.clamp_min((worst2 / n) ** 0.5)).clamp_min(TAIL_FACTOR * max(float(e.max()) for e in own))
    return nf_bad + int(((c - t).abs() > bound)[held].sum()), l2_ok


def noisy_case(dtype, case, seed, n_alts):
    """(got, ref, truth, alternates) of 37 x 29 elements at a scale of 10^(case - 2): references with a little noise,
    a candidate with more the higher the case, case + 1 elements three times off, and for odd cases an Inf the
    candidate matches (but in case 3) and a NaN it adds."""
    g = torch.Generator().manual_seed(seed)
    truth = torch.randn(37, 29, generator=g, dtype=torch.float64) * 10.0 ** (case - 2)
    ref = (truth * (1 + 0.002 * torch.randn(truth.shape, generator=g, dtype=torch.float64))).to(dtype)
    alts = tuple((truth * (1 + 0.004 * (k + 1) * torch.randn(truth.shape, generator=g, dtype=torch.float64)))
                 .to(dtype) for k in range(n_alts))
    got = (truth * (1 + 0.01 * case * torch.randn(truth.shape, generator=g, dtype=torch.float64))).to(dtype)
    flat = got.view(-1)
    flat[torch.randint(0, flat.numel(), (case + 1,), generator=g)] *= 3.0
    if case % 2:
        ref.view(-1)[7] = float("inf")
        got.view(-1)[7] = float("inf") if case != 3 else 1.0
        got.view(-1)[11] = float("nan")
    return got, ref, truth, alts


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(6))
def test_compare_counts_what_the_documented_rules_count(monkeypatch, dtype, case):
    """Over random outputs with noise, outliers, NaN and Inf, an alternate, and chunks that split the tensor
    anywhere, compare (chunked, on the device, in float32 for 16-bit outputs) finds the mismatches the rules written
    out plainly find."""
    import sandbox.tolerance as tolerance_mod

    got, ref, truth, alts = noisy_case(dtype, case, seed=100 + case, n_alts=1 if case > 2 else 0)
    monkeypatch.setattr(tolerance_mod, "CHUNK", 97 + case)
    report = compare("y", got, ref, truth, alternates=alts)
    count, l2_ok = _rules(got, ref, truth, alts)
    assert (report is None) == (count == 0 and l2_ok)
    assert report is None or report.mismatched == count


def test_bf16_outputs_past_float32s_range_are_still_compared():
    """16-bit outputs are compared in float32: their squares are summed in float64 (1e30 squared overflows float32),
    and a truth past float32's range is not turned into an Inf that would excuse the candidate there."""
    truth = torch.full((64,), 1e30, dtype=torch.float64)
    ref = truth.to(torch.bfloat16)
    assert compare("y", ref.clone(), ref, truth) is None
    off = ref.clone()
    off[:4] *= 1.5
    report = compare("y", off, ref, truth)
    assert report is not None and report.mismatched == 4 and report.rel_l2_err < 1.0
    huge = torch.full((64,), 3.0e38, dtype=torch.float64)
    huge[0] = 3.45e38  # finite in float64, past float32's largest
    ref = huge.to(torch.bfloat16)
    got = ref.clone()
    got[0] = 0.0  # the reference overflowed there, the truth did not: held to the truth, and far from it
    assert compare("y", got, ref, huge) is not None
    ref[0] = torch.finfo(torch.bfloat16).max  # a reference that stayed finite: the truth must stay finite too
    assert compare("y", got, ref, huge) is not None


@pytest.mark.parametrize("fused", [False, True])
def test_without_a_truth_a_mask_fill_is_judged_by_position_and_swells_no_slack(fused):
    """A model without a float64 truth is compared with its own outputs: a mask fill there (the dtype's smallest) is
    no value to scale the slack by, or noise of 10 elsewhere would pass."""
    gen = torch.Generator().manual_seed(3)
    ref = torch.randn(4096, generator=gen).to(torch.bfloat16)
    ref[::8] = torch.finfo(torch.bfloat16).min
    honest = ref.clone()
    honest[1::8] = (honest[1::8].float() * (1 + 2 ** -8)).to(torch.bfloat16)  # a rounding's worth, not at the fills
    noisy = ref.clone()
    keep = torch.ones(4096, dtype=torch.bool)
    keep[::8] = False
    noisy[keep] += (10 * torch.randn(int(keep.sum()), generator=gen)).to(torch.bfloat16)
    unfilled = ref.clone()
    unfilled[::8] = 0
    assert compare("o", honest, ref, None, fused=fused) is None
    assert compare("o", noisy, ref, None, fused=fused) is not None
    report = compare("o", unfilled, ref, None, fused=fused)
    assert report is not None and report.first_nonfinite_diff is not None
