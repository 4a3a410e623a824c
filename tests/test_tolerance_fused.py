"""sandbox/tolerance_fused.py's kernels, through Triton's interpreter: compare with them reports what the torch passes
report, element for element, over the cases of tests/test_tolerance.py (noise, outliers, NaN and Inf, alternates,
outputs past float32's range), with blocks and chunks small enough that a tensor spans several of each."""
import json
import sys

import pytest
import torch

import sandbox.tolerance as tolerance_mod
import sandbox.tolerance_fused as fused_mod
from sandbox.tolerance import compare
from tests.sm90 import compile_sm90, compiled_in_child, kernel_facts, nvidia_backend_available
from tests.test_tolerance import _rules, noisy_case

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(fused_mod, "BLOCK", 32)
    monkeypatch.setattr(tolerance_mod, "CHUNK", 96)  # three blocks a chunk; the last chunk padded


def _same(a, b):
    assert (a is None) == (b is None), (a, b)
    if a is None:
        return
    assert (a.mismatched, a.worst_index, a.first_nonfinite_diff, a.nonfinite_got, a.nonfinite_expected) == \
        (b.mismatched, b.worst_index, b.first_nonfinite_diff, b.nonfinite_got, b.nonfinite_expected)
    assert a.rel_l2_err == pytest.approx(b.rel_l2_err, rel=1e-9) or a.rel_l2_err != a.rel_l2_err
    assert a.max_abs_err == pytest.approx(b.max_abs_err, rel=1e-9) or a.max_abs_err != a.max_abs_err


def _case(dtype, case, n_alts):
    got, ref, truth, alts = noisy_case(dtype, case, seed=200 + case, n_alts=n_alts)
    if case % 2 and alts:
        alts[0].view(-1)[300] = float("nan")
    return got, ref, truth, alts


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(6))
def test_the_kernels_report_what_the_torch_passes_report(small_blocks, dtype, case):
    got, ref, truth, alts = _case(dtype, case, n_alts=case % 3)
    fused = compare("y", got, ref, truth, alternates=alts, fused=True)
    _same(fused, compare("y", got, ref, truth, alternates=alts, fused=False))
    count, l2_ok = _rules(got, ref, truth, alts)
    assert (fused is None) == (count == 0 and l2_ok)
    assert fused is None or fused.mismatched == count


def test_a_passing_output_and_one_bad_element_in_the_last_padded_chunk(small_blocks):
    truth = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    ref = truth.to(torch.bfloat16)
    assert compare("y", ref.clone(), ref, truth, fused=True) is None
    bad = ref.clone()
    bad[997] += 2.0
    report = compare("y", bad, ref, truth, fused=True)
    assert report is not None and report.mismatched == 1 and report.worst_index == (997,)
    no_truth = compare("y", bad, ref, None, fused=True)  # the reference stands in for the truth
    _same(no_truth, compare("y", bad, ref, None, fused=False))
    assert no_truth is not None and no_truth.worst_index == (997,)


def test_bf16_outputs_past_float32s_range_in_the_kernels(small_blocks):
    huge = torch.full((64,), 3.0e38, dtype=torch.float64)
    huge[0] = 3.45e38  # finite in float64, past float32's largest: clamped, not an Inf that excuses
    ref = huge.to(torch.bfloat16)
    got = ref.clone()
    got[0] = 0.0
    report = compare("y", got, ref, huge, fused=True)
    _same(report, compare("y", got, ref, huge, fused=False))
    assert report is not None
    big = torch.full((64,), 1e30, dtype=torch.float64)
    off = big.to(torch.bfloat16)
    off[:4] *= 1.5
    report = compare("y", off, big.to(torch.bfloat16), big, fused=True)
    assert report is not None and report.mismatched == 4 and report.rel_l2_err < 1.0


def test_what_the_kernels_take():
    x = torch.zeros(8)
    assert fused_mod.usable(x, x, x.double(), (), interpret=True)
    assert not fused_mod.usable(x, x, x.double(), ())  # the CPU: the torch passes, unless interpreted (tests)
    assert not fused_mod.usable(x, x, x.double(), (x, x, x), interpret=True)  # past MAX_ALTERNATES
    assert not fused_mod.usable(x.int(), x.int(), x.double(), (), interpret=True)


def test_kernels_that_fail_leave_the_comparison_to_the_torch_passes(small_blocks, monkeypatch):
    monkeypatch.setattr(fused_mod, "_broken", [])

    def cannot(*args, **kwargs):
        raise RuntimeError("this Triton cannot build it")
    monkeypatch.setattr(fused_mod, "pass1", cannot)
    got, ref, truth, alts = _case(torch.bfloat16, 3, n_alts=1)
    _same(compare("y", got, ref, truth, alternates=alts, fused=True),
          compare("y", got, ref, truth, alternates=alts, fused=False))
    assert fused_mod._broken and not fused_mod.usable(got, ref, truth, alts, interpret=True)


@pytest.mark.skipif(not nvidia_backend_available(), reason="Triton's NVIDIA backend (ptxas) is not installed")
def test_the_kernels_compile_for_the_h200():
    facts = compiled_in_child(__file__)
    assert set(facts) == {f"pass{p} {w}" for p in (1, 2) for w in WORKS}, facts
    assert all(f["shared"] >= 0 and f["local"] == 0 for f in facts.values()), facts  # no spills


# (output dtype, truth dtype, alternates): bf16 against a float64 truth (float32 work, the clamp), float32, float64
WORKS = {"bf16 f64 0": ("*bf16", "*fp64", 0, False, True), "bf16 f64 2": ("*bf16", "*fp64", 2, False, True),
         "fp32 f64 1": ("*fp32", "*fp64", 1, False, True), "fp64 f64 1": ("*fp64", "*fp64", 1, True, False)}


def _compile_all():
    facts = {}
    for name, (out, truth, n_alt, work64, clamp) in WORKS.items():
        common = dict(C=out, R=out, T=truth, A0=out, A1=out, n=4096, WORK64=work64, CLAMP=clamp, N_ALT=n_alt,
                      BLOCK=fused_mod.BLOCK)
        k1 = compile_sm90(fused_mod._pass1_kernel, dict(common, P="*fp64", OUT="*fp64", TERMS=8 + n_alt), num_warps=4)
        k2 = compile_sm90(fused_mod._pass2_kernel, dict(common, P="*fp64", OUT="*fp64", REF_FACTOR=4.0,
                                                        TAIL_FACTOR=2.0), num_warps=4)
        facts[f"pass1 {name}"], facts[f"pass2 {name}"] = kernel_facts(k1), kernel_facts(k2)
    return facts


if __name__ == "__main__" and sys.argv[1:2] == ["--compile-sm90"]:
    print(json.dumps(_compile_all()))
