"""A task's other honest PyTorch implementations (`crucible_references`): run beside the reference in the trusted
parent, passed to the comparison, and left out (never fatal) when they cannot run or return something else."""
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
