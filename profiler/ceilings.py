"""The device's ceilings, measured once and cached: copy bandwidth and matmul rate per dtype.

Measured, not taken from a datasheet (METHOD.md): a device-to-device copy of 1 GiB counting bytes read + written,
and an 8192^3 matmul through torch (cuBLAS) on random data in bf16, fp16, fp32 (true fp32, tf32 off) and tf32,
each the median of several timed runs after warm-up. Cached as JSON in $CRUCIBLE_CACHE or ~/.cache/crucible/,
keyed by GPU name + driver + torch version, so a new driver or torch measures again.
"""
from __future__ import annotations

import json
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from .env import device_key, environment

log = logging.getLogger(__name__)

CACHE_FILE = "ceilings.json"
MATMUL_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}


def cache_dir() -> Path:
    return Path(os.environ.get("CRUCIBLE_CACHE") or Path.home() / ".cache" / "crucible")


def _time_ms(fn, reps: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return out


def measure_copy_gbps(device: int, nbytes: int = 1 << 30, reps: int = 20, warmup: int = 3) -> float:
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = statistics.median(_time_ms(lambda: dst.copy_(src), reps, warmup))
    return 2 * nbytes / (ms * 1e-3) / 1e9


def measure_matmul_tflops(device: int, dtype_key: str, n: int = 8192, reps: int = 10, warmup: int = 3) -> float:
    dtype = MATMUL_DTYPES[dtype_key]
    gen = torch.Generator(device=f"cuda:{device}").manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    c = torch.empty(n, n, device=device, dtype=dtype)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype_key == "tf32"
    try:
        ms = statistics.median(_time_ms(lambda: torch.mm(a, b, out=c), reps, warmup))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def measure_ceilings(device: int = 0) -> dict[str, Any]:
    """Measure now (about a second of device time on an H200)."""
    with torch.cuda.device(device):
        env = environment(device)
        t0 = time.time()
        copy_gbps = measure_copy_gbps(device)
        matmul = {k: measure_matmul_tflops(device, k) for k in MATMUL_DTYPES}
        torch.cuda.empty_cache()
    return {
        "key": device_key(env),
        "gpu": (env.get("gpu") or {}).get("name"),
        "driver": env.get("driver"),
        "torch": env.get("torch"),
        "copy_gbps": copy_gbps,
        "matmul_tflops": matmul,
        "method": "median of 20 device-to-device copies of 1 GiB (bytes read + written); median of 10 torch.mm "
                  "8192^3 on random data per dtype, tf32 off except for 'tf32'; CUDA events",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t0)),
    }


def _read_cache() -> dict[str, Any]:
    path = cache_dir() / CACHE_FILE
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def cached_ceilings(device: int = 0) -> dict[str, Any] | None:
    return _read_cache().get(device_key(environment(device)))


def get_ceilings(device: int = 0, *, refresh: bool = False) -> dict[str, Any]:
    """The cached ceilings for this device, GPU+driver+torch, measuring and caching them when absent."""
    if not refresh:
        hit = cached_ceilings(device)
        if hit:
            return {**hit, "cached": True}
    ceil = measure_ceilings(device)
    data = _read_cache()
    data[ceil["key"]] = ceil
    path = cache_dir() / CACHE_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        tmp.replace(path)
    except OSError as exc:
        log.warning("could not cache the ceilings in %s: %s", path, exc)
    return {**ceil, "cached": False}
