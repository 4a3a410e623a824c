"""Every registered seed, on every task it is registered for, is accepted by the full harness (CPU interpreter at
rescaled shapes, all input distributions and odd shapes). A harness that rejects correct kernels is as broken as
one that accepts cheats; and a seed that the harness rejects cannot enter the archive."""
from pathlib import Path

import pytest

from sandbox.harness import CheckOptions, Harness
from seeds.registry import TASKS_DIR, all_seeds

PAIRS = [(seed, task) for seed in all_seeds() for task in seed.tasks]
# A seed may also name KernelBench's copy of its op; the test suite keeps those task files here.
KERNELBENCH_DIRS = sorted((Path(__file__).parent / "data" / "kernelbench").glob("level*"))


def _task_file(name: str) -> Path:
    for folder in (TASKS_DIR, *KERNELBENCH_DIRS):
        if (folder / name).is_file():
            return folder / name
    return TASKS_DIR / name


@pytest.fixture(scope="module")
def harness():
    with Harness("cpu") as h:
        yield h


def test_every_seed_names_existing_tasks():
    assert PAIRS, "no seeds registered"
    for seed, task in PAIRS:
        assert _task_file(task).is_file(), f"{seed.name} names missing task {task}"


@pytest.mark.parametrize("seed,task", PAIRS, ids=[f"{s.name}-{Path(t).stem}" for s, t in PAIRS])
def test_seed_is_accepted(harness, seed, task):
    result = harness.check(_task_file(task), seed.path, CheckOptions(timeout_s=600))
    assert result.accepted, f"{seed.name} on {task}: {result.stage.value}/{result.reason.value}: {result.message}"
