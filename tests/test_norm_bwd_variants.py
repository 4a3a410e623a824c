"""The RMSNorm / LayerNorm backward options (seeds/rmsnorm.py, seeds/layernorm.py; timed by
benchmarks/sweep_norm_bwd.py): each against float64 on the interpreter, the in-kernel dw/db sum's determinism and
its counters, and (with Triton's NVIDIA backend) the sm_90 register counts that keep two programs per SM."""
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from sandbox.task import load_task
from sandbox.tolerance import compare
from seeds import layernorm, rmsnorm
from seeds._common import PREFETCH_MAXNREG
from tests.sm90 import compiled_in_child, nvidia_backend_available

TASKS = Path(__file__).resolve().parent.parent / "tasks"

# On the CPU sm_count is 4: 2 per SM is 8 programs (groups of 3: 3 + 3 + 2), 10 per SM 40 (groups of 7, the last
# of 5), 1 per SM 4 (groups of 2).
VARIANTS = {
    "prefetch": dict(prefetch=True),
    "prefetch one_reduction": dict(prefetch=True, one_reduction=True),
    "prefetch fused_sum": dict(prefetch=True, fused_sum=True),
    "prefetch one_reduction fused_sum": dict(prefetch=True, one_reduction=True, fused_sum=True),
    "fused_sum 10/SM": dict(fused_sum=True, programs_per_sm=10),
    "1/SM w16 prefetch fused_sum": dict(programs_per_sm=1, num_warps=16, prefetch=True, fused_sum=True),
    "2/SM w16 prefetch maxnreg64": dict(programs_per_sm=2, num_warps=16, prefetch=True, maxnreg=64),
    "rows=2 one_reduction fused_sum": dict(rows=2, one_reduction=True, fused_sum=True),
}


def _inputs(m, n, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (2 * torch.randn(m, n, generator=g) + 0.5).to(device=device, dtype=dtype)
    dy = torch.randn(m, n, generator=g).to(device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(device=device, dtype=dtype)
    b = (0.1 * torch.randn(n, generator=g)).to(device=device, dtype=dtype)
    return x, dy, w, b


def _run(op, x, dy, w, b, **options):
    if op == "rmsnorm":
        return rmsnorm.rmsnorm_bwd(x, w, dy, 1e-6, **options)
    return layernorm.layernorm_bwd(x, w, b, dy, 1e-5, **options)


def _truth(op, x, dy, w, b):
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    n = x.shape[-1]
    if op == "rmsnorm":
        return torch.autograd.grad(torch.nn.functional.rms_norm(xr, (n,), wr, 1e-6), (xr, wr), dy.double())
    return torch.autograd.grad(torch.nn.functional.layer_norm(xr, (n,), wr, br, 1e-5), (xr, wr, br), dy.double())


def _assert_close(op, got, x, dy, w, b, ref=None):
    """Every gradient within the tolerance module's bounds of float64 (ref: the seed default, same dtype)."""
    truth = _truth(op, x, dy, w, b)
    ref = ref if ref is not None else [t.to(g.dtype) for g, t in zip(got, truth)]
    for name, g, r, t in zip(("dx", "dw", "db"), got, ref, truth):
        assert g.shape == t.shape and g.dtype == r.dtype, f"{name}: {g.shape} {g.dtype}"
        mismatch = compare(name, g, r, t)
        assert mismatch is None, mismatch.describe()


@pytest.mark.parametrize("shape,dtype", [((83, 200), torch.float32), ((37, 129), torch.bfloat16)])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("op", ["rmsnorm", "layernorm"])
def test_variant_matches_float64(op, variant, shape, dtype, device):
    x, dy, w, b = _inputs(*shape, dtype, device)
    ref = _run(op, x, dy, w, b)
    _assert_close(op, _run(op, x, dy, w, b, **VARIANTS[variant]), x, dy, w, b, ref)


@pytest.mark.parametrize("distribution", ["large", "outliers", "constant_rows"])
@pytest.mark.parametrize("op", ["rmsnorm", "layernorm"])
def test_all_options_on_the_tasks_distributions(op, distribution, device):
    """The task's own inputs (constant rows: LayerNorm's x - mean is zero, rstd 1/sqrt(eps)), every option on."""
    task = load_task(TASKS / f"{op}_bwd.py").with_constants({"M": 53, "N": 300})
    model = task.make_reference(0, device)
    x, dy = task.make_inputs(0, distribution, device)
    w = model.weight.detach()
    b = model.bias.detach() if op == "layernorm" else w
    got = _run(op, x, dy, w, b, prefetch=True, one_reduction=True, fused_sum=True)
    _assert_close(op, got, x, dy, w, b, _run(op, x, dy, w, b))


def _counters_zero() -> bool:
    from seeds._common import _COUNTERS
    return all(int(buf.abs().sum()) == 0 for buf in _COUNTERS.values())


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm"])
def test_fused_sum_over_changing_grids_resets_its_counters(op, device):
    """Grids of 1, 2, 5, 40 and again 8 programs one after another on the same counters: a launch that left a
    counter above zero would make the next one's last program miss its ticket and leave dw unwritten."""
    x, dy, w, b = _inputs(83, 96, torch.float32, device, seed=3)
    for m, per_sm in ((1, 2), (2, 2), (5, 2), (83, 10), (83, 2)):
        got = _run(op, x[:m], dy[:m], w, b, fused_sum=True, programs_per_sm=per_sm)
        assert _counters_zero(), f"counters left non-zero after M={m}, {per_sm} per SM"
        _assert_close(op, got, x[:m], dy[:m], w, b)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm"])
def test_fused_sum_is_bitwise_reproducible(op, device):
    x, dy, w, b = _inputs(61, 96, torch.bfloat16, device, seed=4)
    first = _run(op, x, dy, w, b, fused_sum=True, prefetch=True)
    second = _run(op, x, dy, w, b, fused_sum=True, prefetch=True)
    assert all(torch.equal(p, q) for p, q in zip(first, second))


# ---- sm_90: the options must keep two 8-warp programs on an SM (at most 128 registers a thread) ----------------

def _ptxas_registers(ptx: str) -> tuple[int, int]:
    """(registers, spill-store bytes) that the ptxas shipped with Triton reports for sm_90a."""
    import triton
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        for ptxas in ("ptxas", "ptxas-blackwell"):  # the first one that reads this PTX version
            proc = subprocess.run([str(bin_dir / ptxas), "-arch=sm_90a", "-v", str(path), "-o", os.devnull],
                                  capture_output=True, text=True)
            found = re.search(r"Used (\d+) registers", proc.stdout + proc.stderr)
            if proc.returncode == 0 and found:
                spills = re.search(r"(\d+) bytes spill stores", proc.stdout + proc.stderr)
                return int(found.group(1)), int(spills.group(1)) if spills else 0
    raise RuntimeError("no ptxas of Triton's NVIDIA backend read the PTX")


def _compile_variants() -> dict:
    from tests.sm90 import compile_sm90
    base = dict(X="*bf16", W="*bf16", DY="*bf16", DX="*bf16", DW_PARTIAL="*fp32", DW_SCRATCH="*fp32", DW="*bf16",
                COUNTERS="*i32", M=16384, N=4096, stride_x=4096, stride_dy=4096, stride_dx=4096, eps=1e-6,
                BLOCK_N=4096, ROWS=1)
    ln = dict(DB_PARTIAL="*fp32", DB_SCRATCH="*fp32", DB="*bf16")
    out = {}
    for op, fn, extra in (("rmsnorm", rmsnorm._rmsnorm_bwd_kernel, {}), ("layernorm", layernorm._layernorm_bwd_kernel, ln)):
        for one in (False, True):
            for fused in (False, True):
                # The tiling of seeds._common.fused_sum_args at 264 programs and 8 warps.
                tiling = dict(GROUP=17, MAX_ROWS=17, BLOCK_C=512) if fused else dict(GROUP=1, MAX_ROWS=1, BLOCK_C=1)
                kernel = compile_sm90(fn, {**base, **extra, "PREFETCH": True, "ONE_REDUCTION": one,
                                           "FUSED_SUM": fused, **tiling}, 8, maxnreg=PREFETCH_MAXNREG)
                ptx = kernel.asm["ptx"]
                out[f"{op} prefetch one_reduction={one} fused_sum={fused}"] = [
                    *_ptxas_registers(ptx), "atom.global" in ptx]
    return out


@pytest.mark.skipif(not nvidia_backend_available(), reason="Triton's NVIDIA backend (ptxas) is not installed")
def test_prefetch_variants_keep_two_programs_per_sm():
    """65,536 registers an SM over 2 x 256 threads: 128 a thread, the cap (maxnreg) the launchers put on prefetch,
    their GPU default; under it the prefetch kernels without the fused sum spill nothing, and the fused sum emits
    its atomics. The fused-sum options are not held to no spills: Triton 3.6 (the H200's) gives them 170 registers
    uncapped, so under the cap they may spill; Triton 3.9 fits them in 128."""
    out = compiled_in_child(__file__)
    assert len(out) == 8, out
    for name, (regs, spills, atomics) in out.items():
        assert regs <= PREFETCH_MAXNREG, f"{name}: {regs} registers"
        if "fused_sum=False" in name:
            assert spills == 0, f"{name}: {spills} bytes spilled under the {PREFETCH_MAXNREG}-register cap"
        assert atomics == ("fused_sum=True" in name), f"{name}: atomics {atomics}"


if __name__ == "__main__" and sys.argv[1:2] == ["--compile-sm90"]:
    print(json.dumps(_compile_variants()))
