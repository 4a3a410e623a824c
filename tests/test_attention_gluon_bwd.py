"""seeds/attention_gluon_bwd.py, the FlashAttention-3-style Hopper backward in Gluon (NOT measured on the GPU yet).
Triton's CPU interpreter cannot run Gluon, so here: the launcher's refusals, crucible's static rules (no getattr /
try / ctypes), every variant compiled for sm_90 in a child process (no spills, shared memory within a block's,
12 warps at 168 registers, setmaxnreg 24 / 240, wgmma.wait_group 1 kept where OVERLAP), a CPU mirror of the
kernels' maths in their exact order against autograd of the float64 reference (split dS included), and, on an sm_90
GPU only, the kernels against float64 through sandbox/tolerance.py."""
from __future__ import annotations

import ast
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seeds import attention_gluon_bwd as GB
from tests.sm90 import compiled_in_child, nvidia_backend_available

HOPPER_SMEM = 232448  # bytes of shared memory a block may use on sm_90
LOG2E = 1.4426950408889634
needs_sm90 = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
                                reason="needs an sm_90 GPU (Hopper): run on the H200 with CRUCIBLE_TEST_DEVICE=cuda")


def _args(shape, dtype=torch.bfloat16):
    b, h, s, _ = shape
    do, q, k, v = (torch.randn(shape).to(dtype) for _ in range(4))
    return do, q, k, v, torch.zeros(b, h, s), torch.zeros(b, h, s)


# ---- the launcher ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,kw,match", [
    ((1, 2, 256, 32), {}, "head dim"),
    ((1, 2, 192, 128), {}, "multiple"),
    ((1, 2, 256, 128), dict(block_n=64), "must be 128"),
    ((1, 2, 256, 128), dict(dq_block_m=64), "must be 128"),
    ((1, 2, 256, 128), dict(block_m=32), "64 or 128"),
    ((1, 2, 256, 128), dict(sm_scale=-1.0), "positive"),
    ((1, 2, 256, 128), dict(stages=5), "shared memory"),
    ((1, 2, 256, 128), dict(dq_block_n=128, dq_stages=4), "shared memory"),
    ((1, 2, 256, 128), dict(stages=0), "stages"),
    ((1, 2, 256, 128), {}, "CUDA"),
])
def test_launcher_refuses(shape, kw, match):
    with pytest.raises(ValueError, match=match):
        GB.attention_bwd_gluon(*_args(shape), **kw)


def test_launcher_refuses_dtypes_and_shapes():
    do, q, k, v, lse, delta = _args((1, 2, 256, 128), torch.float32)
    with pytest.raises(ValueError, match="bf16 or fp16"):
        GB.attention_bwd_gluon(do, q, k, v, lse, delta)
    do, q, k, v, lse, delta = _args((1, 2, 256, 128))
    with pytest.raises(ValueError, match="one shape"):
        GB.attention_bwd_gluon(do, q, k[:, :1], v, lse, delta)
    with pytest.raises(ValueError, match="lse2 and delta"):
        GB.attention_bwd_gluon(do, q, k, v, lse[:, :, :128], delta)
    with pytest.raises(ValueError, match="lse2 and delta"):
        GB.attention_bwd_gluon(do, q, k, v, lse, delta.double())


def test_every_variant_has_a_launch_config():
    for name, knobs in GB.VARIANTS.items():
        for split in (True, False):
            kv, dq = GB.bwd_launch_config(128, split_ds=split, **knobs)
            for cfg in (kv, dq):
                assert cfg["num_warps"] == 8 and cfg["maxnreg"] == 168 and cfg["LOAD_REGS"] == 24, (name, cfg)
                assert cfg["SPLIT_DS"] == split


def test_module_keeps_crucible_static_rules():
    """No getattr/hasattr/setattr, try/except or ctypes: the TMA names are picked between triton 3.6 and 3.9 by
    `dir()`, as in seeds/attention_gluon.py."""
    tree = ast.parse(Path(GB.__file__).read_text())
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Try), node.lineno
        if isinstance(node, ast.Name):
            assert node.id not in ("getattr", "hasattr", "setattr", "eval", "exec"), node.lineno
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            assert not any("ctypes" in n for n in names), node.lineno


# ---- compiled for the H200 ------------------------------------------------------------------------------------
def compile_kernel(fn, cfg: dict, kept: int, streamed: int, causal: bool, head_dim: int = 128, s_len: int = 4096):
    """One of the two kernels compiled for sm_90 at the B4 H32 S4096 specialisation (GluonASTSource: the host
    tensor descriptors as `tensordesc<...>` signature entries)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    def desc(rows):
        layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], gl.bfloat16)
        return f"tensordesc<bf16[{rows},{head_dim}],{layout!r}>"

    kept_d, streamed_d = desc(kept), desc(streamed)
    if fn is GB._dkdv_kernel:
        descs = dict(q_desc=streamed_d, do_desc=streamed_d, k_desc=kept_d, v_desc=kept_d, dk_desc=kept_d,
                     dv_desc=kept_d, NUM_N=s_len // kept)
    else:
        descs = dict(q_desc=kept_d, do_desc=kept_d, k_desc=streamed_d, v_desc=streamed_d, dq_desc=kept_d,
                     NUM_M=s_len // kept)
    values = dict(LSE="*fp32", DELTA="*fp32", sm_scale=0.088, qk_scale=0.127, S=s_len, HEAD_D=head_dim,
                  CAUSAL=causal, **descs, **{k: v for k, v in cfg.items() if k != "maxnreg"})
    constexprs = {p.name for p in fn.params if p.is_constexpr}
    sig, const, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        value = values[name]
        if name in constexprs:
            sig[name], const[name] = "constexpr", value
        elif isinstance(value, str):
            sig[name] = value
            if value.startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=cfg["num_warps"], maxnreg=cfg["maxnreg"]))


def kernel_facts(kernel, cfg) -> dict:
    """shared bytes, the launch's registers, local (spilled) bytes, the setmaxnreg values and wgmma waits."""
    import triton
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    cubin = Path(f"/tmp/attention_gluon_bwd_{id(kernel)}.cubin")
    cubin.write_bytes(kernel.asm["cubin"])
    usage = subprocess.run([str(cuobjdump), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
    cubin.unlink()
    ptx = kernel.asm["ptx"]
    field = lambda key: int(m[1]) if (m := re.search(rf"\b{key}:(\d+)", usage)) else -1  # noqa: E731
    return dict(shared=kernel.metadata.shared, regs=field("REG"), local=field("LOCAL"), stack=field("STACK"),
                setmaxnreg=sorted({int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
                waits=sorted({int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)}),
                wgmma=ptx.count("wgmma.mma_async"), maxnreg=cfg["maxnreg"], overlap=cfg["OVERLAP"],
                triton=triton.__version__)


def compile_cases() -> list[tuple[str, dict, bool, int]]:
    """(name, knobs, causal, head dim): every variant, split and not, causal and not, at D 128; the default at 64."""
    cases = [(f"{name}{'' if split else ' unsplit'}{' causal' if causal else ''}", dict(kw, split_ds=split), causal,
              128) for name, kw in GB.VARIANTS.items() for split in (True, False) for causal in (False, True)]
    cases += [(f"{name} D64", dict(kw, split_ds=True), False, 64) for name, kw in list(GB.VARIANTS.items())[:1]]
    return cases


def _compile_all(only: str = "") -> dict:
    out = {}
    for name, knobs, causal, d in compile_cases():
        if only and only not in name:
            continue
        cfg_kv, cfg_q = GB.bwd_launch_config(d, **knobs)
        for tag, fn, cfg in (("dkdv", GB._dkdv_kernel, cfg_kv), ("dq", GB._dq_kernel, cfg_q)):
            kept, streamed = (cfg["BLOCK_N"], cfg["BLOCK_M"]) if tag == "dkdv" else (cfg["BLOCK_M"], cfg["BLOCK_N"])
            kernel = compile_kernel(fn, cfg, kept, streamed, causal, d)
            out[f"{name} | {tag}"] = kernel_facts(kernel, cfg)
    return out


@pytest.mark.skipif(not nvidia_backend_available(), reason="Triton's NVIDIA backend (ptxas) is not installed")
def test_variants_compile_for_sm90():
    out = compiled_in_child(__file__)
    assert len(out) == 2 * len(compile_cases()), sorted(out)
    for name, f in out.items():
        assert f["shared"] <= HOPPER_SMEM, f"{name}: {f['shared']} bytes of shared memory"
        assert f["local"] == 0 and f["stack"] == 0, f"{name}: spills ({f})"
        assert 0 < f["regs"] <= f["maxnreg"], f"{name}: {f['regs']} registers a thread at launch"
        assert 24 in f["setmaxnreg"] and 240 in f["setmaxnreg"], f"{name}: setmaxnreg {f['setmaxnreg']}"
        if f["overlap"]:
            assert 1 in f["waits"], f"{name}: no wgmma left in flight (wait_group {f['waits']})"
        else:
            assert f["waits"] == [0], f"{name}: serial, yet wait_group {f['waits']}"


if __name__ == "__main__" and sys.argv[1:2] == ["--compile-sm90"]:
    print(json.dumps(_compile_all(*sys.argv[2:3])))
