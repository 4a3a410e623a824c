"""Test-wide setup. Kernels run through Triton's CPU interpreter unless CRUCIBLE_TEST_DEVICE=cuda.

TRITON_INTERPRET is read when a kernel is decorated (Triton's own library included), so it is set here,
before anything imports triton; not in the child processes that compile kernels for sm_90 (tests/sm90.py sets
CRUCIBLE_COMPILE_CHILD there), which import their test file, and so this module, before Gluon's library.
"""
import os

if os.environ.get("CRUCIBLE_TEST_DEVICE", "cpu") != "cuda" and not os.environ.get("CRUCIBLE_COMPILE_CHILD"):
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

DEVICE = "cuda" if os.environ.get("CRUCIBLE_TEST_DEVICE") == "cuda" and torch.cuda.is_available() else "cpu"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run on the H200 with CRUCIBLE_TEST_DEVICE=cuda")


@pytest.fixture
def device() -> str:
    return DEVICE


# The quick tier (`pytest -m "not slow"`, for before each commit) leaves out what starts the sandbox's zygote (the
# `harness` fixture: ~5 s of imports, then seconds per check), what runs the `crucible` command in a subprocess or
# on a Ray cluster, and what compiles kernels for sm_90; the README's full command runs everything.
SLOW_FILES = {"test_seeds_harness.py", "test_cli_run.py", "test_check_cli.py", "test_ray_executor.py",
              "test_batch_lanes.py", "test_batch_scaling.py", "test_kernelbench_batch.py", "test_bench_cli.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if ("harness" in getattr(item, "fixturenames", ()) or item.path.name in SLOW_FILES
                or "sm90" in item.name):
            item.add_marker(pytest.mark.slow)
