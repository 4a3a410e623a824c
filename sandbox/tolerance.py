"""The one tolerance module: how close a candidate's output must be, per dtype, and the comparison itself.

A candidate output `c` is compared with two references computed in the trusted parent:
  t  the "truth": the reference model run in float64 on upcast inputs (when it can run in float64),
  r  the reference model run as the task defines it (its own dtype): what PyTorch itself delivers.
It passes when all of these hold:
  1. NaN/Inf positions equal r's (a candidate may be finite where r overflowed only if t is finite there too
     and c is close to t);
  2. elementwise |c - t| <= atol * scale + rtol * |t| + K * max(|r - t|, RMS(r - t)), where scale is the RMS of t:
     the absolute slack is relative to the output's magnitude, so returning zeros for a small-valued output fails;
  3. relative L2 error ||c - t|| / ||t|| <= max(l2 floor of the dtype, K * that of r): at most a few times
     PyTorch's own error, never looser than the dtype's floor. The float32 floor is tight enough that a
     tf32 matmul (≈3e-4 at large K) fails unless the task declares tf32 allowed.
Integer and boolean outputs must be equal exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .records import Mismatch

REF_FACTOR = 4.0  # "at most a few times PyTorch's own error"


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
            allow_tf32: bool = False, scale: float = 1.0) -> Mismatch | None:
    """None when `got` passes against the reference `ref` (and float64 `truth`, if any); else a report."""
    if got.shape != ref.shape:
        raise ValueError(f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)} (check shapes before compare)")
    numel = ref.numel()
    if not (ref.is_floating_point() or ref.is_complex()):
        diff = got != ref
        bad = int(diff.sum())
        if bad == 0:
            return None
        idx = _unravel(int(diff.flatten().nonzero()[0]), ref.shape)
        return Mismatch(name, numel, bad, idx, float(ref[idx]), float(got[idx]),
                        float((got.double() - ref.double()).abs().max()), 1.0, 0.0, note="integer output must match exactly")

    tol = tolerance_for(ref.dtype, allow_tf32=allow_tf32, scale=scale)
    c = got.detach().to(torch.float64)
    r = ref.detach().to(torch.float64)
    t = truth.detach().to(device=c.device, dtype=torch.float64) if truth is not None else r

    c_nf, r_nf, t_nf = ~torch.isfinite(c), ~torch.isfinite(r), ~torch.isfinite(t)
    # Where r is non-finite the candidate must agree with r exactly (same NaN, same signed Inf), unless the
    # float64 truth is finite there and the candidate is finite too (it avoided an overflow r suffered).
    same_nf = (c_nf == r_nf) & (torch.isnan(c) == torch.isnan(r)) & ((c == r) | torch.isnan(c) | ~c_nf)
    excused = r_nf & ~t_nf & ~c_nf
    nf_bad = ~(same_nf | excused)
    n_nf_bad = int(nf_bad.sum())
    finite = ~c_nf & ~r_nf & ~t_nf

    cf, rf, tf = c[finite], r[finite], t[finite]
    scale_t = float(tf.pow(2).mean().sqrt()) if tf.numel() else 0.0
    err = (cf - tf).abs()
    # PyTorch's own error, per element where it is large there, and as its RMS everywhere: a candidate whose
    # rounding falls elsewhere than PyTorch's (another summation order) is not held to PyTorch's lucky elements.
    ref_err = (rf - tf).abs()
    ref_rms = float(ref_err.pow(2).mean().sqrt()) if ref_err.numel() else 0.0
    bound = tol.atol * max(scale_t, 1e-30) + tol.rtol * tf.abs() + REF_FACTOR * ref_err.clamp_min(ref_rms)
    outside = err > bound
    n_out = int(outside.sum())
    norm_t = float(tf.norm()) if tf.numel() else 0.0
    rel_l2 = float((cf - tf).norm()) / norm_t if norm_t > 0 else float((cf - tf).norm())
    rel_l2_ref = float((rf - tf).norm()) / norm_t if norm_t > 0 else float((rf - tf).norm())
    l2_bound = max(tol.rel_l2, REF_FACTOR * rel_l2_ref)

    if n_nf_bad == 0 and n_out == 0 and rel_l2 <= l2_bound:
        return None

    # Build the report: the worst element by error over bound, in the full tensor's coordinates.
    flat_pos = finite.flatten().nonzero().flatten()
    if n_out or (rel_l2 > l2_bound and err.numel()):
        ratio = err / bound.clamp_min(1e-300)
        k = int(ratio.argmax())
        worst = _unravel(int(flat_pos[k]), ref.shape)
        expected, got_v = float(t[worst]), float(c[worst])
        max_abs = float(err.max())
    else:
        k = int(nf_bad.flatten().nonzero()[0])
        worst = _unravel(k, ref.shape)
        expected, got_v, max_abs = float(r[worst]), float(c[worst]), float("nan")
    first_nf = _unravel(int(nf_bad.flatten().nonzero()[0]), ref.shape) if n_nf_bad else None
    return Mismatch(
        output=name, numel=numel, mismatched=n_out + n_nf_bad, worst_index=worst, expected=expected,
        got=got_v, max_abs_err=max_abs, rel_l2_err=rel_l2, rel_l2_bound=l2_bound,
        nonfinite_expected=int(r_nf.sum()), nonfinite_got=int(c_nf.sum()), first_nonfinite_diff=first_nf,
    )


def _unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    idx = []
    for dim in reversed(shape):
        idx.append(flat % dim if dim else 0)
        flat //= dim if dim else 1
    return tuple(reversed(idx))
