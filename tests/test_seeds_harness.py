"""Every registered seed, on every task it is registered for, is accepted by the full harness (CPU interpreter at
rescaled shapes, all input distributions and odd shapes). A harness that rejects correct kernels is as broken as
one that accepts cheats; and a seed that the harness rejects cannot enter the archive.

The CPU rescaling budgets a task's inputs, not its weights: at their CPU size the expert weights of two MoE tasks
hold 11.5M and 23M elements, and the interpreter's cost follows the elements a kernel writes (about 10 s a call,
close to 3 minutes a check); the MoE block's forward and backward (5.5M, but nine grouped products a call) takes as
long. The slowest checks therefore run here at smaller sizes than the rescaling gives (SMALLER): the MoE tasks at
half their rescaled hidden sizes (H 256, F or FFN 176 to 224), and those of many experts or of weight gradients at
half their experts too (DeepSeek's layer 32 of top-8, the grouped GEMM's backward 32, the MoE block 4 of top-2), and
DeepSeek's layer and the MoE block at half their tokens too (T 128: still several 16-row blocks per expert, partial
ones included, and DeepSeek's routing still spans two of the alignment's chunks; it cut their checks by two fifths);
the fused linear cross-entropy at half its tokens (128); the bf16 AdamW at an eighth of its two large tensors (16384
elements: 64 of the seed's 256-element CPU chunks each, partial chunks at the odd shapes). Every stage, distribution
and odd shape still runs, and every GEMM still has several N tiles and K steps with partial ones (the seeds' CPU
tiles are 128 wide); tests/test_seed_moe.py, tests/test_seed_moe_block.py, tests/test_seed_linear_cross_entropy.py and
tests/test_seed_adamw_bf16.py check the kernels at many more shapes. The other tasks run at the product's own CPU
size."""
from pathlib import Path

import pytest

from sandbox.harness import CheckOptions, Harness
from sandbox.task import Task, load_task
from seeds.registry import TASKS_DIR, all_seeds

PAIRS = [(seed, task) for seed in all_seeds() for task in seed.tasks]
# A seed may also name KernelBench's copy of its op; the test suite keeps those task files here.
KERNELBENCH_DIRS = sorted((Path(__file__).parent / "data" / "kernelbench").glob("level*"))


def _task_file(name: str) -> Path:
    for folder in (TASKS_DIR, *KERNELBENCH_DIRS):
        if (folder / name).is_file():
            return folder / name
    return TASKS_DIR / name


# task -> {constant: divisor of its rescaled CPU size} (module docstring)
SMALLER = {"moe_grouped_gemm_bwd.py": {"H": 2, "F": 2, "EXPERTS": 2},
           "moe_layer_deepseek.py": {"H": 2, "FFN": 2, "EXPERTS": 2, "T": 2},
           "moe_layer_mixtral.py": {"H": 2, "FFN": 2},
           "moe_block_fwd_bwd.py": {"H": 2, "FFN": 2, "EXPERTS": 2, "T": 2},
           "linear_cross_entropy.py": {"BT": 2},
           "adamw_bf16.py": {"N0": 8, "N1": 8}}


def _task(name: str) -> Path | Task:
    """The task file, or for a task in SMALLER the task at those fractions of its rescaled sizes (module
    docstring)."""
    if name not in SMALLER:
        return _task_file(name)
    task = load_task(_task_file(name)).scaled_for_cpu()
    consts = task.current_constants()
    small = task.with_constants({k: consts[k] // d for k, d in SMALLER[name].items()})
    assert all(small.scaled_for_cpu().current_constants()[k] == consts[k] // d for k, d in SMALLER[name].items())
    return small


@pytest.fixture(scope="module")
def harness():
    with Harness("cpu") as h:
        yield h


def test_every_seed_names_existing_tasks():
    assert PAIRS, "no seeds registered"
    for seed, task in PAIRS:
        assert _task_file(task).is_file(), f"{seed.name} names missing task {task}"
    assert set(SMALLER) <= {task for _, task in PAIRS}


@pytest.mark.parametrize("seed,task", PAIRS, ids=[f"{s.name}-{Path(t).stem}" for s, t in PAIRS])
def test_seed_is_accepted(harness, seed, task):
    result = harness.check(_task(task), seed.path, CheckOptions(timeout_s=600))
    assert result.accepted, f"{seed.name} on {task}: {result.stage.value}/{result.reason.value}: {result.message}"
