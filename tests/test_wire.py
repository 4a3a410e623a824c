"""The child-to-parent codec: round trips, and forged messages refused without ever unpickling anything."""
import json
import mmap
import pickle
import struct

import pytest
import torch

from sandbox import wire

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (7, 13), (3, 1, 5)])
def test_round_trip_through_the_socket_payload(dtype, shape):
    t = (torch.randn(shape) * 10).to(dtype)
    msg = {"ok": True, "outputs": [t, t.t() if t.dim() == 2 else t], "x": float("nan"), "n": [1, "a", None]}
    back = wire.decode(wire.encode(msg))
    assert back["ok"] is True and back["n"] == [1, "a", None] and back["x"] != back["x"]
    for got, want in zip(back["outputs"], msg["outputs"]):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want.contiguous())


def test_large_tensors_go_through_the_shared_buffer():
    shared = mmap.mmap(-1, 1 << 22)
    big = torch.randn(512, 512)  # 1 MiB
    small = torch.randn(3)
    data = wire.encode({"outputs": [big, small]}, shared)
    assert len(data) < 4096  # the big one is not in the socket payload
    back = wire.decode(data, shared)
    assert torch.equal(back["outputs"][0], big) and torch.equal(back["outputs"][1], small)
    shared[:8] = b"\xff" * 8  # the child writing again later does not change what the parent holds
    assert torch.equal(back["outputs"][0], big)


def _forge(body, sizes=(), buffers=b""):
    header = json.dumps({"body": body, "sizes": list(sizes)}).encode()
    return struct.pack("<Q", len(header)) + header + buffers


@pytest.mark.parametrize("data", [
    b"",
    pickle.dumps({"ok": True}),
    struct.pack("<Q", 10**9) + b"{}",
    _forge({"__tensor__": 0, "dtype": "torch.float32", "shape": [4]}, [8], b"\0" * 8),      # size mismatch
    _forge({"__tensor__": 3, "dtype": "torch.float32", "shape": [1]}, [4], b"\0" * 4),      # no such buffer
    _forge({"__tensor__": 0, "dtype": "builtins.eval", "shape": [1]}, [4], b"\0" * 4),      # dtype not allowed
    _forge({"__tensor__": 0, "dtype": "torch.float32", "shape": [-1]}, [4], b"\0" * 4),     # negative size
    _forge({"x": 1}, [100], b"\0" * 4),                                                       # sizes past the end
])
def test_forged_messages_are_refused(data):
    with pytest.raises(wire.WireError):
        wire.decode(data)


def test_shared_descriptors_outside_the_buffer_are_refused():
    shared = mmap.mmap(-1, 1 << 16)
    for desc in ({"__shared__": (1 << 16) - 4, "dtype": "torch.float32", "shape": [4]},
                 {"__shared__": -8, "dtype": "torch.float32", "shape": [1]},
                 {"__shared__": 0, "dtype": "torch.float32", "shape": [1]}):
        with pytest.raises(wire.WireError):
            wire.decode(_forge(desc), None if desc["shape"] == [1] and desc["__shared__"] == 0 else shared)
