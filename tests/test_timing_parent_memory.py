"""The harness's parent gives its cached device memory back before the child times. Run AD: the float64 truth it
computed to size the candidate's outputs (102 GiB for causal attention fwd+bwd) stayed in its allocator's cache,
and the child, timing on the same GPU, ran out of memory."""
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

    def reference_run(inputs):
        events.append("reference (float64 truth included)")
        return types.SimpleNamespace(nbytes=1 << 20)

    def request(run, stage, msg, max_bytes):
        events.append(f"child: {msg['op']}")
        raise _ChildAsked

    task = types.SimpleNamespace(make_inputs=lambda seed, distribution, device: [torch.zeros(4)], path="t.py",
                                 overrides={})
    run = types.SimpleNamespace(task=task, device="cuda", rng=random.Random(0),
                                options=types.SimpleNamespace(gpu=0, timing_mode="auto", baselines=("eager",)))
    reference = types.SimpleNamespace(run=reference_run, model=None, model_seed=0)
    with pytest.raises(_ChildAsked):
        timing_parent.measure(types.SimpleNamespace(_request=request), run, reference, candidate=True)
    assert events == ["reference (float64 truth included)", "empty_cache", "child: time"]
