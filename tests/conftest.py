"""Test-wide setup. Kernels run through Triton's CPU interpreter unless CRUCIBLE_TEST_DEVICE=cuda.

TRITON_INTERPRET is read when a kernel is decorated (Triton's own library included), so it is set here,
before anything imports triton; not in the child processes that compile kernels for sm_90 (tests/sm90.py sets
CRUCIBLE_COMPILE_CHILD there), which import their test file, and so this module, before Gluon's library.

Two tiers (the README gives their times):
- the full suite, `python -m pytest -q`, runs every test, spread over pytest-xdist workers (pyproject's addopts:
  `-n auto`, one per CPU, at most 8, none with CRUCIBLE_TEST_DEVICE=cuda; `-n 0` runs in this process). Each worker is its own process with its own module-scoped
  fixtures (its own sandbox zygote, its own archive files under tmp_path); the tests that share one Ray cluster
  stay on one worker (the xdist group "ray"). Files with slow tests are handed out first, so that the longest
  checks do not start last.
- the quick tier, `python -m pytest -q -m "not slow"`, for before each commit, leaves out (marks slow):
  - what starts the sandbox's zygote: the `harness` fixture (~5 s of imports, then seconds per check), and the
    in-process searches and checks in SLOW_TESTS;
  - what runs the `crucible` command in a subprocess or on a Ray cluster (SLOW_FILES);
  - what compiles kernels for sm_90 (a test named *sm90*, or in SLOW_TESTS);
  - all but the first case of each parametrised test in the kernel files (KERNEL_FILES: seeds and their variants
    through the interpreter): the first case runs each kernel's code once; the full suite runs every shape, dtype,
    distribution and option.
  It still runs tests of every package (agent, sandbox, profiler, seeds, models, patching) and of every test file
  but those in SLOW_FILES.
"""
import os
import re

if os.environ.get("CRUCIBLE_TEST_DEVICE", "cpu") != "cuda" and not os.environ.get("CRUCIBLE_COMPILE_CHILD"):
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # an xdist worker: its share of the cores, not all of them each
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

DEVICE = "cuda" if os.environ.get("CRUCIBLE_TEST_DEVICE") == "cuda" and torch.cuda.is_available() else "cpu"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run on the H200 with CRUCIBLE_TEST_DEVICE=cuda")


@pytest.fixture
def device() -> str:
    return DEVICE


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): one worker per CPU this process may use (xdist's own count would take physical
    cores where psutil is installed: one on a CI machine of two hyperthreads); none on the GPU, whose tests time
    kernels and would share one device. PYTEST_XDIST_AUTO_NUM_WORKERS still decides where it is set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return 0 if DEVICE == "cuda" else len(os.sched_getaffinity(0))


SLOW_FILES = {"test_seeds_harness.py", "test_cli_run.py", "test_check_cli.py", "test_ray_executor.py",
              "test_batch_lanes.py", "test_batch_scaling.py", "test_kernelbench_batch.py", "test_bench_cli.py"}
# Tests that start the sandbox (a search or a check in-process), run the command line in a subprocess, or compile
# for sm_90, without the `harness` fixture or a name that says so: file::function.
SLOW_TESTS = {
    "test_archive_browse.py::test_reverify_marks_stale_or_confirmed_through_the_harness",
    "test_feedback.py::test_crucible_run_learns_from_its_diagnostics",
    "test_loop.py::test_run_through_real_clients_survives_http_failures",
    "test_loop.py::test_one_evaluation_worker_per_gpu",
    "test_loop.py::test_tuner_from_a_kernel_and_resume",
    "test_kernelbench.py::test_set_on_a_tuple_element_from_the_command_line",
    "test_linear_cross_entropy_gemm.py::test_option_tiles_fit_hopper_shared_memory",
}
# Files of kernel tests through the interpreter: a parametrised test runs its first case in the quick tier.
KERNEL_FILES = re.compile(r"test_(seed_\w+|\w+_variants|attention_\w+|linear_cross_entropy_gemm|norm_\w+)\.py")
# Tests that share one Ray cluster (module-scoped): one worker runs them all.
XDIST_GROUPS = {"test_ray_executor.py": "ray"}


def _slowness(item, first_cases: set) -> int:
    """0: a file that starts the sandbox or the command line; 1: another slow test; 2: a parametrised kernel test's
    later case (slow only as many); 3: quick."""
    name = item.path.name
    key = f"{name}::{getattr(item, 'originalname', item.name)}"
    if "harness" in getattr(item, "fixturenames", ()) or name in SLOW_FILES:
        return 0
    if key in SLOW_TESTS or "sm90" in item.name:
        return 1
    if KERNEL_FILES.fullmatch(name) and getattr(item, "callspec", None) is not None:
        if key in first_cases:
            return 2
        first_cases.add(key)
    return 3


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks set here
def pytest_collection_modifyitems(config, items):
    first_cases: set = set()
    rank = {}
    for item in items:
        rank[item.nodeid] = _slowness(item, first_cases)
        if rank[item.nodeid] < 3:
            item.add_marker(pytest.mark.slow)
        if item.path.name in XDIST_GROUPS:
            item.add_marker(pytest.mark.xdist_group(XDIST_GROUPS[item.path.name]))
    slow_files = {item.path for item in items if rank[item.nodeid] == 0}
    # The files that start the sandbox or the command line first (each file's tests together and in order: a
    # module-scoped zygote or cluster starts once a worker), then the other slow tests (sm_90 compiles, in-process
    # searches), then the rest: workers take tests from the front, so the longest run while the short ones fill the
    # gaps at the end. Every worker collects the same order, as xdist requires.
    items.sort(key=lambda item: 0 if item.path in slow_files else min(rank[item.nodeid], 2))
