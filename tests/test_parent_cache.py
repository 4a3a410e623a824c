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


def test_a_finished_check_hands_back_an_idle_cache_past_a_share_of_the_gpu(monkeypatch):
    """Each slot's stream keeps its own pool of freed blocks, which no other slot and no candidate's process can use:
    past a sixteenth of the GPU (8.8 GiB of 141) the idle cache goes back at a check's end, whatever is free."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: type("P", (), {
        "total_memory": 141 * GIB}))
    emptied = _gpu(monkeypatch, reserved=58 * GIB, allocated=6 * GIB, free=60 * GIB)
    stage_runners.return_idle("cuda:0")
    assert emptied
    emptied = _gpu(monkeypatch, reserved=12 * GIB, allocated=4 * GIB, free=1 * GIB)  # 8 GiB idle: a small task's
    stage_runners.return_idle("cuda:0")
    assert not emptied
    stage_runners.return_idle("cpu")  # nothing to hand back, and no CUDA call
    assert not emptied


def test_a_calls_room_counts_its_inputs_and_outputs():
    inputs = [torch.zeros(256, dtype=torch.bfloat16), 3, torch.zeros(64, dtype=torch.float32)]
    expected = Expected(ref=[torch.zeros(128, dtype=torch.bfloat16)], truth=None, structure="tensor")
    room = stage_runners.call_room(inputs, expected)
    assert room == stage_runners.CALL_ROOM * (512 + 256 + 256) + stage_runners.CACHED_KEPT_BYTES
