"""The one tolerance module: how close a candidate's output must be, per dtype, and the comparison itself.

A candidate output `c` is compared with two references computed in the trusted parent:
  t  the "truth": the reference model run in float64 on upcast inputs (when it can run in float64),
  r  the reference model run as the task defines it (its own dtype): what PyTorch itself delivers.
It passes when all of these hold:
  1. NaN/Inf positions equal r's (a candidate may be finite where r overflowed only if t is finite there too
     and c is close to t);
  2. elementwise |c - t| <= atol * scale + rtol * |t| + max(K * max(|r - t|, RMS(r - t)), MAX(|r - t|)), where
     scale is the RMS of t: the absolute slack is relative to the output's magnitude, so returning zeros for a
     small-valued output fails; and no element need be closer to the truth than the reference's worst one (an
     honest kernel's rounding errors have a tail as PyTorch's do, only at other elements: of 67M attention outputs
     one or two of a tuned variant's lay past 4x PyTorch's RMS error, rejecting 78 of 87 variants on the H200);
  3. relative L2 error ||c - t|| / ||t|| <= max(l2 floor of the dtype, K * that of r): at most a few times
     PyTorch's own error, never looser than the dtype's floor. The float32 floor is tight enough that a
     tf32 matmul (≈3e-4 at large K) fails unless the task declares tf32 allowed.
A task may name other honest implementations of its op that PyTorch ships (`crucible_references`, sandbox/task.py:
SDPA's FlashAttention-2 backend beside the cuDNN one SDPA picks on a Hopper GPU). Their outputs `a` join r in the
"PyTorch's own error" terms: |r - t| becomes max(|r - t|, |a - t|) elementwise, and RMS and relative L2 errors the
largest of them. So a candidate is held to the least accurate of PyTorch's own kernels for the op, not to the luck
of the one the reference happened to run. NaN/Inf positions still follow r.
Integer and boolean outputs must be equal exactly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .records import Mismatch

REF_FACTOR = 4.0  # "at most a few times PyTorch's own error"
CHUNK = 1 << 24  # elements compared at a time (float64 temporaries of 128 MiB)


@dataclass(frozen=True)
class Tolerance:
    atol: float  # multiplied by the RMS of the expected output
    rtol: float
    rel_l2: float  # floor of the relative L2 bound


TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(atol=1e-9, rtol=1e-9, rel_l2=1e-10),
    torch.float32: Tolerance(atol=1e-5, rtol=1e-4, rel_l2=1e-5),
    torch.float16: Tolerance(atol=1e-3, rtol=4e-3, rel_l2=2e-3),
    torch.bfloat16: Tolerance(atol=8e-3, rtol=1.6e-2, rel_l2=1e-2),
}
# What a task gets for float32 outputs when it declares CRUCIBLE_ALLOW_TF32 = True.
TF32 = Tolerance(atol=2e-3, rtol=5e-3, rel_l2=2e-3)


def tolerance_for(dtype: torch.dtype, *, allow_tf32: bool = False, scale: float = 1.0) -> Tolerance:
    """The tolerance for an output dtype; `scale` (a task's CRUCIBLE_TOLERANCE_SCALE) loosens or tightens all three."""
    if dtype not in TOLERANCES:
        raise KeyError(f"no tolerance for {dtype}")
    tol = TF32 if (dtype == torch.float32 and allow_tf32) else TOLERANCES[dtype]
    return Tolerance(tol.atol * scale, tol.rtol * scale, tol.rel_l2 * scale)


def compare(name: str, got: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor | None = None, *,
            allow_tf32: bool = False, scale: float = 1.0, alternates: tuple[torch.Tensor, ...] = ()) -> Mismatch | None:
    """None when `got` passes against the reference `ref` (and float64 `truth`, if any); else a report.
    `alternates`: the same output from other honest PyTorch implementations (module docstring); ignored without
    a truth or where a shape differs."""
    if got.shape != ref.shape:
        raise ValueError(f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)} (check shapes before compare)")
    if not (ref.is_floating_point() or ref.is_complex()):
        return _compare_exact(name, got, ref)

    tol = tolerance_for(ref.dtype, allow_tf32=allow_tf32, scale=scale)
    alternates = tuple(a for a in alternates if truth is not None and a.shape == ref.shape)
    chunks = _Chunks(got, ref, truth, alternates)
    g = _global_terms(chunks, len(alternates))
    scale_t = math.sqrt(g.t2 / g.n_fin) if g.n_fin else 0.0
    # PyTorch's own error, per element where it is large there, and as its RMS everywhere: a candidate whose
    # rounding falls elsewhere than PyTorch's (another summation order) is not held to PyTorch's lucky elements.
    worst_ref2 = max(g.ref_err2)
    ref_rms = math.sqrt(worst_ref2 / g.n_fin) if g.n_fin else 0.0
    norm_t = math.sqrt(g.t2)
    rel_l2 = math.sqrt(g.err2) / norm_t if norm_t > 0 else math.sqrt(g.err2)
    rel_l2_ref = math.sqrt(worst_ref2) / norm_t if norm_t > 0 else math.sqrt(worst_ref2)
    l2_bound = max(tol.rel_l2, REF_FACTOR * rel_l2_ref)
    n_out, worst_flat, max_abs = _elementwise(chunks, tol, scale_t, ref_rms, g.ref_max, l2_failed=rel_l2 > l2_bound)

    if g.n_nf_bad == 0 and n_out == 0 and rel_l2 <= l2_bound:
        return None

    # The report: the worst element by error over bound, in the full tensor's coordinates.
    if (n_out or rel_l2 > l2_bound) and worst_flat is not None:
        worst = _unravel(worst_flat, ref.shape)
        expected, got_v = chunks.value("truth", worst_flat), chunks.value("got", worst_flat)
    else:
        assert g.first_nf is not None
        worst = _unravel(g.first_nf, ref.shape)
        expected, got_v, max_abs = chunks.value("ref", g.first_nf), chunks.value("got", g.first_nf), float("nan")
    return Mismatch(
        output=name, numel=ref.numel(), mismatched=n_out + g.n_nf_bad, worst_index=worst, expected=expected,
        got=got_v, max_abs_err=max_abs, rel_l2_err=rel_l2, rel_l2_bound=l2_bound,
        nonfinite_expected=g.r_nf_count, nonfinite_got=g.c_nf_count,
        first_nonfinite_diff=_unravel(g.first_nf, ref.shape) if g.first_nf is not None else None,
    )


def _compare_exact(name: str, got: torch.Tensor, ref: torch.Tensor) -> Mismatch | None:
    """Integer and boolean outputs: None when every element equals the reference's, else the first that does not."""
    diff = got != ref
    bad = int(diff.sum())
    if bad == 0:
        return None
    idx = _unravel(int(diff.flatten().nonzero()[0]), ref.shape)
    return Mismatch(name, ref.numel(), bad, idx, float(ref[idx]), float(got[idx]),
                    float((got.double() - ref.double()).abs().max()), 1.0, 0.0, note="integer output must match exactly")


@dataclass
class _GlobalTerms:
    """What pass 1 adds up over the whole output, chunk by chunk."""
    n_nf_bad: int = 0  # elements whose NaN/Inf disagrees with the reference's
    first_nf: int | None = None  # flat index of the first of them
    c_nf_count: int = 0  # non-finite elements of the candidate
    r_nf_count: int = 0  # non-finite elements of the reference
    n_fin: int = 0  # elements finite in candidate, reference and truth
    t2: float = 0.0  # sum of the truth's squares there
    err2: float = 0.0  # sum of the candidate's squared errors there
    ref_err2: list[float] = field(default_factory=list)  # PyTorch's own: the reference's, then each alternate's
    ref_max: float = 0.0  # the reference's largest error at one element (an alternate's stay where they are)


def _global_terms(chunks: _Chunks, n_alternates: int) -> _GlobalTerms:
    """Pass 1, the global terms: non-finite disagreements, and the sums behind the RMS and L2 norms."""
    g = _GlobalTerms(ref_err2=[0.0] * (1 + n_alternates))
    for start, c, r, t, alts in chunks:
        c_nf, r_nf, t_nf = ~torch.isfinite(c), ~torch.isfinite(r), ~torch.isfinite(t)
        # Where r is non-finite the candidate must agree with r exactly (same NaN, same signed Inf), unless the
        # float64 truth is finite there and the candidate is finite too (it avoided an overflow r suffered).
        same_nf = (c_nf == r_nf) & (torch.isnan(c) == torch.isnan(r)) & ((c == r) | torch.isnan(c) | ~c_nf)
        nf_bad = ~(same_nf | (r_nf & ~t_nf & ~c_nf))
        bad = int(nf_bad.sum())
        if bad and g.first_nf is None:
            g.first_nf = start + int(nf_bad.nonzero()[0])
        g.n_nf_bad += bad
        g.c_nf_count += int(c_nf.sum())
        g.r_nf_count += int(r_nf.sum())
        finite = ~c_nf & ~r_nf & ~t_nf
        cf, rf, tf = c[finite], r[finite], t[finite]
        g.n_fin += tf.numel()
        g.t2 += float(tf.pow(2).sum())
        for j, x in enumerate((rf, *(_finite_or(a[finite], tf) for a in alts))):
            d = x - tf
            g.ref_err2[j] += float(d.pow(2).sum())
            if j == 0 and d.numel():
                g.ref_max = max(g.ref_max, float(d.abs().max()))
        g.err2 += float((cf - tf).pow(2).sum())
    return g


def _elementwise(chunks: _Chunks, tol: Tolerance, scale_t: float, ref_rms: float, ref_max: float, *,
                 l2_failed: bool) -> tuple[int, int | None, float]:
    """Pass 2, elementwise: how many elements lie outside their bound, the flat index of the worst one by error over
    bound, and the largest absolute error. The worst is looked for only where it can be: in chunks with an element
    outside (its ratio exceeds 1, every other chunk's does not), or anywhere when the L2 bound already failed."""
    n_out, worst_ratio, worst_flat, max_abs = 0, -1.0, None, 0.0
    for start, c, r, t, alts in chunks:
        finite = torch.isfinite(c) & torch.isfinite(r) & torch.isfinite(t)
        cf, rf, tf = c[finite], r[finite], t[finite]
        if not tf.numel():
            continue
        err = (cf - tf).abs()
        ref_err = (rf - tf).abs()
        for a in alts:
            ref_err = torch.maximum(ref_err, (_finite_or(a[finite], tf) - tf).abs())
        bound = tol.atol * max(scale_t, 1e-30) + tol.rtol * tf.abs() + \
            (REF_FACTOR * ref_err.clamp_min(ref_rms)).clamp_min(ref_max)
        outside = int((err > bound).sum())
        n_out += outside
        max_abs = max(max_abs, float(err.max()))
        if outside or l2_failed:
            ratio = err / bound.clamp_min(1e-300)
            k = int(ratio.argmax())
            if float(ratio[k]) > worst_ratio:
                worst_ratio, worst_flat = float(ratio[k]), start + int(finite.nonzero()[k])
    return n_out, worst_flat, max_abs


class _Chunks:
    """got, ref and truth (ref where there is none) flattened, as float64 on got's device, CHUNK elements at a time:
    a 2 GB output never needs more than a few CHUNK-sized float64 temporaries at once."""

    def __init__(self, got: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor | None,
                 alternates: tuple[torch.Tensor, ...] = ()):
        self.got, self.ref = got.detach().reshape(-1), ref.detach().reshape(-1)
        self.truth = truth.detach().reshape(-1) if truth is not None else self.ref
        self.alternates = tuple(a.detach().reshape(-1) for a in alternates)
        self.device = self.got.device

    def _f64(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(device=self.device, dtype=torch.float64)

    def __iter__(self):
        for start in range(0, self.got.numel(), CHUNK):
            end = start + CHUNK
            yield (start, self._f64(self.got[start:end]), self._f64(self.ref[start:end]),
                   self._f64(self.truth[start:end]), [self._f64(a[start:end]) for a in self.alternates])

    def value(self, which: str, flat: int) -> float:
        return float(self._f64(getattr(self, which)[flat]))


def _finite_or(a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """An alternate's values where finite, else the truth's: an alternate's overflow loosens nothing."""
    return torch.where(torch.isfinite(a), a, t)


def _unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    idx = []
    for dim in reversed(shape):
        idx.append(flat % dim if dim else 0)
        flat //= dim if dim else 1
    return tuple(reversed(idx))
