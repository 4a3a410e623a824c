"""The `vendor` baselines of the MoE tasks (profiler/vendor_ops.py through each task's crucible_vendor hook) compute
what the task's reference computes, on the CPU at small shapes, uneven loads and an expert without rows included."""
import pytest
import torch

from profiler import baselines
from sandbox.task import load_task

pytestmark = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no torch._grouped_mm")

GEMM = dict(EXPERTS=4, TOKENS=48, H=32, F=16)


def _vendor_and_reference(name: str, constants: dict, seed: int = 1):
    task = load_task(f"tasks/{name}.py").with_constants(constants)
    model = task.make_reference(0, "cpu")
    b = baselines.build("vendor", model, task.module)
    assert b.available, b.reason
    inputs = task.make_inputs(seed, "normal", "cpu")
    with torch.enable_grad():
        ref = model(*inputs)
    got = b.fn(inputs)
    return (got if isinstance(got, tuple) else (got,)), (ref if isinstance(ref, tuple) else (ref,)), inputs


@pytest.mark.parametrize("skew", [1, 3, 48])  # 48: expert 0 takes every row, the others none
@pytest.mark.parametrize("name", ["moe_grouped_gemm", "moe_grouped_gemm_bwd"])
def test_grouped_gemm_vendor_matches_the_reference(name, skew):
    got, ref, inputs = _vendor_and_reference(name, {**GEMM, "SKEW": skew})
    if skew == 48:
        assert inputs[1].tolist() == [48, 0, 0, 0]
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        torch.testing.assert_close(g.float(), r.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name,constants", [
    ("moe_layer_deepseek", dict(T=24, H=32, FFN=16, EXPERTS=8, TOP_K=3)),
    ("moe_layer_mixtral", dict(T=24, H=32, FFN=16, EXPERTS=4, TOP_K=2)),
])
def test_layer_vendor_matches_the_reference(name, constants):
    (got,), (ref,), _ = _vendor_and_reference(name, constants)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    torch.testing.assert_close(got.float(), ref.float(), rtol=3e-2, atol=3e-2)
    assert (got.float() - ref.float()).abs().max() < 0.1 * ref.float().abs().max()
