"""A codec for messages from the candidate's process to the trusted parent, safe to decode.

The child runs untrusted code, so anything it sends may be forged: the parent never unpickles it. A message is
JSON (dicts, lists, strings, numbers, booleans, None) plus raw tensor buffers described by an allow-listed dtype
and a shape; decoding builds tensors with torch.frombuffer and nothing else.
Layout: 8-byte header length | JSON header | buffers back to back. Large tensors may instead be written into a
shared memory buffer (a memfd the parent made, mapped by both): the header then holds their offset, and the parent
copies them out after checking that offset and size lie inside the buffer.
"""
from __future__ import annotations

import itertools
import json
import math
import re
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
# Bounds on the JSON header (tensors travel outside it): far above any honest reply, whose header holds a trace
# summary, an error's traceback (8 kB) or the timing stage's measurements (tens of kB).
MAX_HEADER = 16 << 20
MAX_DEPTH = 32
MAX_ELEMENTS = 1 << 20
MAX_DIMS = 16
_SPECIAL_FLOATS = ("nan", "inf", "-inf")
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


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
    """The message's body, with tensors rebuilt; WireError for anything malformed. The JSON header is bounded in size,
    nesting and element count before it is parsed (json.loads recurses: deep nesting raises RecursionError)."""
    if len(data) < 8:
        raise WireError("message too short")
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > len(data) - 8:
        raise WireError("header length exceeds message")
    if hlen > MAX_HEADER:
        raise WireError(f"header of {hlen} bytes exceeds the limit of {MAX_HEADER}")
    raw = bytes(data[8:8 + hlen])
    _check_shape(raw)
    try:
        header = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError, MemoryError, UnicodeDecodeError) as exc:
        raise WireError(f"malformed header: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(header, dict) or "body" not in header or not isinstance(header.get("sizes"), list):
        raise WireError("malformed header: it must hold a body and a list of buffer sizes")
    sizes = header["sizes"]
    if not all(type(s) is int for s in sizes):
        raise WireError("malformed header: buffer sizes must be integers")
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
                dtype, shape, idx = _DTYPES.get(x.get("dtype")), _shape(x.get("shape")), x.get("__tensor__")
                if dtype is None or shape is None or type(idx) is not int or not 0 <= idx < len(offsets):
                    raise WireError("malformed tensor descriptor")
                start, size = offsets[idx]
                numel = math.prod(shape)
                if numel * _itemsize(dtype) != size:
                    raise WireError("tensor buffer size does not match its shape")
                if numel == 0:
                    return torch.empty(shape, dtype=dtype)
                raw = torch.frombuffer(bytearray(view[start:start + size]), dtype=torch.uint8)
                return raw.view(dtype).reshape(shape)
            if "__float__" in x:
                if x.get("__float__") not in _SPECIAL_FLOATS or len(x) != 1:
                    raise WireError("malformed float marker")
                return float(x["__float__"])
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return walk(header["body"])


def _check_shape(header: bytes) -> None:
    """Refuse a header nested deeper than MAX_DEPTH or holding more than MAX_ELEMENTS values, before parsing it.
    Brackets and commas inside strings do not count: strings are cut out first."""
    skeleton = _STRINGS.sub(b"", header)
    if skeleton.count(b",") + skeleton.count(b":") > MAX_ELEMENTS:
        raise WireError(f"header holds more than {MAX_ELEMENTS} values")
    brackets = skeleton.translate(None, _NOT_BRACKETS)
    if len(brackets) > 2 * MAX_ELEMENTS:
        raise WireError(f"header holds more than {MAX_ELEMENTS} values")
    if brackets and max(itertools.accumulate(map(_STEP.__getitem__, brackets))) > MAX_DEPTH:
        raise WireError(f"header nests deeper than {MAX_DEPTH} levels")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (non-finite floats travel as markers)")


def _shape(shape: Any) -> list[int] | None:
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(type(s) is int and s >= 0 for s in shape):
        return None
    return shape


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _from_shared(x: dict[str, Any], shared: Any) -> torch.Tensor:
    dtype, shape, offset = _DTYPES.get(x.get("dtype")), _shape(x.get("shape")), x.get("__shared__")
    if shared is None or dtype is None or type(offset) is not int or shape is None:
        raise WireError("malformed shared tensor descriptor")
    nbytes = math.prod(shape) * _itemsize(dtype)
    if offset < 0 or offset + nbytes > len(shared):
        raise WireError("shared tensor lies outside the shared buffer")
    # A copy of our own: the child can still write into the shared buffer. (The parent's mapping is read-only, which
    # torch.frombuffer warns about; nothing writes through this view.)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(shared, dtype=torch.uint8, count=nbytes, offset=offset).clone()
    return raw.view(dtype).reshape(shape)
