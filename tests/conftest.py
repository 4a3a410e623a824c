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
