"""Length-prefixed messages over a socket descriptor, with os.read/os.write (no audit events, no pickling from the
untrusted side: the parent decodes what the child sends with sandbox.wire only)."""
from __future__ import annotations

import os
import pickle
import select
import struct
import time
from typing import Any

from . import wire


class ChannelClosed(EOFError):
    pass


class ChannelTimeout(TimeoutError):
    pass


def write_frame(fd: int, payload: bytes) -> None:
    data = struct.pack("<Q", len(payload)) + payload
    view = memoryview(data)
    while view:
        n = os.write(fd, view[: 1 << 24])
        view = view[n:]


def read_frame(fd: int, deadline: float | None = None, max_bytes: int = wire.MAX_MESSAGE) -> bytes:
    head = _read_exact(fd, 8, deadline)
    (length,) = struct.unpack("<Q", head)
    if length > max_bytes:
        raise wire.WireError(f"message of {length} bytes exceeds the limit of {max_bytes}")
    return _read_exact(fd, length, deadline)


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChannelTimeout()
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                raise ChannelTimeout()
        chunk = os.read(fd, min(n - got, 1 << 24))
        if not chunk:
            raise ChannelClosed()
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# Parent → child: the parent is trusted, so the child may unpickle what it sends.
def send_to_child(fd: int, msg: dict[str, Any]) -> None:
    write_frame(fd, pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def recv_from_parent(fd: int) -> dict[str, Any]:
    return pickle.loads(read_frame(fd))


# Child → parent: never unpickled.
def send_to_parent(fd: int, msg: dict[str, Any], shared: Any = None) -> None:
    write_frame(fd, wire.encode(msg, shared))


def recv_from_child(fd: int, deadline: float | None, max_bytes: int = wire.MAX_MESSAGE, shared: Any = None) -> Any:
    return wire.decode(read_frame(fd, deadline, max_bytes), shared)
