"""Writes a forged reply straight to the worker's socket from inside forward, then exits.

Writing to an inherited descriptor with os.write passes every runtime layer (no audit event, no system call a
filter refuses), so a candidate that got past the static stage can do this. FORGERY picks the forgery;
tests/test_parent_hardening.py writes variants of this file with other values. The parent must refuse every one
with a verdict and stay usable."""
import json
import os
import stat
import struct

import torch
import torch.nn as nn

FORGERY = "deep"


def _frame(header: bytes, buffers: bytes = b"") -> bytes:
    payload = struct.pack("<Q", len(header)) + header + buffers
    return struct.pack("<Q", len(payload)) + payload


def _forgery() -> bytes:
    trace = {"launches": 1, "kernels": ["_k"], "compute_ops": [], "foreign_kernels": []}
    ok = {"ok": True, "trace": trace, "seconds": 0.001, "strides": [[1]], "structure": "tensor", "violations": []}
    if FORGERY == "deep":  # json.loads would raise RecursionError
        return _frame(b'{"body": ' + b"[" * 200_000 + b"]" * 200_000 + b', "sizes": []}')
    if FORGERY == "wrong_type":  # a string where a boolean belongs, a dict where tensors belong
        return _frame(json.dumps({"body": {**ok, "ok": "yes", "outputs": {"a": 1}}, "sizes": []}).encode())
    if FORGERY == "unknown_reason":
        body = {"ok": False, "reason": "accepted", "message": "all good", "violations": []}
        return _frame(json.dumps({"body": body, "sizes": []}).encode())
    if FORGERY == "nan_seconds":  # a NaN literal, which JSON does not have
        return _frame(b'{"body": {"ok": true, "seconds": NaN}, "sizes": []}')
    if FORGERY == "huge":  # a header past the bound
        return _frame(json.dumps({"body": {"ok": False, "message": "x" * (20 << 20)}, "sizes": []}).encode())
    if FORGERY == "truncated":  # a frame that promises more than it holds
        return struct.pack("<Q", 1 << 20) + b"\0" * 100
    raise ValueError(FORGERY)


class ModelNew(nn.Module):
    def forward(self, x):
        data = _forgery()
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                if stat.S_ISSOCK(os.fstat(fd).st_mode):
                    os.set_blocking(fd, True)
                    os.write(fd, data)
            except OSError:
                pass
        os._exit(0)
        return x
