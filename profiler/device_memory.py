"""The timer's device memory: its outputs (fingerprints, copies to the CPU, storages) and the caching allocator
around them (the held outputs' reserve, the baselines' private pools, NaN scrubbing before a free, private input
copies, a function's first call made apart, the flush buffer).

The allocator functions are captured when this module is imported, which profiler.timing does when it is imported
itself: before any candidate code, like the timer functions (profiler.timing's docstring).
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterable

import torch

_FILL = torch.Tensor.fill_
_MEMPOOL = getattr(torch.cuda, "MemPool", None)  # private allocator pools (torch >= 2.6)
_POOL_BEGIN = getattr(torch._C, "_cuda_beginAllocateCurrentThreadToPool", None)
_POOL_END = getattr(torch._C, "_cuda_endAllocateToPool", None)
_POOL_RELEASE = getattr(torch._C, "_cuda_releasePool", None)
RESERVE_SHARE = 0.25  # the most of the free device memory the held outputs' reserve may take (see reserve_outputs)


# ---- outputs -------------------------------------------------------------------------------------------------------
def tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in tensors(o)]
    return []


def fingerprint(out: Any) -> list[tuple[float, float]]:
    """Per output tensor: (float64 sum, float64 sum of squares). Deterministic for an unchanged tensor."""
    fp = []
    for t in tensors(out):
        x = t.detach()
        if x.is_complex():
            x = torch.view_as_real(x)
        if x.dtype == torch.bool:
            x = x.to(torch.uint8)
        x64 = x.to(torch.float64) if x.numel() <= (1 << 26) else None
        if x64 is None:  # big outputs: reduce chunk by chunk instead of materialising a float64 copy
            flat = x.reshape(-1)
            s = ss = 0.0
            for i in range(0, flat.numel(), 1 << 26):
                c = flat[i:i + (1 << 26)].to(torch.float64)
                s += float(c.sum())
                ss += float((c * c).sum())
        else:
            s, ss = float(x64.sum()), float((x64 * x64).sum())
        fp.append((s, ss))
    return fp


def same_fp(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    if len(a) != len(b):
        return False
    for (s1, q1), (s2, q2) in zip(a, b):
        for u, v in ((s1, s2), (q1, q2)):
            if not (u == v or (math.isnan(u) and math.isnan(v))):
                return False
    return True


def nbytes(out: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(out))


def to_cpu(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.detach().to("cpu", copy=True)
    if isinstance(out, (list, tuple)):
        return type(out)(to_cpu(o) for o in out) if isinstance(out, list) else tuple(to_cpu(o) for o in out)
    if isinstance(out, dict):
        return {k: to_cpu(v) for k, v in out.items()}
    return out


def storages(out: Any) -> list[int]:
    """Byte sizes of the distinct CUDA storages behind an output (views of one buffer count once)."""
    seen: dict[int, int] = {}
    for t in tensors(out):
        if t.is_cuda:
            st = t.untyped_storage()
            seen.setdefault(st.data_ptr(), st.nbytes())
    return [b for b in seen.values() if b]


# ---- the allocator -------------------------------------------------------------------------------------------------
def held_at_once(out_bytes: int, hold_bytes: int, timed_rounds: int, burst: int) -> int:
    """The most outputs of the watched function alive at once in the timed rounds: those the later re-check holds
    (within hold_bytes, at least one) plus a burst's own, never more than the timed calls; 0 without outputs."""
    if out_bytes <= 0:
        return 0
    return min(timed_rounds * burst, max(1, hold_bytes // out_bytes) + burst)


def reserve_outputs(sample: Any, copies: int, device: int, warnings: list[str]) -> int:
    """Grow the caching allocator (on the current stream) by `copies` blocks of each storage size of `sample` (an
    output of the watched function), poisoned with NaN (all-ones bytes), and by the fingerprint's working memory
    (one fingerprint of the sample while the blocks are taken), then free them all: the outputs measure holds, and
    their fingerprints, are carved from cached blocks instead of a cudaMalloc inside the timed call. Returns the
    bytes reserved; at most RESERVE_SHARE of the free device memory (the baselines' own pool and the candidate's
    working memory need the rest), and a reserve cut short says so in a warning (calls then allocate as before)."""
    sizes = storages(sample)
    per_copy = sum(sizes)
    if per_copy:
        free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - \
            torch.cuda.memory_allocated(device)
        affordable = int(free * RESERVE_SHARE) // per_copy
        if affordable < copies:
            warnings.append(f"reserved {affordable} of the {copies} output blocks the re-check may hold (at most "
                            f"{RESERVE_SHARE:.0%} of the free device memory): timed calls beyond them allocate device "
                            "memory inside their host time")
            copies = affordable
    blocks: list[torch.Tensor] = []
    try:
        for _ in range(copies):
            for size in sizes:
                blocks.append(torch.empty(size, dtype=torch.uint8, device=device))
        fingerprint(sample)
    except torch.cuda.OutOfMemoryError:
        warnings.append(f"could reserve only {len(blocks)} of {copies * len(sizes)} output blocks: timed calls "
                        "beyond them allocate device memory inside their host time")
    for b in blocks:
        _FILL(b, 255)
    reserved = sum(b.numel() for b in blocks)
    del blocks
    return reserved


def segments(device: int) -> int:
    """Device memory segments the caching allocator has allocated so far (each one a cudaMalloc)."""
    return int(torch.cuda.memory_stats(device).get("segment.all.allocated", 0))


def private_pools(names: Iterable[str]) -> dict[str, Any]:
    """A private allocator pool for each of `names`; none where this torch has no MemPool."""
    return {n: _MEMPOOL() for n in names} if _MEMPOOL is not None and _POOL_BEGIN is not None else {}


@contextlib.contextmanager
def pool_context(pool: Any, device: int):
    """This thread's device allocations come from `pool` inside (None: the default pool); torch's use_mem_pool,
    through the functions captured at import."""
    if pool is None:
        yield
        return
    _POOL_BEGIN(device, pool.id)
    try:
        yield
    finally:
        _POOL_END(device, pool.id)
        _POOL_RELEASE(device, pool.id)


def scrub(out: Any) -> None:
    """Every byte of the CUDA storages behind `out` set to 0xFF (NaN in every float format), before they are freed."""
    for t in tensors(out):
        if t.is_cuda and t.untyped_storage().nbytes():
            _FILL(torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()), 255)


def private_copy(input_set: list) -> list:
    """A copy of an input set's tensors, for a function that may write over its inputs."""
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in input_set]


def first_call(fn: Callable[[list], Any], input_set: list, device: int | None) -> str | None:
    """Call `fn` once, untimed, on a private copy of `input_set`, as measure calls an isolated function: from an
    allocator pool of its own (`device`, a CUDA index; None on the CPU: no pool), its results and its copy of the
    inputs set to NaN bytes before they are freed. What a function pays once in a process (cuDNN's plans, torch.compile
    compiling, autograd's threads) is then paid here, outside the measurement. Returns the error's line where `fn`
    raised (the measurement meets it again and reports it), else None."""
    pools = private_pools(["first"]) if device is not None else {}
    error = None
    with pool_context(pools.get("first"), device if device is not None else 0):
        args, out = private_copy(input_set), None
        try:
            out = fn(args)
            if device is not None:
                torch.cuda.synchronize(device)
        except Exception as exc:  # noqa: BLE001 - reported by the measurement that follows
            error = f"{type(exc).__name__}: {exc}"
        scrub(out)
        scrub(args)
        del out, args
    return error


def flush_buffer(nbytes: int, device: int) -> torch.Tensor:
    return torch.empty(nbytes // 4, dtype=torch.int32, device=device)
