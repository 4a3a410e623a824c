"""Why a kernel is slow: per compiled Triton kernel, registers, spills, shared memory, warps and stages.

Read from the JIT's own cache of compiled kernels, so it costs nothing and needs no profiler:
`JITFunction.device_caches[device]` is a tuple whose first dicts map a specialisation key to a `CompiledKernel`
(triton 3.x; older versions kept `JITFunction.cache[device]`). A `CompiledKernel` carries `n_regs` and `n_spills`
once loaded on a device, and `metadata.shared`, `metadata.num_warps`, `metadata.num_stages`. Under the CPU
interpreter nothing is compiled, and the answer is an empty list.

`ncu_metrics(cmd)` runs a command under Nsight Compute (`--clock-control none`: the card's clocks are left alone)
when `ncu` is on PATH, and returns per kernel the memory throughput, achieved occupancy and top stall reasons.
"""
from __future__ import annotations

import csv
import io
import logging
import re
import shutil
import subprocess
import types
from dataclasses import asdict, dataclass
from typing import Any, Iterable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelStats:
    name: str  # the @triton.jit function's name
    kernel: str  # the compiled kernel's (mangled) name
    registers: int | None  # per thread
    spills: int | None
    shared_bytes: int | None
    num_warps: int | None
    num_stages: int | None
    constants: dict[str, Any]  # the constexpr values of this specialisation, where Triton records them

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        parts = [f"{self.name}: {self.registers} registers/thread", f"{self.spills} spills",
                 f"{self.shared_bytes} B shared", f"num_warps={self.num_warps}", f"num_stages={self.num_stages}"]
        if self.constants:
            parts.append(", ".join(f"{k}={v}" for k, v in sorted(self.constants.items())))
        return ", ".join(parts)


def _unwrap(obj: Any) -> Any:
    """Autotuner and Heuristics wrap a JITFunction in `.fn` (possibly several deep)."""
    for _ in range(8):
        if _is_jit(obj) or not hasattr(obj, "fn"):
            break
        obj = obj.fn
    return obj


def _is_jit(obj: Any) -> bool:
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    return isinstance(obj, JITFunction)


def jit_functions(namespace: Any) -> list[Any]:
    """The Triton JIT functions a module (or dict, or iterable of objects) defines, unwrapped from autotuners."""
    if isinstance(namespace, types.ModuleType):
        objs: Iterable[Any] = vars(namespace).values()
    elif isinstance(namespace, dict):
        objs = namespace.values()
    else:
        objs = namespace
    out, seen = [], set()
    for obj in objs:
        fn = _unwrap(obj)
        if _is_jit(fn) and id(fn) not in seen:
            seen.add(id(fn))
            out.append(fn)
    return out


def _compiled(jit_fn: Any) -> list[Any]:
    kernels = []
    caches = getattr(jit_fn, "device_caches", None)
    if caches:
        for entry in list(caches.values()):
            parts = entry if isinstance(entry, tuple) else (entry,)
            for part in parts:
                if isinstance(part, dict):
                    kernels += [k for k in part.values() if hasattr(k, "metadata")]
    old = getattr(jit_fn, "cache", None)  # triton < 3.2: {device: {key: CompiledKernel}}
    if isinstance(old, dict):
        for per_device in old.values():
            if isinstance(per_device, dict):
                kernels += [k for k in per_device.values() if hasattr(k, "metadata")]
    return kernels


def _constants(meta: Any) -> dict[str, Any]:
    consts = getattr(meta, "constants", None)
    if not isinstance(consts, dict):
        return {}
    out = {}
    for k, v in consts.items():
        if isinstance(v, (int, float, bool, str)):
            out[str(k[0] if isinstance(k, tuple) and len(k) == 1 else k)] = v
    return out


def kernel_stats(namespace: Any) -> list[KernelStats]:
    """Stats of every compiled specialisation of the JIT functions in `namespace` (a module, dict or iterable)."""
    stats = []
    for fn in jit_functions(namespace):
        fname = getattr(getattr(fn, "fn", None), "__name__", None) or repr(fn)
        for k in _compiled(fn):
            meta = k.metadata
            regs = getattr(k, "n_regs", None)
            spills = getattr(k, "n_spills", None)
            if regs is None and getattr(k, "module", None) is None and hasattr(k, "_init_handles"):
                try:  # loaded lazily; loading needs the device, which the launch already initialised
                    k._init_handles()
                    regs, spills = getattr(k, "n_regs", None), getattr(k, "n_spills", None)
                except Exception as exc:  # noqa: BLE001 - stats are advisory
                    log.info("could not load %s to read its registers: %s", fname, exc)
            stats.append(KernelStats(
                name=fname, kernel=str(getattr(k, "name", getattr(meta, "name", fname))),
                registers=None if regs is None else int(regs), spills=None if spills is None else int(spills),
                shared_bytes=getattr(meta, "shared", None), num_warps=getattr(meta, "num_warps", None),
                num_stages=getattr(meta, "num_stages", None), constants=_constants(meta)))
    return stats


# ---- Nsight Compute ------------------------------------------------------------------------------------------------
NCU_METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
)
_STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")


def ncu_available() -> bool:
    return shutil.which("ncu") is not None


def ncu_metrics(cmd: list[str], *, kernel_regex: str | None = None, launch_count: int = 20,
                timeout_s: float = 300.0) -> list[dict[str, Any]]:
    """Per profiled kernel: duration, DRAM throughput (% of peak), achieved occupancy and the top stall reasons.

    Raises RuntimeError with one sentence when ncu is missing or fails. The command is run under
    `ncu --clock-control none` (the card's clocks are left as found).
    """
    ncu = shutil.which("ncu")
    if not ncu:
        raise RuntimeError("ncu (Nsight Compute) is not on PATH")
    args = [ncu, "--clock-control", "none", "--csv", "--page", "raw", "--launch-count", str(launch_count),
            "--section", "SpeedOfLight", "--section", "Occupancy", "--section", "WarpStateStats",
            "--metrics", ",".join(NCU_METRICS)]
    if kernel_regex:
        args += ["--kernel-name", f"regex:{kernel_regex}"]
    proc = subprocess.run(args + list(cmd), capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"ncu exited with {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return parse_ncu_csv(proc.stdout)


def parse_ncu_csv(text: str) -> list[dict[str, Any]]:
    """ncu --csv --page raw output (one header row, one units row, one row per kernel) to plain dicts."""
    start = text.find('"ID"')
    if start < 0:
        return []
    rows = list(csv.reader(io.StringIO(text[start:])))
    if len(rows) < 2:
        return []
    header, body = rows[0], rows[1:]
    if body and not (body[0] and body[0][0].strip().isdigit()):
        body = body[1:]  # the units row
    out = []
    for row in body:
        rec = dict(zip(header, row))

        def num(key: str) -> float | None:
            v = rec.get(key, "").replace(",", "")
            try:
                return float(v)
            except ValueError:
                return None

        stalls = []
        for key in header:
            m = _STALL.match(key)
            if m and num(key) is not None:
                stalls.append((m.group(1), num(key)))
        stalls.sort(key=lambda kv: -kv[1])
        out.append({
            "kernel": rec.get("Kernel Name", ""),
            "duration_ns": num("gpu__time_duration.sum"),
            "dram_throughput_pct": num("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            "achieved_occupancy_pct": num("sm__warps_active.avg.pct_of_peak_sustained_active"),
            "top_stalls": [{"reason": r, "warps_per_issue": v} for r, v in stalls[:3]],
        })
    return out
