"""The parent's idle GPU cache (sandbox/stage_runners.return_cached): handed back to the driver where a candidate's
process would otherwise run out of room, kept where the GPU has room to spare (a driver free waits for the whole
device). The CUDA calls are stood in for, so this runs on the CPU."""
from contextlib import contextmanager

import torch

from sandbox import stage_runners
from sandbox.reference import Expected

GIB = 1 << 30


class _Run:
    device = "cuda:0"

    def __init__(self):
        self.laps = []

    @contextmanager
    def lap(self, name):
        self.laps.append(name)
        yield


def _gpu(monkeypatch, reserved, allocated, free):
    emptied = []
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 141 * GIB))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    return emptied


def test_a_large_idle_cache_goes_back_only_where_the_call_needs_the_room(monkeypatch):
    room = 6 * GIB
    emptied = _gpu(monkeypatch, reserved=136 * GIB, allocated=2 * GIB, free=3 * GIB)  # the parent's 136 GiB
    stage_runners.return_cached(_Run(), room)
    assert emptied
    emptied = _gpu(monkeypatch, reserved=40 * GIB, allocated=2 * GIB, free=80 * GIB)  # room to spare: kept
    stage_runners.return_cached(_Run(), room)
    assert not emptied
    emptied = _gpu(monkeypatch, reserved=2 * GIB, allocated=int(1.5 * GIB), free=1 * GIB)  # little idle: kept
    stage_runners.return_cached(_Run(), room)
    assert not emptied
    emptied = _gpu(monkeypatch, reserved=40 * GIB, allocated=2 * GIB, free=80 * GIB)  # no room named: always
    stage_runners.return_cached(_Run())
    assert emptied


def test_a_calls_room_counts_its_inputs_and_outputs():
    inputs = [torch.zeros(256, dtype=torch.bfloat16), 3, torch.zeros(64, dtype=torch.float32)]
    expected = Expected(ref=[torch.zeros(128, dtype=torch.bfloat16)], truth=None, structure="tensor")
    room = stage_runners.call_room(inputs, expected)
    assert room == stage_runners.CALL_ROOM * (512 + 256 + 256) + stage_runners.CACHED_KEPT_BYTES
