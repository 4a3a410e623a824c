"""The roofline: the least time an op can take on this device, and the gate that quarantines anything faster.

Bytes: the task's CRUCIBLE_BYTES formula when it declares one, else every input tensor and parameter read once and
every output written once (sizes taken from the tensors). FLOPs: the task's CRUCIBLE_FLOPS formula, else
torch.utils.flop_counter.FlopCounterMode on the reference (on the meta device when the reference allows it, so
counting costs no device time). With the device's measured ceilings (profiler.ceilings: copy bandwidth counting
bytes read + written, matmul TFLOP/s per dtype) that gives a floor time

    floor = max(bytes / copy bandwidth, flops / matmul rate)

and the bound that sets it. A measured time well under the floor is physically impossible: a cheat (persisting L2,
skipped work) or a harness fault. `gate` says so and the result is quarantined, never recorded (THREATS #22, #27).
The margins allow for the ceilings being measured by library kernels (a read-heavy kernel can beat a copy's
bandwidth a little: the H200's datasheet 4.8 TB/s is 1.13x the 4.24 TB/s copy measured there), never for 2x.
"""
from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

import torch

log = logging.getLogger(__name__)

MEMORY_MARGIN = 1.25   # achieved GB/s above copy bandwidth x this is impossible
COMPUTE_MARGIN = 1.35  # achieved TFLOP/s above the measured matmul rate x this is impossible
DTYPE_KEYS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def _nbytes(ts: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def tensor_bytes(inputs: Any, outputs: Any, model: torch.nn.Module | None = None) -> int:
    """Inputs and the model's parameters and buffers read once, outputs written once."""
    state = list(model.parameters()) + list(model.buffers()) if model is not None else []
    return _nbytes(_tensors(inputs)) + _nbytes(state) + _nbytes(_tensors(outputs))


def compute_dtype(inputs: Any, model: torch.nn.Module | None = None) -> str | None:
    """The matmul ceiling that applies: the dtype of the largest floating input (or parameter)."""
    ts = [t for t in _tensors(inputs) if t.is_floating_point()]
    if model is not None:
        ts += [p for p in model.parameters() if p.is_floating_point()]
    if not ts:
        return None
    return DTYPE_KEYS.get(max(ts, key=lambda t: t.numel()).dtype)


def _to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_to_meta(v) for v in x)
    return x


def _forward(model: torch.nn.Module, inputs: list[Any],
             make_counter: Callable[[], Any] = contextlib.nullcontext) -> tuple[Any, str, Any]:
    """(outputs, where, counter) of one forward of the reference, under a fresh `make_counter()` per attempt.

    Tried on meta copies first (no device time); a reference that cannot run on meta (one that reads a tensor's
    values, such as per-expert counts) runs on its own inputs. Grad is enabled: a backward task's reference calls
    autograd.grad in its forward.
    """
    attempts = []
    try:
        attempts.append(("meta", copy.deepcopy(model).to("meta"), _to_meta(list(inputs))))
    except Exception as exc:  # noqa: BLE001 - a model that cannot be copied to meta is run for real
        log.info("reference cannot move to meta (%s); running it on its own device", exc)
    attempts.append(("real", model, list(inputs)))
    last: Exception | None = None
    for where, m, args in attempts:
        try:
            counter = make_counter()
            with torch.enable_grad(), counter:
                return m(*args), where, counter
        except Exception as exc:  # noqa: BLE001 - fall through to the next attempt
            last = exc
    raise RuntimeError(f"could not run the reference: {type(last).__name__}: {last}")


def count_flops(model: torch.nn.Module, inputs: list[Any]) -> tuple[float, Any, str]:
    """(FLOPs, outputs, where counted) for one forward of `model` under FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        out, where, counter = _forward(model, inputs, lambda: FlopCounterMode(display=False))
    except RuntimeError as exc:
        raise RuntimeError(f"could not count the reference's FLOPs: {exc}") from None
    return float(counter.get_total_flops()), out, f"FlopCounterMode on the reference ({where})"


@dataclass(frozen=True)
class Roofline:
    bytes: int
    flops: float
    bytes_source: str
    flops_source: str
    copy_gbps: float | None  # measured ceilings this roofline uses
    peak_tflops: float | None
    peak_dtype: str | None
    memory_ms: float  # bytes at the copy bandwidth
    compute_ms: float  # flops at the matmul rate
    floor_ms: float
    bound: str  # "memory" | "compute" | "unknown" (no ceilings)

    def __post_init__(self) -> None:
        if self.bytes < 0 or self.flops < 0:
            raise ValueError("bytes and flops must be non-negative")
        if self.bound not in ("memory", "compute", "unknown"):
            raise ValueError(f"unknown bound {self.bound!r}")

    def at(self, ms: float) -> dict[str, Any]:
        """Achieved rates for a measured time, as the report's `roofline` dict."""
        if not ms > 0:
            raise ValueError(f"a measured time must be positive, got {ms}")
        s = ms * 1e-3
        return {
            "bytes": self.bytes, "flops": self.flops,
            "gbps": self.bytes / s / 1e9, "tflops": self.flops / s / 1e12,
            "pct_of_roofline": 100.0 * self.floor_ms / ms if self.floor_ms > 0 else None,
            "bound": self.bound, "floor_ms": self.floor_ms,
            "copy_gbps": self.copy_gbps, "peak_tflops": self.peak_tflops, "peak_dtype": self.peak_dtype,
            "bytes_source": self.bytes_source, "flops_source": self.flops_source,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def roofline(nbytes: float, flops: float, ceilings: dict[str, Any] | None, dtype: str | None, *,
             bytes_source: str = "", flops_source: str = "") -> Roofline:
    """The floor time from bytes and FLOPs over a ceilings dict (profiler.ceilings: copy_gbps, matmul_tflops)."""
    copy_gbps = float(ceilings["copy_gbps"]) if ceilings and ceilings.get("copy_gbps") else None
    rates = (ceilings or {}).get("matmul_tflops") or {}
    peak_dtype = dtype if dtype in rates else None  # fp64 or integer ops: no measured rate, no compute bound
    peak = float(rates[peak_dtype]) if peak_dtype else None
    memory_ms = nbytes / (copy_gbps * 1e9) * 1e3 if copy_gbps else 0.0
    compute_ms = flops / (peak * 1e12) * 1e3 if peak else 0.0
    if copy_gbps is None and peak is None:
        bound = "unknown"
    else:
        bound = "compute" if compute_ms > memory_ms else "memory"
    return Roofline(bytes=int(nbytes), flops=float(flops), bytes_source=bytes_source, flops_source=flops_source,
                    copy_gbps=copy_gbps, peak_tflops=peak, peak_dtype=peak_dtype, memory_ms=memory_ms,
                    compute_ms=compute_ms, floor_ms=max(memory_ms, compute_ms), bound=bound)


@dataclass(frozen=True)
class Declared:
    """What a task declares for its roofline at its current shapes (the caller reads it from the task): bytes and
    FLOPs from its own formulas (None: counted from the tensors and the reference), and whether its float32 matmuls
    may run as TF32."""
    bytes: float | None = None
    flops: float | None = None
    allow_tf32: bool = False


def task_roofline(declared: Declared, model: torch.nn.Module, inputs: list[Any],
                  ceilings: dict[str, Any] | None) -> Roofline:
    """The roofline of a task's reference `model` on `inputs`, from what the task declares or else by counting."""
    outputs = None
    if declared.flops is not None:
        flops, flops_source = declared.flops, "task formula (CRUCIBLE_FLOPS)"
    else:
        flops, outputs, flops_source = count_flops(model, inputs)
    if declared.bytes is not None:
        nbytes, bytes_source = declared.bytes, "task formula (CRUCIBLE_BYTES)"
    else:
        if outputs is None:
            outputs, _, _ = _forward(model, inputs)
        nbytes, bytes_source = tensor_bytes(inputs, outputs, model), "tensor sizes (inputs + parameters + outputs)"
    dtype = compute_dtype(inputs, model)
    if dtype == "fp32" and declared.allow_tf32:
        dtype = "tf32"
    return roofline(nbytes, flops, ceilings, dtype, bytes_source=bytes_source, flops_source=flops_source)


@dataclass(frozen=True)
class GateResult:
    ok: bool
    reason: str | None  # "faster_than_roofline" (sandbox.records.Reason's value) when not ok
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gate(ms: float, roof: Roofline, *, memory_margin: float = MEMORY_MARGIN,
         compute_margin: float = COMPUTE_MARGIN) -> GateResult:
    """Is `ms` physically possible on this device? Not: quarantine the result as a suspected cheat or harness fault."""
    if not ms > 0:
        return GateResult(False, "faster_than_roofline", f"a measured time of {ms} ms is not positive")
    s = ms * 1e-3
    if roof.copy_gbps and roof.bytes:
        gbps = roof.bytes / s / 1e9
        if gbps > roof.copy_gbps * memory_margin:
            return GateResult(False, "faster_than_roofline",
                              f"{ms:.4g} ms moves {roof.bytes:,} bytes at {gbps:,.0f} GB/s, over {memory_margin}x the "
                              f"device's measured copy bandwidth ({roof.copy_gbps:,.0f} GB/s): quarantined as a "
                              "suspected cheat or harness fault")
    if roof.peak_tflops and roof.flops:
        tflops = roof.flops / s / 1e12
        if tflops > roof.peak_tflops * compute_margin:
            return GateResult(False, "faster_than_roofline",
                              f"{ms:.4g} ms does {roof.flops:,.0f} FLOPs at {tflops:,.0f} TFLOP/s, over "
                              f"{compute_margin}x the device's measured {roof.peak_dtype} matmul rate "
                              f"({roof.peak_tflops:,.0f} TFLOP/s): quarantined as a suspected cheat or harness fault")
    return GateResult(True, None, "within the roofline")
