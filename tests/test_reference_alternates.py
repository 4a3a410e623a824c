"""A task's other honest PyTorch implementations (`crucible_references`): run beside the reference in the trusted
parent, passed to the comparison, and left out (never fatal) when they cannot run or return something else."""
import contextlib
import textwrap

import torch

from sandbox.reference import Reference
from sandbox.task import load_task

TASK = """
import torch
N = 64
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)
def get_inputs():
    return [torch.randn(4, N)]
def get_init_inputs():
    return []
"""


def _task(tmp_path, hook: str):
    path = tmp_path / "t.py"
    path.write_text(textwrap.dedent(TASK) + textwrap.dedent(hook))
    return load_task(path)


def test_alternates_run_beside_the_reference(tmp_path):
    task = _task(tmp_path, """
        def crucible_references(model):
            return {"log-domain": lambda x: torch.exp(torch.log_softmax(x, -1)),
                    "raises": lambda x: 1 / 0,
                    "another shape": lambda x: x[:2],
                    "another dtype": lambda x: torch.softmax(x.double(), -1)}
    """)
    ref = Reference(task, "cpu", 0)
    x = task.make_inputs(0, "normal")
    expected = ref.run(x)
    assert sorted(ref.alternates) == ["another dtype", "another shape", "log-domain", "raises"]
    assert len(expected.alternates) == 1  # the three that cannot serve are left out
    (alt,) = expected.alternates_for(0)
    assert torch.allclose(alt, torch.softmax(x[0], -1), atol=1e-6) and not torch.equal(alt, expected.ref[0])


def test_a_broken_hook_leaves_the_reference_alone(tmp_path):
    task = _task(tmp_path, """
        def crucible_references(model):
            raise RuntimeError("no backend")
    """)
    ref = Reference(task, "cpu", 0)
    expected = ref.run(task.make_inputs(0, "normal"))
    assert ref.alternates == {} and expected.alternates == [] and expected.alternates_for(0) == ()


def test_the_attention_backward_tasks_name_the_flash_backend():
    task = load_task("tasks/attention_fwd_bwd_causal.py").scaled_for_cpu()
    ref = Reference(task, "cpu", 0)
    expected = ref.run(task.make_inputs(0, "normal"))
    assert list(ref.alternates) == ["SDPA FlashAttention-2 backend"]
    assert len(expected.alternates) == 1 and len(expected.alternates[0]) == 4


def test_a_reference_run_on_a_shared_gpu_takes_its_measured_peak_from_the_gate(monkeypatch):
    """The first run of a task's shape holds the gate's whole memory budget and measures its peak; the next asks
    for that peak (with a margin). Off the GPU, or without a gate, nothing is asked (the CUDA calls are stood in
    for: the logic is what is tested here, the GPU run in benchmarks/bench_throughput.py)."""
    from types import SimpleNamespace

    from sandbox import reference as reference_mod

    asked, allocated = [], {"now": 100, "peak": 0}

    class Gate:
        def memory(self, nbytes):
            asked.append(nbytes)
            return contextlib.nullcontext(0.0)

    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev=None: allocated["now"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda dev=None: allocated.update(peak=0))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda dev=None: allocated["peak"])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(reference_mod, "_PEAKS", {})
    ref = Reference.__new__(Reference)
    ref.task = SimpleNamespace(path="t.py", overrides={"N": 8})
    ref.device, ref.gate = "cuda:0", Gate()
    with ref._memory_turn():
        allocated["peak"] = 100 + 4000  # the run's passing peak above what was held before it
    with ref._memory_turn():
        pass
    assert asked == [None, int(4000 * reference_mod.PEAK_MARGIN)]
    ref.task = SimpleNamespace(path="t.py", overrides={"N": 16})  # another shape: measured again, alone
    with ref._memory_turn():
        pass
    ref.device = "cpu"
    with ref._memory_turn():
        pass
    ref.device, ref.gate = "cuda:0", None
    with ref._memory_turn():
        pass
    assert asked == [None, int(4000 * reference_mod.PEAK_MARGIN), None]
