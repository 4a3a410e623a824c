"""Length-prefixed messages over a socket descriptor, with os.read/os.write (no audit events, no pickling from the
untrusted side: the parent decodes what the child sends with sandbox.wire only).

The parent's side never blocks without a deadline: its socket is non-blocking, every read and write waits in
select() slices of at most WATCH_SLICE_S, and between slices a `watch` callback may raise (the harness checks there
that the candidate's process and the zygote are still running and not stopped)."""
from __future__ import annotations

import os
import pickle
import select
import struct
import time
from typing import Any, Callable, Union

from . import wire


class ChannelClosed(EOFError):
    pass


class ChannelTimeout(TimeoutError):
    pass


WATCH_SLICE_S = 0.2
Watch = Callable[[], None]
# A deadline is a time.monotonic() value, or a callable that gives one each time it is asked (the harness's
# sandbox.deadlines.Deadline, which signs of compilation may move later).
When = Union[float, Callable[[], float]]


def _end(deadline: When) -> float:
    return deadline() if callable(deadline) else deadline


def write_frame(fd: int, payload: bytes, deadline: When | None = None, watch: Watch | None = None) -> None:
    """With a deadline the descriptor may be non-blocking: the write waits for room in slices, so a peer that stops
    reading (stopped, wedged) ends in ChannelTimeout, not a hung parent."""
    data = struct.pack("<Q", len(payload)) + payload
    view = memoryview(data)
    while view:
        if deadline is not None:
            _wait(fd, deadline, watch, write=True)
        try:
            n = os.write(fd, view[: 1 << 24])
        except (BlockingIOError, InterruptedError):
            continue
        view = view[n:]


def read_frame(fd: int, deadline: When | None = None, max_bytes: int = wire.MAX_MESSAGE,
               watch: Watch | None = None) -> bytes:
    head = _read_exact(fd, 8, deadline, watch)
    (length,) = struct.unpack("<Q", head)
    if length > max_bytes:
        raise wire.WireError(f"message of {length} bytes exceeds the limit of {max_bytes}")
    return _read_exact(fd, length, deadline, watch)


def _wait(fd: int, deadline: When, watch: Watch | None, write: bool = False) -> None:
    """Until `fd` is ready; ChannelTimeout past the deadline; `watch()` between slices of WATCH_SLICE_S."""
    while True:
        remaining = _end(deadline) - time.monotonic()
        if remaining <= 0:
            raise ChannelTimeout()
        r, w = ([], [fd]) if write else ([fd], [])
        ready = select.select(r, w, [], min(remaining, WATCH_SLICE_S))
        if ready[0] or ready[1]:
            return
        if watch is not None:
            watch()


def _read_exact(fd: int, n: int, deadline: When | None, watch: Watch | None = None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            _wait(fd, deadline, watch)
        try:
            chunk = os.read(fd, min(n - got, 1 << 24))
        except (BlockingIOError, InterruptedError):
            continue
        except ConnectionResetError:
            raise ChannelClosed() from None
        if not chunk:
            raise ChannelClosed()
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# Parent → child: the parent is trusted, so the child may unpickle what it sends.
def send_to_child(fd: int, msg: dict[str, Any], deadline: When | None = None, watch: Watch | None = None) -> None:
    write_frame(fd, pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL), deadline, watch)


def recv_from_parent(fd: int) -> dict[str, Any]:
    return pickle.loads(read_frame(fd))


# Child → parent: never unpickled.
def send_to_parent(fd: int, msg: dict[str, Any], shared: Any = None) -> None:
    write_frame(fd, wire.encode(msg, shared))


def recv_from_child(fd: int, deadline: When | None, max_bytes: int = wire.MAX_MESSAGE, shared: Any = None,
                    watch: Watch | None = None) -> Any:
    return wire.decode(read_frame(fd, deadline, max_bytes, watch), shared)
