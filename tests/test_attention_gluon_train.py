"""seeds/attention_gluon_train.py: attention fwd+bwd through the Gluon kernels with bf16 precise numerics or fp16
working copies. On the CPU: the fp16 exponent rule at its edges, the two preparation kernels through Triton's
interpreter (largest magnitudes with NaN as inf; exact fp16 copies, do times 2^e), the eligibility rule and the
refusals, crucible's static rules, and the fp16 numerics mirrored in the backward kernels' order (the bwd tests'
mirror) against float64: more accurate than bf16 rounded once and than the bf16 split. On an sm_90 GPU only:
every numerics against float64 through sandbox/tolerance.py (cuDNN and FlashAttention-2 as PyTorch's own errors)."""
from __future__ import annotations

import math

import pytest
import torch

from seeds import attention_gluon_train as T
from tests.seed_rules import assert_static_rules
from tests.test_attention_gluon_bwd import float64_reference, mirror_dkdv, mirror_dq, needs_sm90

LN2 = math.log(2.0)


EXPONENT_CASES = [
    ((1.0, 1.0, 1.0, 1.0), 7),  # 2 x 128 x 1 x 1 x 2^7 = 2^15
    ((5.0, 5.0, 5.0, 5.0), 2),  # 6400 x 4 <= 2^15 < 6400 x 8
    ((1.0, 1.0, 1.0, 0.0), 0),  # do = 0: dS = 0 whatever e
    ((1.0, 1.0, 0.0, 1e-9), T.MAX_EXPONENT),  # v = 0: only do's own range and the cap
    ((1.0, 1.0, 16.0, 8.0), 0),  # 2 x 128 x 16 x 8 = 2^15 exactly
    ((1.0, 1.0, 16.0, 9.0), None),  # dS's worst case past 2^15 even at e = 0
    ((40000.0, 1.0, 1.0, 1.0), None),  # q past 2^15: not every bf16 value is an fp16 one
    ((1.0, math.inf, 1.0, 1.0), None),  # inf (or NaN, read as inf)
    ((1.0, 1.0, 1.0, math.nan), None),
]


@pytest.mark.parametrize("amax,want", EXPONENT_CASES)
def test_fp16_exponent_rule(amax, want):
    assert T.fp16_exponent_of(*amax, head_dim=128) == want


def device_exponent(amax, head_dim: int = 128):
    """_exponent_kernel (through fused_prep's launch arguments) on a 4-vector of largest magnitudes: (e, ok, 2^e)."""
    scale, exp = torch.empty(1), torch.empty(2, dtype=torch.int32)
    T._exponent_kernel[(1,)](torch.tensor(amax, dtype=torch.float32), scale, exp, head_dim, INPUT_MAX_LOG2=15,
                             DS_MAX_LOG2=15, MAX_E=T.MAX_EXPONENT)
    return int(exp[0]), int(exp[1]), scale.item()


def test_device_exponent_is_the_host_rule():
    """The kernel the fused preparation reads e from gives fp16_exponent_of's e (or refuses where it does) on the
    rule's edge cases and on bf16 magnitudes drawn over 40 octaves, and its 2^e scale."""
    torch.manual_seed(0)
    cases = [c for c, _ in EXPONENT_CASES] + [(1.0, 1.0, 16.0, 2.0 ** 15), (2.0 ** 15, 1.0, 1.0, 1.0),
                                              (1.0, 1.0, 1.0, 2.0 ** 15 + 256), (0.0, 0.0, 0.0, 0.0)]
    draws = torch.exp2(torch.rand(300, 4) * 40 - 30).to(torch.bfloat16).float()
    cases += [tuple(r) for r in draws.tolist()]
    for amax in cases:
        want = T.fp16_exponent_of(*amax, head_dim=128)
        e, ok, scale = device_exponent(amax)
        assert (e if ok else None) == want, (amax, e, ok, want)
        assert scale == 2.0 ** e


@pytest.mark.parametrize("split", [False, True])
def test_input_amax_kernel_reads_every_element_and_nan_as_inf(split):
    """Four tensors whose largest magnitudes sit in the last partial block, negative, and a NaN in one."""
    torch.manual_seed(0)
    n = 3 * T.PREP_BLOCK + 17
    ts = [torch.randn(n).to(torch.bfloat16) * 0.1 for _ in range(4)]
    ts[0][-1] = -7.5
    ts[1][T.PREP_BLOCK] = 3.25
    ts[2][5] = float("nan")
    ts[3][-17] = 2.0 ** -3
    got = T.input_amax(*ts, split=split)
    assert got[0] == 7.5 and got[1] == 3.25 and math.isinf(got[2])
    assert got[3] == max(2.0 ** -3, ts[3].float().abs().max().item())


@pytest.mark.parametrize("split", [False, True])
def test_fp16_copies_are_exact_and_scale_do_by_a_power_of_two(split):
    """Exact from fp16's normal range (2^-14) up to 2^15; below it fp16's subnormals hold a bf16 value to within
    2^-25 (half their spacing), a few 1e-8 at most."""
    torch.manual_seed(0)
    n = 2 * T.PREP_BLOCK + 5
    q, k, v, do = (torch.randn(n).to(torch.bfloat16) for _ in range(4))
    q[0], k[1], v[2], v[3] = 30000.0, 2.0 ** -14, -1.5e-3, 1.2345e-7
    q16, k16, v16, do16 = T.fp16_copies(q, k, v, do, 3, split=split)
    for a, b in ((q, q16), (k, k16), (v, v16)):
        normal = a.float().abs() >= 2.0 ** -14
        assert b.dtype == torch.float16 and torch.equal(a.float()[normal], b.float()[normal])
        assert (a.float() - b.float()).abs().max() <= 2.0 ** -25
    assert v16[3].item() != 0.0
    assert torch.equal(do16.float(), do.float() * 8.0)


def test_fused_copies_are_exact_and_take_every_largest_magnitude():
    """prep="fused": q, k, v copied exactly (from fp16's normal range up), the four largest magnitudes read in the
    same launch (last partial block, negative, NaN as inf) and e from them; a value past fp16's range makes e None
    (its copy is inf and must not be used)."""
    torch.manual_seed(0)
    shape = (1, 1, 2 * T.PREP_BLOCK // 128 + 1, 128)  # two whole blocks and one of 128 elements
    q, k, v, do = (torch.randn(shape).to(torch.bfloat16) * 0.5 for _ in range(4))
    q.view(-1)[-1], k.view(-1)[T.PREP_BLOCK], v.view(-1)[3], do.view(-1)[-9] = -7.5, 3.25, 1.2345e-7, 4.0
    (q16, k16, v16), e = T.fused_copies(q, k, v, do)
    for a, b in ((q, q16), (k, k16), (v, v16)):
        normal = a.float().abs() >= 2.0 ** -14
        assert b.dtype == torch.float16 and torch.equal(a.float()[normal], b.float()[normal])
        assert (a.float() - b.float()).abs().max() <= 2.0 ** -25
    amax = [t.float().abs().max().item() for t in (q, k, v, do)]
    assert amax[0] == 7.5 and amax[1] == 3.25 and amax[3] == 4.0
    assert e == T.fp16_exponent_of(*amax, head_dim=128) and e is not None
    v.view(-1)[0] = float("nan")
    assert T.fused_copies(q, k, v, do)[1] is None
    v.view(-1)[0], k.view(-1)[1] = 0.0, 70000.0
    (_, k16, _), e = T.fused_copies(q, k, v, do)
    assert e is None and math.isinf(k16.view(-1)[1].item())


def test_train_ok_refuses_what_the_kernels_do_not_take():
    x = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    assert not T.train_ok(x, x, x, x, False)  # the CPU
    with pytest.raises(ValueError, match="sm_90"):
        T.attention_fwd_bwd_gluon(x, x, x, x)
    with pytest.raises(ValueError, match="numerics"):
        T.attention_fwd_bwd_gluon(x, x, x, x, numerics="fp8")
    with pytest.raises(ValueError, match="'fused' with delta 'o'"):
        T.attention_fwd_bwd_gluon(x, x, x, x, delta="dp", prep="fused")


def test_module_keeps_crucible_static_rules():
    assert_static_rules(T.__file__)


@pytest.mark.parametrize("causal", [False, True])
def test_fp16_numerics_beat_bf16_once_and_split(causal):
    """The backward's maths in the kernels' order on one head (S 256, D 128): fp16 working copies with dS rounded
    once to fp16 (do scaled by 2^e, the gradients scaled back) against float64, next to bf16 with dS rounded once
    and bf16 split (hi + lo). fp16's dq / dk errors are below both (seen: 3e-4 against 2.3e-3 and 1.7e-3; the
    mirror rounds its outputs to fp16, where the kernels write bf16, whose rounding then dominates)."""
    torch.manual_seed(0)
    s_len, d = 256, 128
    q, k, v, do = (torch.randn(s_len, d).to(torch.bfloat16) for _ in range(4))
    q = q * 2  # sharper rows: fewer keys take a row, where rounding shows
    dq64, dk64, dv64, lse2, delta = float64_reference(q, k, v, do, causal)
    e = T.fp16_exponent_of(*(t.float().abs().max().item() for t in (q, k, v, do)), head_dim=d)
    assert e is not None and e >= 0

    def errs(dtype, split, c=1.0):
        qq, kk, vv = (t.to(dtype) for t in (q, k, v))
        dd = (do.float() * c).to(dtype)
        dk, dv = mirror_dkdv(qq, kk, vv, dd, lse2, delta * c, causal, split=split)
        dq = mirror_dq(qq, kk, vv, dd, lse2, delta * c, causal, split=split)
        return [((g.double() / c - t).norm() / t.norm()).item() for g, t in ((dq, dq64), (dk, dk64), (dv, dv64))]

    once, split, fp16 = errs(torch.bfloat16, False), errs(torch.bfloat16, True), errs(torch.float16, False, 2.0 ** e)
    for i, name in enumerate(("dq", "dk")):
        assert fp16[i] < once[i], f"{name}: fp16 {fp16[i]:.2e} not below bf16 once {once[i]:.2e}"
        assert fp16[i] < split[i], f"{name}: fp16 {fp16[i]:.2e} against the split's {split[i]:.2e}"
    assert fp16[2] < once[2], f"dv: fp16 {fp16[2]:.2e} against bf16's {once[2]:.2e}"


# ---- on the H200 ---------------------------------------------------------------------------------------------
@needs_sm90
@pytest.mark.parametrize("numerics,delta", [("bf16", "dp"), ("fp16", "dp"), ("fp16", "o"), ("auto", "o")])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dist", ["normal", "uniform", "outliers", "constant_rows"])
def test_fwd_bwd_on_the_gpu(numerics, delta, causal, dist):
    """o, dq, dk, dv of the fwd+bwd tasks' draws against float64 through the one tolerance module (cuDNN's SDPA
    and FlashAttention-2 as PyTorch's own errors). "fp16" skips a draw its range rule refuses ("auto" then runs
    bf16). GPU-only (CRUCIBLE_TEST_DEVICE=cuda)."""
    from pathlib import Path

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from sandbox.task import load_task
    from sandbox.tolerance import compare

    name = "attention_fwd_bwd_causal.py" if causal else "attention_fwd_bwd.py"
    task = load_task(Path(__file__).resolve().parent.parent / "tasks" / name)
    b, h, s = 1, 4, 512
    q, k, v, do = task.with_constants({"B": b, "H": h, "S": s}).make_inputs(s + h, dist, "cuda")
    if numerics == "fp16" and T.fp16_exponent(q, k, v, do) is None:
        pytest.skip(f"{dist}: outside fp16's range rule")
    got = T.attention_fwd_bwd_gluon(q, k, v, do, causal, numerics=numerics, delta=delta)

    def run(backend):
        with torch.enable_grad(), sdpa_kernel([backend]):
            q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
            o = F.scaled_dot_product_attention(q2, k2, v2, is_causal=causal)
            return (o.detach(), *torch.autograd.grad(o, (q2, k2, v2), do))

    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        od = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal)
        truth = (od.detach(), *torch.autograd.grad(od, (qd, kd, vd), do.double()))
    ref, alt = run(SDPBackend.CUDNN_ATTENTION), run(SDPBackend.FLASH_ATTENTION)
    for n, g, r, a, t in zip(("o", "dq", "dk", "dv"), got, ref, alt, truth):
        assert g.dtype == q.dtype and g.shape == q.shape
        bad = compare(f"{numerics} {n}", g, r, t, alternates=(a,))
        assert bad is None, bad.describe()


@needs_sm90
@pytest.mark.parametrize("causal", [False, True])
def test_fused_prep_matches_the_two_kernel_prep_on_the_gpu(causal):
    """prep="fused" (q, k, v copied with the largest magnitudes, do's copy and delta from the forward's epilogue, o
    written as bf16 there) against prep="two" (the copy kernels, o through fp16): the same fp16 operands and delta,
    so dq, dk, dv bitwise equal; o rounded once instead of twice, so within one bf16 step. GPU-only."""
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(2, 3, 512, 128, device="cuda").to(torch.bfloat16) for _ in range(4))
    fused = T.attention_fwd_bwd_gluon(q, k, v, do, causal, numerics="fp16", delta="o", prep="fused")
    two = T.attention_fwd_bwd_gluon(q, k, v, do, causal, numerics="fp16", delta="o", prep="two")
    for name, a, b in zip(("dq", "dk", "dv"), fused[1:], two[1:]):
        assert torch.equal(a, b), f"{name}: fused and two-kernel preparation differ"
    step = two[0].float().abs() * 2.0 ** -7 + 2.0 ** -24  # fp16's subnormals round to 2^-25 first
    assert fused[0].dtype == torch.bfloat16 and ((fused[0].float() - two[0].float()).abs() <= step).all()
