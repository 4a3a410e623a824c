"""The environment fingerprint recorded with every measurement: which GPU, driver and software produced a number."""
from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import platform
import shutil
import subprocess
import sys
from typing import Any

import torch


@functools.cache
def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def driver_version() -> str | None:
    """The NVIDIA driver's version ("580.159.04") from nvidia-smi, else the CUDA version the driver supports.
    Asked once per process (the zygote asks before forking, so candidates' processes inherit the answer)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20, check=True).stdout.strip().splitlines()
            if out and out[0].strip():
                return out[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value:
            return f"CUDA {v.value // 1000}.{(v.value % 1000) // 10} driver"
    except (OSError, AttributeError):
        pass
    return None


def environment(device: int | None = None) -> dict[str, Any]:
    """GPU name and count, driver, CUDA, cuDNN, torch, triton, Liger and Python versions, as plain data."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "liger_kernel": _version("liger-kernel"),
        "cuda": torch.version.cuda,
        "cudnn": None,
        "gpu_count": 0,
        "gpu": None,
        "driver": None,
    }
    try:
        env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # noqa: BLE001 - cuDNN probing must never break a measurement
        pass
    if torch.cuda.is_available():
        index = torch.cuda.current_device() if device is None else device
        props = torch.cuda.get_device_properties(index)
        env["gpu_count"] = torch.cuda.device_count()
        env["gpu"] = {
            "index": index,
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory,
            "l2_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        }
        env["driver"] = driver_version()
    env["executable"] = sys.executable
    return env


def device_key(env: dict[str, Any]) -> str:
    """What a cached measurement of the device is valid for: GPU name + driver + torch version."""
    gpu = env.get("gpu") or {}
    return f"{gpu.get('name')}|driver {env.get('driver')}|torch {env.get('torch')}"
