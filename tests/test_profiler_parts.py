"""CPU-side pieces of the profiler: output fingerprints, timer-tamper detection, compile-stat extraction across
Triton versions, Nsight Compute parsing, baselines, the environment fingerprint and the ceilings cache."""
import time
import types

import pytest
import torch
import triton
import triton.language as tl

from profiler import baselines, ceilings, compile_stats, device_memory, env, timing


# ---- fingerprints and tampering ------------------------------------------------------------------------------------
def test_fingerprint_sees_any_change_and_ignores_non_tensors():
    x = torch.randn(64, 33)
    before = device_memory.fingerprint((x, [x[:3]], 7, None))
    assert len(before) == 2
    assert device_memory.same_fp(before, device_memory.fingerprint((x.clone(), [x[:3].clone()])))
    y = x.clone()
    y[17, 5] += 0.5
    assert not device_memory.same_fp(before, device_memory.fingerprint((y, [y[:3]])))


@pytest.mark.parametrize("t", [torch.tensor([1.0, float("nan")]), torch.tensor([True, False]),
                               torch.arange(10, dtype=torch.int32), torch.randn(4, dtype=torch.bfloat16),
                               torch.randn(3, dtype=torch.complex64)])
def test_fingerprint_is_stable_for_every_dtype(t):
    assert device_memory.same_fp(device_memory.fingerprint(t), device_memory.fingerprint(t.clone()))


def test_fingerprint_of_different_length_outputs_differs():
    x = torch.ones(4)
    assert not device_memory.same_fp(device_memory.fingerprint((x, x)), device_memory.fingerprint(x))


def test_timer_patching_is_reported(monkeypatch):
    assert timing.tampered() == []
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", lambda self, end: 0.001)
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    assert set(timing.tampered()) == {"torch.cuda.Event.elapsed_time", "time.perf_counter", "torch.cuda.synchronize"}
    monkeypatch.undo()
    assert timing.tampered() == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_measure_refuses_without_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        timing.measure({"f": lambda a: None}, [[]])


# ---- compile stats ---------------------------------------------------------------------------------------------------
@triton.jit
def _double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def test_interpreter_has_no_compiled_kernels():
    x = torch.randn(100)
    y = torch.empty_like(x)
    _double_kernel[(4,)](x, y, 100, BLOCK=32)
    torch.testing.assert_close(y, 2 * x)
    assert compile_stats.kernel_stats({"k": _double_kernel}) == []


def _fake_compiled(name, regs, warps):
    meta = types.SimpleNamespace(shared=4096, num_warps=warps, num_stages=3, name=name, constants={("BLOCK",): 128})
    return types.SimpleNamespace(metadata=meta, n_regs=regs, n_spills=0, name=name, module=object())


@pytest.mark.parametrize("layout", ["triton-3.9 5-tuple", "triton-3.x 4-tuple", "triton<3.2 cache"])
def test_compiled_kernels_are_found_in_every_cache_layout(monkeypatch, layout):
    class FakeJIT:  # stands in for triton.runtime.jit.JITFunction
        fn = types.SimpleNamespace(__name__="_my_kernel")

    jit = FakeJIT()
    ks = {"key1": _fake_compiled("_my_kernel_0d1d", 40, 4), "key2": _fake_compiled("_my_kernel_0d1d", 96, 8)}
    if layout == "triton-3.9 5-tuple":
        jit.device_caches = {0: (ks, {}, "target", "backend", "binder")}
    elif layout == "triton-3.x 4-tuple":
        jit.device_caches = {0: (ks, "target", "backend", "binder")}
    else:
        jit.cache = {0: ks}
    autotuned = types.SimpleNamespace(fn=types.SimpleNamespace(fn=jit))  # Autotuner(Heuristics(JITFunction))
    monkeypatch.setattr(compile_stats, "_is_jit", lambda obj: isinstance(obj, FakeJIT))
    stats = compile_stats.kernel_stats({"a": autotuned, "b": jit, "c": 3})
    assert sorted((s.registers, s.num_warps) for s in stats) == [(40, 4), (96, 8)]  # found once, not twice
    assert all(s.name == "_my_kernel" and s.shared_bytes == 4096 and s.constants == {"BLOCK": 128} for s in stats)
    assert "96 registers/thread" in stats[1].describe() or "96 registers/thread" in stats[0].describe()


NCU_CSV = '''==PROF== Connected to process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","gpu__time_duration.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed","sm__warps_active.avg.pct_of_peak_sustained_active","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
"","","","","","","","nsecond","%","%","inst","inst","inst"
"0","123","python3","host","_rmsnorm_fwd_kernel","1","7","66,112","91.5","78.2","12.5","0.4","1.9"
"1","123","python3","host","vectorized_elementwise_kernel","1","7","1,024","40.0","60.0","2.0","0.1","3.0"
'''


def test_ncu_csv_is_parsed_per_kernel_with_top_stalls():
    rows = compile_stats.parse_ncu_csv(NCU_CSV)
    assert [r["kernel"] for r in rows] == ["_rmsnorm_fwd_kernel", "vectorized_elementwise_kernel"]
    r = rows[0]
    assert r["duration_ns"] == 66112 and r["dram_throughput_pct"] == 91.5 and r["achieved_occupancy_pct"] == 78.2
    assert [s["reason"] for s in r["top_stalls"]] == ["long_scoreboard", "wait", "barrier"]
    assert rows[1]["top_stalls"][0]["reason"] == "wait"
    assert compile_stats.parse_ncu_csv("no kernels were profiled") == []


# ---- baselines ------------------------------------------------------------------------------------------------------
class _Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((8,), 3.0))

    def forward(self, x):
        return x * self.w


def test_parse_names():
    assert baselines.parse_names("eager, compile,eager") == ("eager", "compile")
    assert baselines.parse_names(None) == ("eager",)
    with pytest.raises(ValueError, match="unknown baseline cudnn"):
        baselines.parse_names("eager,cudnn")


def test_eager_baseline_runs_the_reference_without_autograd():
    b = baselines.build("eager", _Scale())
    out = b.fn([torch.ones(8)])
    assert torch.equal(out, torch.full((8,), 3.0)) and not out.requires_grad
    x = torch.ones(8, requires_grad=True)
    assert b.fn([x]).requires_grad  # a task that asks for gradients keeps them
    assert b.versions["torch"] == torch.__version__


def test_compile_baseline_is_built_lazily():
    b = baselines.build("compile", _Scale())
    assert b.available and "triton" in b.versions


def test_liger_unavailable_reasons(monkeypatch):
    no_hook = baselines.build("liger", _Scale(), types.SimpleNamespace())
    assert not no_hook.available and "crucible_liger" in no_hook.reason
    task = types.SimpleNamespace(crucible_liger=lambda m: (lambda x: m(x) + 1))
    monkeypatch.setattr(baselines.importlib.util, "find_spec", lambda name: None)
    assert "not installed" in baselines.build("liger", _Scale(), task).reason
    monkeypatch.setattr(baselines.importlib.util, "find_spec", lambda name: object())
    ok = baselines.build("liger", _Scale(), task)
    assert ok.available and torch.equal(ok.fn([torch.ones(8)]), torch.full((8,), 4.0))
    broken = types.SimpleNamespace(crucible_liger=lambda m: 42)
    assert "not a callable" in baselines.build("liger", _Scale(), broken).reason


def test_vendor_baseline_comes_from_the_tasks_hook_and_the_cli_knows_every_name():
    from agent.commands import BASELINES

    assert BASELINES == baselines.KNOWN
    assert "crucible_vendor" in baselines.build("vendor", _Scale(), types.SimpleNamespace()).reason
    ok = baselines.build("vendor", _Scale(), types.SimpleNamespace(crucible_vendor=lambda m: (lambda x: m(x) * 2)))
    assert ok.available and torch.equal(ok.fn([torch.ones(8)]), torch.full((8,), 6.0))
    def missing_op(model):
        raise AttributeError("module 'torch' has no attribute '_grouped_mm'")
    gone = baselines.build("vendor", _Scale(), types.SimpleNamespace(crucible_vendor=missing_op))
    assert not gone.available and "_grouped_mm" in gone.reason


# ---- environment and ceilings cache -------------------------------------------------------------------------------------
def test_environment_fingerprint():
    e = env.environment()
    assert e["torch"] == torch.__version__ and e["triton"] == triton.__version__
    assert e["python"].count(".") == 2 and "gpu_count" in e
    assert env.device_key(e).endswith(f"torch {torch.__version__}")


def test_ceilings_are_measured_once_and_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("CRUCIBLE_CACHE", str(tmp_path))
    measured = []

    def fake_measure(device=0):
        measured.append(device)
        return {"key": env.device_key(env.environment()), "copy_gbps": 4244.0, "matmul_tflops": {"bf16": 694.0}}

    monkeypatch.setattr(ceilings, "measure_ceilings", fake_measure)
    first = ceilings.get_ceilings(0)
    second = ceilings.get_ceilings(0)
    assert measured == [0] and not first["cached"] and second["cached"] and second["copy_gbps"] == 4244.0
    assert (tmp_path / "ceilings.json").exists()
    ceilings.get_ceilings(0, refresh=True)
    assert measured == [0, 0]


@pytest.mark.parametrize("name", ["cross_entropy", "swiglu_bwd", "rope_bwd", "linear_cross_entropy"])
def test_eager_baseline_of_a_backward_task_runs_with_grad_from_its_second_call(name):
    # these references call torch.autograd.grad in forward without enabling grad themselves (the timing stage
    # calls baselines under no_grad); every call, the first included, must return the gradients
    from sandbox.task import load_task
    task = load_task(f"tasks/{name}.py").scaled_for_cpu()
    model = task.make_reference(0, "cpu")
    args = task.make_inputs(0, "normal")
    base = baselines.build("eager", model)
    with torch.no_grad():
        first, second = base.fn(args), base.fn(args)
    expected = model(*args)
    for got in (first, second):
        assert all(torch.equal(g, e) for g, e in zip(got, expected))


def test_eager_baseline_of_a_forward_task_stays_without_grad():
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(torch.is_grad_enabled())
            return x * 2

    base = baselines.build("eager", Probe())
    base.fn([torch.ones(3)])
    base.fn([torch.ones(3)])
    assert seen == [False, False]


def test_a_first_call_made_apart_runs_once_on_a_copy_and_reports_its_error():
    calls = []

    def writes_over_its_input(args):
        calls.append(args[0])
        args[0].mul_(0)
        return args[0] + 1

    x = torch.arange(6.0)
    assert device_memory.first_call(writes_over_its_input, [x, 3], None) is None
    assert len(calls) == 1 and calls[0] is not x and torch.equal(x, torch.arange(6.0))

    def fails(args):
        raise RuntimeError("no plan for this shape")

    assert device_memory.first_call(fails, [x], None) == "RuntimeError: no plan for this shape"
