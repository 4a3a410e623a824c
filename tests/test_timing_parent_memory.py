"""The harness's parent gives its cached device memory back before the child times, and sizes the candidate's
outputs from the reference alone. On the H200 the float64 truth it computed to size them (102 GiB for causal attention
fwd+bwd) stayed in its allocator's cache and the child, timing on the same GPU, ran out of memory. The first fix
compared run.device with "cuda" while it is "cuda:N", so it never ran (a later bench ran out of memory again: only
a first bench on a machine, which measures the device ceilings, emptied the cache by accident)."""
import contextlib
import random
import types

import pytest
import torch

from sandbox import timing_parent


class _ChildAsked(Exception):
    pass


def test_parent_empties_its_cache_after_the_reference_and_before_the_child_times(monkeypatch):
    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))
    monkeypatch.setattr("profiler.roofline.task_roofline", lambda *a: types.SimpleNamespace(bound="compute"))
    monkeypatch.setattr("profiler.ceilings.get_ceilings", lambda gpu: {})

    def output_specs(inputs):
        events.append("reference's output bytes")
        return [(torch.Size([1 << 18]), torch.float32)]

    def reference_run(inputs):  # the float64 truth: not needed to size the outputs
        events.append("reference (float64 truth included)")
        return types.SimpleNamespace(nbytes=1 << 20)

    def request(run, stage, msg, max_bytes=1 << 30, exclusive=False):
        events.append(f"child: {msg['op']}" + (" (the GPU alone)" if exclusive else ""))
        if msg["op"] == "prepare_timing":
            return {"ok": True, "laps": {}}
        raise _ChildAsked

    @contextlib.contextmanager
    def gpu(run, exclusive=False, work=""):  # the harness's gate: the parent's own work takes it shared
        events.append("gate: alone" if exclusive else "gate: shared")
        yield
        events.append("gate: given back")

    task = types.SimpleNamespace(make_inputs=lambda seed, distribution, device: [torch.zeros(4)], path="t.py",
                                 overrides={}, declared_roofline=lambda: None)
    run = types.SimpleNamespace(task=task, device="cuda:0", rng=random.Random(0),  # as _Run.device gives it
                                options=types.SimpleNamespace(gpu=0, timing_mode="auto", baselines=("eager",),
                                                              incumbent_ms=None))
    reference = types.SimpleNamespace(run=reference_run, output_specs=output_specs, model=None, model_seed=0)
    with pytest.raises(_ChildAsked):
        timing_parent.measure(types.SimpleNamespace(_request=request, _gpu=gpu), run, reference, candidate=True)
    # Only the child's measurement holds the GPU alone; the parent's inputs and reference, and the child's input sets
    # and baselines, share it with other checks.
    assert events == ["gate: shared", "reference's output bytes", "gate: given back", "empty_cache",
                      "child: prepare_timing", "child: time (the GPU alone)"]


def test_output_specs_run_the_reference_alone_not_its_float64_copy(tmp_path):
    """Reference.output_specs: the reference's outputs' shapes and dtypes, without running the float64 model."""
    from sandbox.reference import Reference, spec_bytes
    from sandbox.task import load_task

    path = tmp_path / "two_outputs.py"
    path.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                    "    def forward(self, x):\n        return x * 2, x.sum(-1)\n\n\n"
                    "def get_inputs():\n    return [torch.randn(8, 16)]\n\n\ndef get_init_inputs():\n    return []\n")
    task = load_task(path)
    ref = Reference(task, "cpu", 0)

    def boom(*args):
        raise AssertionError("the float64 reference ran")
    ref.model64 = boom
    inputs = task.make_inputs(0, "normal", "cpu")
    specs = ref.output_specs(inputs)
    assert specs == [(torch.Size([8, 16]), torch.float32), (torch.Size([8]), torch.float32)]
    assert spec_bytes(specs) == (8 * 16 + 8) * 4
