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


SWITCHING = """
import time
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
N = 8
SEEN = []  # whether SDPA's math backend was on, as the reference's forward saw it, call after call
class Model(torch.nn.Module):
    def forward(self, x):
        for _ in range(20):
            SEEN.append(torch.backends.cuda.math_sdp_enabled())
            time.sleep(0.002)
        return x * 2
def get_inputs():
    return [torch.randn(2, N)]
def get_init_inputs():
    return []
def crucible_references(model):
    def flash_only(x):
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            time.sleep(0.05)
            return x * 2
    def leaks(x):
        torch.backends.cuda.enable_math_sdp(False)
        return x * 2
    return {"flash only": flash_only, "leaks a switch": leaks}
"""


def test_alternates_switching_backends_run_alone_and_leave_the_switches_as_they_were(tmp_path):
    """The GPU's check slots are threads of one process, and SDPA's backend switches are process-wide: a slot's
    alternate that picks a backend must not change another slot's reference (its float64 truth would lose the math
    backend), and a switch an alternate leaks is put back."""
    import threading

    path = tmp_path / "switching.py"
    path.write_text(textwrap.dedent(SWITCHING))
    task = load_task(path)
    refs = [Reference(task, "cpu", i) for i in range(2)]
    seen = task.module.SEEN
    errors = []

    def work(ref, seed):
        try:
            for i in range(6):
                ref.run(task.make_inputs(seed + i, "normal"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r, 10 * i)) for i, r in enumerate(refs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(seen) >= 2 * 6 * 20 and all(seen), "a reference ran while an alternate had switched SDPA's backends"
    assert torch.backends.cuda.math_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
