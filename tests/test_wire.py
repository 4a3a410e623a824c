"""The child-to-parent codec: round trips, and forged messages refused without ever unpickling anything."""
import json
import mmap
import pickle
import struct

import pytest
import torch

from sandbox import replies, wire

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


# ---- bounds checked before parsing, and the reply schema (sandbox.replies) -------------------------------------
def _header(raw: bytes) -> bytes:
    return struct.pack("<Q", len(raw)) + raw


@pytest.mark.parametrize("name, data", [
    ("deep list", _header(b'{"body": ' + b"[" * 100_000 + b"]" * 100_000 + b', "sizes": []}')),
    ("deep object", _header(b'{"body": ' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b', "sizes": []}')),
    ("too many values", _header(b'{"body": [' + b"0," * (wire.MAX_ELEMENTS + 1) + b'0], "sizes": []}')),
    ("header past the bound", _header(json.dumps({"body": "x" * (wire.MAX_HEADER + 1), "sizes": []}).encode())),
    ("NaN literal", _header(b'{"body": {"seconds": NaN}, "sizes": []}')),
    ("Infinity literal", _header(b'{"body": {"seconds": -Infinity}, "sizes": []}')),
    ("a huge integer", _header(b'{"body": ' + b"9" * 100_000 + b', "sizes": []}')),
    ("not UTF-8", _header(b'{"body": "\xff\xfe", "sizes": []}')),
    ("header is a list", _header(b"[1, 2]")),
    ("no body", _header(b'{"sizes": []}')),
    ("sizes not a list", _header(b'{"body": 1, "sizes": 3}')),
    ("a negative size", _forge({"x": 1}, [-4], b"")),
    ("a float size", _header(b'{"body": 1, "sizes": [4.0]}') + b"\0" * 4),
    ("a bogus float marker", _forge({"__float__": "1e400"})),
    ("a float marker with company", _forge({"__float__": "nan", "x": 1})),
    ("a boolean shape", _forge({"__tensor__": 0, "dtype": "torch.uint8", "shape": [True]}, [1], b"\0")),
    ("too many dimensions", _forge({"__tensor__": 0, "dtype": "torch.uint8", "shape": [1] * 64}, [1], b"\0")),
    ("a boolean index", _forge({"__tensor__": True, "dtype": "torch.uint8", "shape": [1]}, [1], b"\0")),
    ("a truncated header", _header(b'{"body": [1, 2')[:-3]),
])
def test_malformed_headers_are_refused_before_anything_reads_them(name, data):
    with pytest.raises(wire.WireError):
        wire.decode(data)


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = "[" * 10_000 + '\\"{'
    assert wire.decode(_forge({"message": text}))["message"] == text


TRACE = {"launches": 1, "kernels": ["_k"], "compute_ops": [], "foreign_kernels": []}
GOOD_CALL = {"ok": True, "trace": TRACE, "seconds": 0.5, "outputs": [torch.ones(2)], "strides": [[1]],
             "structure": "tensor", "violations": []}


def test_an_honest_call_reply_validates_unchanged():
    checked = replies.validate("call", dict(GOOD_CALL))
    assert checked["trace"] == TRACE and checked["seconds"] == 0.5 and torch.equal(checked["outputs"][0], torch.ones(2))


@pytest.mark.parametrize("op, reply, says", [
    ("call", [], "must be an object"),
    ("call", {"trace": TRACE}, "lacks the field 'ok'"),
    ("call", {**GOOD_CALL, "ok": "yes"}, "ok must be true or false"),
    ("call", {**GOOD_CALL, "ok": 1}, "ok must be true or false"),
    ("call", {"ok": False}, "failure without a reason"),
    ("call", {"ok": False, "reason": "accepted"}, "reason is not one of the known values"),
    ("call", {"ok": False, "reason": "ok"}, "reason is not one of the known values"),
    ("call", {"ok": False, "reason": "crash", "message": 7}, "message must be a string"),
    ("call", {"ok": False, "reason": "crash", "error": {"type": "X", "stack": []}}, "unknown field"),
    ("call", {**GOOD_CALL, "seconds": float("nan")}, "seconds must be a finite number"),
    ("call", {**GOOD_CALL, "seconds": -1.0}, "seconds must be a finite number"),
    ("call", {**GOOD_CALL, "seconds": "0.1"}, "seconds must be a finite number"),
    ("call", {**GOOD_CALL, "outputs": [1.0]}, "outputs[0] must be a tensor"),
    ("call", {**GOOD_CALL, "outputs": {"a": torch.ones(1)}}, "outputs must be a list"),
    ("call", {**GOOD_CALL, "outputs": [{"__gpu_buffer__": "0"}]}, "GPU buffer marker"),
    ("call", {**GOOD_CALL, "strides": [["1"]]}, "strides[0][0] must be an integer"),
    ("call", {**GOOD_CALL, "strides": [[1], [1]]}, "one stride list per output"),
    ("call", {**GOOD_CALL, "structure": "dict"}, "structure is not one of the known values"),
    ("call", {**GOOD_CALL, "trace": {**TRACE, "launches": -1}}, "trace.launches must be an integer"),
    ("call", {**GOOD_CALL, "trace": {**TRACE, "kernels": "_k"}}, "trace.kernels must be a list"),
    ("call", {**GOOD_CALL, "trace": {"launches": 1}}, "trace lacks field"),
    ("call", {**GOOD_CALL, "trace": {**TRACE, "extra": {"a": 1}}}, "trace.extra must be a list"),
    ("call", {**GOOD_CALL, "verdict": "accepted"}, "unknown field"),
    ("call", {k: v for k, v in GOOD_CALL.items() if k != "outputs"}, "reports success without ['outputs']"),
    ("soak", {"ok": True, "outputs": [torch.ones(1)], "strides": [[1]], "structure": "tensor", "seconds": "1"},
     "seconds must be a finite number"),
    ("soak", {"ok": True, "outputs": [{"__gpu_buffer__": "0"}], "strides": [[1]], "structure": "tensor",
              "seconds": 1.0}, "GPU buffer marker"),
    ("soak", {"ok": True, "outputs": [1.0], "strides": [[1]], "structure": "tensor", "seconds": 1.0},
     "outputs[0] must be a tensor"),
    ("setup", {"ok": True, "laps": {"import_s": float("inf")}}, "laps.import_s must be a finite number"),
    ("setup", {"ok": True, "network_isolated": "true"}, "network_isolated must be true or false"),
    ("time", {"ok": True, "measured": {"fns": {}}, "n_sets": 0, "kernels": [], "environment": {}, "baselines": {}},
     "n_sets must be an integer"),
    ("time", {"ok": True, "measured": {"fns": {"candidate": {"ms": ["1"]}}}, "n_sets": 2, "kernels": [],
              "environment": {}, "baselines": {}}, "ms[0] must be a number"),
    ("time", {"ok": True, "measured": {"fns": {}, "samples": [{"call": 0, "input_set": 0, "outputs": [3]}]},
              "n_sets": 2, "kernels": [], "environment": {}, "baselines": {}}, "outputs[0] must be a tensor"),
])
def test_replies_that_do_not_fit_their_schema_are_refused(op, reply, says):
    with pytest.raises(replies.MalformedReply) as info:
        replies.validate(op, reply)
    assert says in str(info.value), str(info.value)


def test_fetched_samples_may_come_back_in_lent_buffers_but_timed_samples_may_not():
    marker = [{"call": 0, "input_set": 1, "outputs": [{"__gpu_buffer__": 0}, torch.ones(2)]}]
    assert replies.validate("samples", {"ok": True, "samples": marker})["samples"][0]["outputs"][0] == \
        {"__gpu_buffer__": 0}
    with pytest.raises(replies.MalformedReply):
        replies.validate("samples", {"ok": True, "samples": [{"call": 0, "input_set": 1, "outputs": [3]}]})
    with pytest.raises(replies.MalformedReply):  # during the measurement no buffer is lent
        replies.validate("time", {"ok": True, "measured": {"fns": {}, "samples": marker}, "n_sets": 2, "kernels": [],
                                  "environment": {}, "baselines": {}})


def test_long_texts_are_cut_not_refused():
    checked = replies.validate("call", {"ok": False, "reason": "runtime_error", "message": "x" * 100_000})
    assert checked["reason"] == "runtime_error" and len(checked["message"]) < 4100


def test_a_forged_reply_through_the_decoder_and_the_schema():
    """What the parent does with the bytes: decode (bounded), then validate; a forged 'accepted' never passes."""
    forged = _forge({"ok": True, "verdict": "accepted", "outputs": [], "strides": [], "structure": "tuple"})
    with pytest.raises(wire.WireError):
        replies.validate("call", wire.decode(forged))
