"""The one tolerance module: how close a candidate's output must be, per dtype, and the comparison itself.

A candidate output `c` is compared with two references computed in the trusted parent:
  t  the "truth": the reference model run in float64 on upcast inputs (when it can run in float64),
  r  the reference model run as the task defines it (its own dtype): what PyTorch itself delivers.
It passes when all of these hold:
  1. NaN/Inf positions equal r's (a candidate may be finite where r overflowed only if t is finite there too
     and c is close to t); where t lies past twice the output dtype's largest value (a mask filled with float64's
     smallest in the truth and float16's in the reference), c must saturate with t's sign (the dtype's largest
     magnitude or Inf), and the element takes no part in rules 2 and 3, whose sums it would swamp (without a
     float64 truth, r stands in for t, and so do r's own elements at the dtype's largest magnitude);
  2. elementwise |c - t| <= atol * scale + rtol * |t| + max(K * max(|r - t|, RMS(r - t)), T * MAX(|r - t|)),
     where scale is the RMS of t: the absolute slack is relative to the output's magnitude, so returning zeros for
     a small-valued output fails; and no element need be closer to the truth than T times PyTorch's worst one
     (the reference's, or an alternate's where the task names some: below). An honest kernel's rounding errors
     have a tail as PyTorch's do, only at other elements (of 67M attention
     outputs one or two of a tuned variant's lay past 4x PyTorch's RMS error, rejecting 78 of 87 variants on the
     H200), and the larger of two such tails' maxima is a coin toss: held to PyTorch's worst itself (T = 1),
     5 of 7 variants of the attention seed were still rejected for 1 to 7 elements. T = 2 leaves room for a tail
     somewhat wider than PyTorch's, still tighter than the bulk's K = 4 of rule 3;
  3. relative L2 error ||c - t|| / ||t|| <= max(l2 floor of the dtype, K * that of r): at most a few times
     PyTorch's own error, never looser than the dtype's floor. The float32 floor is tight enough that a
     tf32 matmul (≈3e-4 at large K) fails unless the task declares tf32 allowed.
A task may name other honest implementations of its op that PyTorch ships (`crucible_references`, sandbox/task.py:
SDPA's FlashAttention-2 backend beside the cuDNN one SDPA picks on a Hopper GPU). Their outputs `a` join r in the
"PyTorch's own error" terms: |r - t| becomes max(|r - t|, |a - t|) elementwise, RMS and relative L2 errors the
largest of them, and MAX(|r - t|) the largest element's error of any of them. So a candidate is held to the least
accurate of PyTorch's own kernels for the op, not to the luck of the one the reference happened to run (on the H200
8 of 15 attention variants were rejected for 1 to 5 of o's 67M elements off where cuDNN and FlashAttention-2 both
happened to be close, while each reference's tail lies elsewhere). NaN/Inf positions still follow r.
Integer and boolean outputs must be equal exactly.
The comparison walks the output CHUNK elements at a time on its own device, in float32 for 16-bit outputs and
float64 otherwise, with the sums kept on the device: one synchronisation a pass (a full-size check compares a dozen
outputs of 100M+ elements, and it holds the GPU's shared gate while it does). On a GPU each pass's sums come from one
Triton kernel over the whole output (sandbox/tolerance_fused.py), reduced here to the same per-chunk rows.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch

from .records import Mismatch

log = logging.getLogger(__name__)

REF_FACTOR = 4.0  # "at most a few times PyTorch's own error"
TAIL_FACTOR = 2.0  # T of rule 2: how much further than PyTorch's worst element any element may lie
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
            allow_tf32: bool = False, scale: float = 1.0, alternates: tuple[torch.Tensor, ...] = (),
            fused: bool | None = None) -> Mismatch | None:
    """None when `got` passes against the reference `ref` (and float64 `truth`, if any); else a report.
    `alternates`: the same output from other honest PyTorch implementations (module docstring); ignored without
    a truth or where a shape differs. `fused`: the passes' sums by sandbox/tolerance_fused.py's kernels where the
    tensors allow them on a GPU (None), also on the CPU through Triton's interpreter (True: the tests), or never
    (False)."""
    if got.shape != ref.shape:
        raise ValueError(f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)} (check shapes before compare)")
    if not (ref.is_floating_point() or ref.is_complex()):
        return _compare_exact(name, got, ref)

    tol = tolerance_for(ref.dtype, allow_tf32=allow_tf32, scale=scale)
    alternates = tuple(a for a in alternates if truth is not None and a.shape == ref.shape)
    chunks = _Chunks(got, ref, truth, alternates)
    if fused is not False and got.numel():
        from . import tolerance_fused
        chunks.fused = CHUNK % tolerance_fused.BLOCK == 0 and \
            tolerance_fused.usable(got, ref, chunks.truth, alternates, interpret=bool(fused))
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
    l2_failed = not rel_l2 <= l2_bound  # NaN (sums of squares past float64's range) fails
    n_out, worst_flat, max_abs = _elementwise(chunks, tol, scale_t, ref_rms, g.ref_max, l2_failed=l2_failed)

    if g.n_nf_bad == 0 and n_out == 0 and not l2_failed:
        return None

    # The report: the worst element by error over bound, in the full tensor's coordinates.
    if (n_out or l2_failed) and worst_flat is not None:
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
        note=SATURATE_NOTE if g.first_nf is not None and abs(chunks.value("truth", g.first_nf)) > chunks.beyond
        else "",
    )


SATURATE_NOTE = ("the first differing position's true value lies past the output dtype's range (e.g. a mask filled "
                 "with float64's smallest value): the output must saturate there, its dtype's largest magnitude or "
                 "Inf, with the true value's sign")


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
    ref_max: float = 0.0  # the largest error at one element of the reference's and the alternates' outputs


def _global_terms(chunks: _Chunks, n_alternates: int) -> _GlobalTerms:
    """Pass 1, the global terms: non-finite disagreements, and the sums behind the RMS and L2 norms. The sums stay on
    the device until the last chunk (one synchronisation a pass, not several a chunk); non-finite elements are
    zeroed in place of being selected out (no data-dependent copies)."""
    per_chunk = chunks.fused_rows(1, max_column=6) if chunks.fused else None
    if per_chunk is None:
        sums: list[torch.Tensor] = []  # per chunk: nf_bad, c_nf, r_nf, n_fin, t2, err2, ref_max, ref_err2[...]
        for start, c, r, t, alts, beyond in chunks:
            c_nf, r_nf, t_nf = ~torch.isfinite(c), ~torch.isfinite(r), ~torch.isfinite(t)
            nf_bad = _misplaced(c, r, t, beyond, chunks.limit)
            finite = ~(c_nf | r_nf | t_nf | beyond)
            tf = _zeroed(t, finite)
            terms = [nf_bad.sum(), c_nf.sum(), r_nf.sum(), finite.sum(), _sum2(tf), _sum2(_zeroed(c, finite) - tf)]
            ref_err = [_zeroed(x, finite) - tf for x in (r, *(_finite_or(a, t) for a in alts))]
            terms.append(torch.stack([d.abs().max() for d in ref_err]).max())  # a chunk is never empty
            terms += [_sum2(d) for d in ref_err]
            sums.append(torch.stack([x.to(torch.float64) for x in terms]))
        if not sums:
            return _GlobalTerms(ref_err2=[0.0] * (1 + n_alternates))
        per_chunk = torch.stack(sums).cpu()  # the one synchronisation of the pass
    total = per_chunk.sum(0).tolist()
    g = _GlobalTerms(n_nf_bad=int(total[0]), c_nf_count=int(total[1]), r_nf_count=int(total[2]), n_fin=int(total[3]),
                     t2=total[4], err2=total[5], ref_max=float(per_chunk[:, 6].max()), ref_err2=total[7:])
    if g.n_nf_bad:  # where the first disagreement lies: in the first chunk that has one, looked up there alone
        k = int((per_chunk[:, 0] > 0).nonzero()[0])
        start, c, r, t, _, beyond = chunks.chunk(k)
        g.first_nf = start + int(_misplaced(c, r, t, beyond, chunks.limit).nonzero()[0])
    return g


def _misplaced(c: torch.Tensor, r: torch.Tensor, t: torch.Tensor, beyond: torch.Tensor, limit: float) -> torch.Tensor:
    """Elements judged by position, not by distance (rule 1). Where the truth lies BEYOND the output dtype's range
    (past twice its largest value: e.g. a mask filled with float64's smallest in the truth, float16's in the
    reference), the candidate must saturate with the truth's sign (its dtype's largest magnitude, or Inf). Elsewhere
    NaN/Inf must agree with the reference's: where r is non-finite the candidate must agree with r exactly (same NaN,
    same signed Inf), unless the float64 truth is finite there and the candidate is finite too (it avoided an
    overflow r suffered; pass 2 then holds it to the truth)."""
    c_nf, r_nf, t_nf = ~torch.isfinite(c), ~torch.isfinite(r), ~torch.isfinite(t)
    same_nf = (c_nf == r_nf) & (torch.isnan(c) == torch.isnan(r)) & ((c == r) | torch.isnan(c) | ~c_nf)
    saturated = (torch.sign(c) == torch.sign(t)) & (c.abs() >= limit)
    return torch.where(beyond, ~saturated, ~(same_nf | (r_nf & ~t_nf & ~c_nf)))


def _elementwise(chunks: _Chunks, tol: Tolerance, scale_t: float, ref_rms: float, ref_max: float, *,
                 l2_failed: bool) -> tuple[int, int | None, float]:
    """Pass 2, elementwise: how many elements lie outside their bound, the flat index of the worst one by error over
    bound, and the largest absolute error. The counts stay on the device until the last chunk; the worst is looked
    for afterwards, only where it can be: in chunks with an element outside (its ratio exceeds 1, every other
    chunk's does not), or anywhere when the L2 bound already failed."""
    params = (tol.atol * max(scale_t, 1e-30), tol.rtol, ref_rms, ref_max, chunks.beyond)
    per_chunk = chunks.fused_rows(2, max_column=1, params=params) if chunks.fused else None
    if per_chunk is None:
        counts: list[torch.Tensor] = []
        for _, c, r, t, alts, beyond in chunks:
            _, err, bound = _err_bound(c, r, t, alts, beyond, tol, scale_t, ref_rms, ref_max)
            counts.append(torch.stack([(err > bound).sum().to(torch.float64), err.max().to(torch.float64)]))
        if not counts:
            return 0, None, 0.0
        per_chunk = torch.stack(counts).cpu()  # the one synchronisation of the pass
    n_out, max_abs = int(per_chunk[:, 0].sum()), float(per_chunk[:, 1].max())
    worst_ratio, worst_flat = -1.0, None
    for k in range(len(per_chunk)):
        if not (per_chunk[k, 0] > 0 or l2_failed):
            continue
        start, c, r, t, alts, beyond = chunks.chunk(k)
        finite, err, bound = _err_bound(c, r, t, alts, beyond, tol, scale_t, ref_rms, ref_max)
        ratio = torch.where(finite, err / bound, -1.0)  # a non-finite element is never the worst by error
        j = int(ratio.argmax())
        if float(ratio[j]) > worst_ratio:
            worst_ratio, worst_flat = float(ratio[j]), start + j
    return n_out, worst_flat, max_abs


def _err_bound(c: torch.Tensor, r: torch.Tensor, t: torch.Tensor, alts: list[torch.Tensor], beyond: torch.Tensor,
               tol: Tolerance, scale_t: float, ref_rms: float, ref_max: float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where candidate and truth are finite, and each element's error and its bound (rule 2 of the module
    docstring): 0 and a positive bound elsewhere (pass 1 judged those). Where the reference alone overflowed, the
    candidate is held to the truth with no error of the reference's to widen its bound. A truth beyond the output's
    range was judged by position (pass 1)."""
    finite = torch.isfinite(c) & torch.isfinite(t) & ~beyond
    tf = _zeroed(t, finite)
    err = (_zeroed(c, finite) - tf).abs()
    ref_err = _zeroed(r - t, finite & torch.isfinite(r)).abs()
    for a in alts:
        ref_err = torch.maximum(ref_err, (_zeroed(_finite_or(a, t), finite) - tf).abs())
    big = torch.finfo(t.dtype).max
    bound = _within(tol.atol * max(scale_t, 1e-30), big) + tol.rtol * tf.abs() + \
        (REF_FACTOR * ref_err.clamp_min(_within(ref_rms, big))).clamp_min(_within(TAIL_FACTOR * ref_max, big))
    return finite, err, bound


def _within(x: float, big: float) -> float:
    """A bound's scalar as the working precision holds it: past its largest value, infinite (as the kernels of
    sandbox/tolerance_fused.py cast it), not an error."""
    return math.inf if x > big else x


class _Chunks:
    """got, ref and truth (ref where there is none) flattened, on got's device in the working precision, CHUNK
    elements at a time: a 2 GB output never needs more than a few CHUNK-sized temporaries at once. The working
    precision is float64, or float32 for 16-bit outputs (whose bounds lie far above float32's rounding: a bf16
    element is compared to within 1% of its value, and float32 keeps the truth to 6e-8 of it) at half the bytes."""

    def __init__(self, got: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor | None,
                 alternates: tuple[torch.Tensor, ...] = ()):
        self.got, self.ref = got.detach().reshape(-1), ref.detach().reshape(-1)
        self.truth = truth.detach().reshape(-1) if truth is not None else self.ref
        self.alternates = tuple(a.detach().reshape(-1) for a in alternates)
        self.device = self.got.device
        self.dtype = torch.float32 if ref.dtype in (torch.float16, torch.bfloat16) else torch.float64
        self.limit = torch.finfo(ref.dtype).max if ref.is_floating_point() else math.inf  # the output's largest
        # A truth past this is judged by position (rule 1). Without a float64 truth, r stands in for it, and r's own
        # extremes (a mask filled with the dtype's smallest) are judged by position: counted as values they would
        # swell the output's RMS and norm, and with them the slack everywhere else.
        self.beyond = 2.0 * self.limit if truth is not None else self.limit * (1.0 - 2.0 ** -20)
        self.fused = False  # the passes' sums by sandbox/tolerance_fused.py's kernels (compare decides)

    def fused_rows(self, which: int, *, max_column: int, params: tuple[float, ...] = ()) -> torch.Tensor | None:
        """Pass `which`'s per-chunk rows, as the torch loop would stack them, from the kernels' per-block rows: each
        chunk's blocks summed, but for `max_column`, their largest (every term is >= 0, so a zero row pads). None where
        the kernels fail (then never tried again in this process)."""
        from . import tolerance_fused as tf
        try:
            if which == 1:
                rows = tf.pass1(self.got, self.ref, self.truth, self.alternates, self.dtype, self.beyond, self.limit)
            else:
                rows = tf.pass2(self.got, self.ref, self.truth, self.alternates, self.dtype, params, REF_FACTOR,
                                TAIL_FACTOR)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - a Triton that cannot build the kernels: the torch passes, logged
            log.warning("the comparison's kernels failed (%s: %s); the torch passes compare from now on",
                        type(exc).__name__, exc)
            tf.give_up(exc)
            self.fused = False
            return None
        per = CHUNK // tf.BLOCK
        n_chunks = -(-rows.shape[0] // per)
        padded = torch.zeros((n_chunks * per, rows.shape[1]), dtype=rows.dtype, device=rows.device)
        padded[:rows.shape[0]] = rows
        padded = padded.view(n_chunks, per, rows.shape[1])
        out = padded.sum(1)
        out[:, max_column] = padded[:, :, max_column].amax(1)
        return out.cpu()  # the one synchronisation of the pass

    def _work(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(device=self.device, dtype=self.dtype)

    def _work_truth(self, t: torch.Tensor) -> torch.Tensor:
        """The truth in the working precision, finite wherever it is finite: a float64 value past float32's range
        becomes float32's largest of its sign, not an infinity (which would excuse the candidate there)."""
        w = self._work(t)
        if t.dtype != torch.float64 or self.dtype == torch.float64:
            return w
        big = torch.finfo(self.dtype).max
        return torch.where(torch.isinf(w) & torch.isfinite(t.to(self.device)), torch.sign(w) * big, w)

    def __iter__(self):
        for k in range(-(-self.got.numel() // CHUNK)):
            yield self.chunk(k)

    def chunk(self, k: int) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """(start, got, ref, truth, alternates, beyond): the last where the truth lies past `self.beyond` (read from
        the truth as computed, before the working precision clamps it)."""
        start, end = k * CHUNK, (k + 1) * CHUNK
        beyond = self.truth[start:end].to(self.device, torch.float64).abs() > self.beyond
        return (start, self._work(self.got[start:end]), self._work(self.ref[start:end]),
                self._work_truth(self.truth[start:end]), [self._work(a[start:end]) for a in self.alternates], beyond)

    def value(self, which: str, flat: int) -> float:
        return float(getattr(self, which)[flat].to(torch.float64))


def _zeroed(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """x where `keep`, else 0 (a NaN or Inf elsewhere then adds nothing to a sum)."""
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _sum2(x: torch.Tensor) -> torch.Tensor:
    """The sum of squares, accumulated in float64 whatever x's precision."""
    return torch.linalg.vector_norm(x, dtype=torch.float64).square()


def _finite_or(a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """An alternate's values where finite, else the truth's: an alternate's overflow loosens nothing."""
    return torch.where(torch.isfinite(a), a, t)


def _unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    idx = []
    for dim in reversed(shape):
        idx.append(flat % dim if dim else 0)
        flat //= dim if dim else 1
    return tuple(reversed(idx))
