"""A codec for messages from the candidate's process to the trusted parent, safe to decode.

The child runs untrusted code, so anything it sends may be forged: the parent never unpickles it. A message is
JSON (dicts, lists, strings, numbers, booleans, None) plus raw tensor buffers described by an allow-listed dtype
and a shape; decoding builds tensors with torch.frombuffer and nothing else.
Layout: 8-byte header length | JSON header | buffers back to back. Large tensors may instead be written into a
shared memory buffer (a memfd the parent made, mapped by both): the header then holds their offset, and the parent
copies them out after checking that offset and size lie inside the buffer.
"""
from __future__ import annotations

import json
import struct
import warnings
from typing import Any

import torch

_DTYPES = {str(d): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
)}
MAX_MESSAGE = 1 << 36  # 64 GiB: far above any output; a guard against a forged length
SHARED_MIN_BYTES = 1 << 16  # tensors at least this large travel through the shared buffer, when there is one


class WireError(ValueError):
    pass


def encode(obj: Any, shared: Any = None) -> bytes:
    """`shared`: a writable buffer (mmap) for tensors of SHARED_MIN_BYTES or more, filled from offset 0."""
    buffers: list[bytes] = []
    shared_used = 0

    def walk(x: Any) -> Any:
        nonlocal shared_used
        if isinstance(x, torch.Tensor):
            if str(x.dtype) not in _DTYPES:
                raise WireError(f"dtype {x.dtype} cannot cross the sandbox boundary")
            nbytes = x.numel() * x.element_size()
            if shared is not None and nbytes >= SHARED_MIN_BYTES and shared_used + nbytes <= len(shared):
                dst = torch.frombuffer(shared, dtype=torch.uint8, count=nbytes, offset=shared_used)
                dst.copy_(x.detach().contiguous().reshape(-1).view(torch.uint8))  # device to host, once
                shared_used += nbytes
                return {"__shared__": shared_used - nbytes, "dtype": str(x.dtype), "shape": list(x.shape)}
            t = x.detach().to("cpu").contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            buffers.append(raw)
            return {"__tensor__": len(buffers) - 1, "dtype": str(t.dtype), "shape": list(t.shape)}
        if isinstance(x, dict):
            return {str(k): walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v) for v in x]
        if isinstance(x, float) and x != x:
            return {"__float__": "nan"}
        if isinstance(x, float) and x in (float("inf"), float("-inf")):
            return {"__float__": "inf" if x > 0 else "-inf"}
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        return repr(x)

    header = json.dumps({"body": walk(obj), "sizes": [len(b) for b in buffers]}).encode()
    return struct.pack("<Q", len(header)) + header + b"".join(buffers)


def decode(data: bytes, shared: Any = None) -> Any:
    if len(data) < 8:
        raise WireError("message too short")
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > len(data) - 8:
        raise WireError("header length exceeds message")
    try:
        header = json.loads(data[8:8 + hlen])
        sizes = [int(s) for s in header["sizes"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"malformed header: {exc}") from None
    offsets, pos = [], 8 + hlen
    for s in sizes:
        if s < 0 or pos + s > len(data):
            raise WireError("buffer sizes exceed message")
        offsets.append((pos, s))
        pos += s
    view = memoryview(data)

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            if "__shared__" in x:
                return _from_shared(x, shared)
            if "__tensor__" in x:
                dtype = _DTYPES.get(x.get("dtype"))
                shape = x.get("shape")
                idx = x.get("__tensor__")
                if dtype is None or not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape) \
                        or not isinstance(idx, int) or not 0 <= idx < len(offsets):
                    raise WireError("malformed tensor descriptor")
                start, size = offsets[idx]
                numel = 1
                for s in shape:
                    numel *= s
                itemsize = torch.empty((), dtype=dtype).element_size()
                if numel * itemsize != size:
                    raise WireError("tensor buffer size does not match its shape")
                if numel == 0:
                    return torch.empty(shape, dtype=dtype)
                raw = torch.frombuffer(bytearray(view[start:start + size]), dtype=torch.uint8)
                return raw.view(dtype).reshape(shape)
            if "__float__" in x:
                return float(x["__float__"])
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return walk(header["body"])


def _from_shared(x: dict[str, Any], shared: Any) -> torch.Tensor:
    dtype, shape, offset = _DTYPES.get(x.get("dtype")), x.get("shape"), x.get("__shared__")
    if shared is None or dtype is None or not isinstance(offset, int) or not isinstance(shape, list) \
            or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise WireError("malformed shared tensor descriptor")
    numel = 1
    for s in shape:
        numel *= s
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if offset < 0 or offset + nbytes > len(shared):
        raise WireError("shared tensor lies outside the shared buffer")
    # A copy of our own: the child can still write into the shared buffer. (The parent's mapping is read-only, which
    # torch.frombuffer warns about; nothing writes through this view.)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(shared, dtype=torch.uint8, count=nbytes, offset=offset).clone()
    return raw.view(dtype).reshape(shape)
