"""profiler.roofline: bytes and FLOPs an op must cost, the floor time, and the gate on impossible times."""
import textwrap

import pytest
import torch

from profiler.roofline import count_flops, gate, roofline, task_roofline, tensor_bytes
from sandbox.task import load_task

CEIL = {"copy_gbps": 4000.0, "matmul_tflops": {"bf16": 800.0, "fp16": 800.0, "fp32": 50.0, "tf32": 400.0}}


class _Linear(torch.nn.Module):
    def __init__(self, k, n, dtype=torch.float32):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n, k, dtype=dtype))

    def forward(self, x):
        return x @ self.w.t()


class _Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_tensor_bytes_counts_inputs_parameters_and_outputs_once():
    m = _Linear(48, 24, torch.bfloat16)
    x = torch.randn(10, 48, dtype=torch.bfloat16)
    out = m(x)
    assert tensor_bytes([x], out, m) == 2 * (10 * 48 + 24 * 48 + 10 * 24)
    assert tensor_bytes([x, 3, None], (out, [out]), None) == 2 * (10 * 48 + 2 * 10 * 24)


@pytest.mark.parametrize("m,k,n", [(10, 48, 24), (1, 7, 13), (33, 64, 5)])
def test_flops_of_a_matmul_are_2mnk(m, k, n):
    flops, out, where = count_flops(_Linear(k, n), [torch.randn(m, k)])
    assert flops == 2 * m * n * k
    assert tuple(out.shape) == (m, n)
    assert "meta" in where  # counted without running the reference for real


def test_flops_of_attention_are_4bhs2d():
    b, h, s, d = 2, 3, 64, 32
    q = torch.randn(b, h, s, d)
    flops, _, _ = count_flops(_Attention(), [q, q, q])
    assert flops == 4 * b * h * s * s * d


def test_memory_bound_floor_and_rates():
    r = roofline(4e9, 1e9, CEIL, "bf16")
    assert r.bound == "memory"
    assert r.memory_ms == pytest.approx(1.0) and r.compute_ms == pytest.approx(1e9 / 800e12 * 1e3)
    at = r.at(2.0)
    assert at["gbps"] == pytest.approx(2000.0) and at["pct_of_roofline"] == pytest.approx(50.0)
    assert at["tflops"] == pytest.approx(1e9 / 2e-3 / 1e12)


def test_compute_bound_uses_the_inputs_dtype_rate():
    r = roofline(1e6, 8e12, CEIL, "fp32")
    assert r.bound == "compute" and r.peak_tflops == 50.0
    assert r.floor_ms == pytest.approx(8e12 / 50e12 * 1e3)
    assert roofline(1e6, 8e12, CEIL, "bf16").floor_ms == pytest.approx(10.0)


def test_no_ceilings_or_no_rate_for_the_dtype():
    assert roofline(1e9, 1e9, None, "bf16").bound == "unknown"
    r = roofline(1e9, 1e15, CEIL, None)  # float64 / integer op: no measured rate, the bytes set the floor
    assert r.bound == "memory" and r.peak_tflops is None


def test_gate_passes_real_times_and_quarantines_impossible_ones():
    r = roofline(4e9, 0, CEIL, "bf16")  # floor 1 ms at 4000 GB/s
    assert gate(1.05, r).ok
    assert gate(0.85, r).ok  # a read-heavy kernel can beat a copy a little
    bad = gate(0.5, r)  # 8000 GB/s
    assert not bad.ok and bad.reason == "faster_than_roofline" and "GB/s" in bad.message
    assert not gate(0.0, r).ok
    c = roofline(0, 8e12, CEIL, "bf16")  # floor 10 ms at 800 TFLOP/s
    assert gate(9.0, c).ok
    assert not gate(5.0, c).ok


def test_reason_matches_the_harness_reason_code():
    from sandbox.records import Reason
    assert gate(1e-9, roofline(4e9, 0, CEIL, "bf16")).reason == Reason.FASTER_THAN_ROOFLINE.value


def test_task_formula_is_used_when_declared():
    task = load_task("tasks/rmsnorm_fwd.py")
    x = torch.empty(task.constants["M"], task.constants["N"], dtype=torch.bfloat16, device="meta")
    r = task_roofline(task.declared_roofline(), task.make_reference(0, "cpu"), [x], CEIL)
    assert r.bytes == 2 * (2 * 16384 * 4096 + 4096)
    assert r.flops == 0 and r.bound == "memory" and "CRUCIBLE_BYTES" in r.bytes_source


def test_tensor_sizes_and_flop_counter_when_the_task_declares_nothing(tmp_path):
    path = tmp_path / "mm.py"
    path.write_text(textwrap.dedent("""
        import torch
        M = 64
        K = 32
        N = 16
        CRUCIBLE_ALLOW_TF32 = True
        class Model(torch.nn.Module):
            def forward(self, a, b):
                return a @ b
        def get_inputs():
            return [torch.randn(M, K), torch.randn(K, N)]
        def get_init_inputs():
            return []
    """))
    task = load_task(path)
    r = task_roofline(task.declared_roofline(), task.make_reference(0, "cpu"), task.make_inputs(0, "normal"), CEIL)
    assert r.flops == 2 * 64 * 32 * 16
    assert r.bytes == 4 * (64 * 32 + 32 * 16 + 64 * 16)
    assert r.peak_dtype == "tf32"  # a float32 task that allows tf32 is held to the tf32 rate


@pytest.mark.parametrize("name", ["rmsnorm_bwd", "cross_entropy", "linear_cross_entropy"])
def test_backward_tasks_count_their_flops_even_when_the_caller_disabled_grad(name):
    # their references call autograd.grad inside forward; the timing stage computes the roofline under no_grad
    task = load_task(f"tasks/{name}.py").scaled_for_cpu()
    with torch.no_grad():
        r = task_roofline(task.declared_roofline(), task.make_reference(0, "cpu"), task.make_inputs(0, "normal"), CEIL)
    if name == "linear_cross_entropy":  # FLOPs by formula; bytes from a meta run of the reference's forward
        assert "tensor sizes" in r.bytes_source and r.bytes > 0 and r.bound == "compute"
    else:
        assert "FlopCounterMode" in r.flops_source  # elementwise and reductions only: FlopCounterMode counts products
        assert r.flops == 0 and r.bound == "memory"


def test_bytes_are_counted_for_a_reference_that_reads_tensor_values():
    # moe_grouped_gemm: FLOPs by formula, bytes from the outputs; its forward calls counts.tolist(), which a meta
    # tensor cannot do, so the outputs come from a real run (it crashed `crucible bench` on the H200)
    task = load_task("tasks/moe_grouped_gemm.py").scaled_for_cpu()
    model, inputs = task.make_reference(0, "cpu"), task.make_inputs(0, "normal")
    r = task_roofline(task.declared_roofline(), model, inputs, CEIL)
    x, counts = inputs
    weight = model.weight
    out_bytes = x.shape[0] * weight.shape[1] * 2
    assert r.bytes == x.numel() * 2 + counts.numel() * counts.element_size() + weight.numel() * 2 + out_bytes
    assert "CRUCIBLE_FLOPS" in r.flops_source and "tensor sizes" in r.bytes_source


def test_flops_of_a_failed_meta_attempt_are_not_added_to_the_real_count():
    class Reads(torch.nn.Module):
        def forward(self, a, b, n):
            c = a @ b  # counted on meta, then the meta attempt fails on .item()
            return c[: int(n.item())] @ b.t()
    a, b = torch.randn(8, 4), torch.randn(4, 4)
    flops, _, where = count_flops(Reads(), [a, b, torch.tensor(8)])
    assert where.endswith("(real)") and flops == 2 * 8 * 4 * 4 + 2 * 8 * 4 * 4
