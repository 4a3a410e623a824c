"""seeds/attention_gluon.py, the FlashAttention-3-style Hopper forward in Gluon. Triton's CPU interpreter cannot run
Gluon, so its numbers are checked on the GPU only (benchmarks/sweep_attention_gluon.py, against float64); here:
the launcher's refusals, the module's compatibility with crucible's static rules (no getattr / try / ctypes), and,
compiled for sm_90 in a child process, that every variant of the sweep is warp-specialised as meant (a 24-register
producer, 240-register consumers), keeps one wgmma in flight (FA3's intra-warp-group overlap: wait_group 1), fits
the shared memory and spills nothing."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seeds import attention_gluon as G
from tests.sm90 import compiled_in_child, nvidia_backend_available

HOPPER_SMEM = 232448  # bytes of shared memory a block may use on sm_90


def _qkv(shape, dtype=torch.bfloat16):
    return tuple(torch.randn(shape).to(dtype) for _ in range(3))


@pytest.mark.parametrize("shape,kw,match", [
    ((1, 2, 256, 32), {}, "head dim"),
    ((1, 2, 200, 128), {}, "multiple"),
    ((1, 2, 256, 128), dict(causal=True, block_n=64), "causal needs"),
    ((1, 2, 384, 128), dict(causal=True, persistent=True), "even"),
    ((1, 2, 256, 128), dict(sm_scale=-1.0), "positive"),
    ((1, 2, 256, 128), dict(stages=4), "shared memory"),
    ((1, 2, 256, 128), dict(consumers=2, block_m=256), "ping-pong"),
    ((1, 2, 256, 128), dict(consumers=3), "consumers"),
    ((1, 2, 256, 128), {}, "CUDA"),
])
def test_launcher_refuses(shape, kw, match):
    q, k, v = _qkv(shape)
    with pytest.raises(ValueError, match=match):
        G.attention_fwd_gluon(q, k, v, **kw)


def test_launcher_refuses_dtypes_and_shapes():
    q, k, v = _qkv((1, 2, 256, 128), torch.float32)
    with pytest.raises(ValueError, match="bf16 or fp16"):
        G.attention_fwd_gluon(q, k, v)
    q, k, v = _qkv((1, 2, 256, 128))
    with pytest.raises(ValueError, match="one shape"):
        G.attention_fwd_gluon(q, k[:, :1], v)


def test_every_variant_has_a_launch_config():
    """Each sweep variant resolves to 12 warps at 168 registers a thread (consumers 240, producer 24), and the
    causal ones are those with one diagonal key block."""
    for name, knobs in G.VARIANTS.items():
        cfg = G.fa3_launch_config(128, **knobs)
        assert cfg["maxnreg"] == 168 and cfg["MMA_REGS"] == 240 and cfg["LOAD_REGS"] == 24, (name, cfg)
        assert cfg["num_warps"] == (8 if cfg["CONSUMERS"] == 1 else 4), (name, cfg)
    assert G.causal_ok(G.VARIANTS["pingpong 128x128 s2"]) and not G.causal_ok(G.VARIANTS["coop 128x64 s4"])
    assert G.causal_ok(G.VARIANTS["coop 128x128 s2 persistent"])


def test_module_keeps_crucible_static_rules():
    """No getattr/hasattr/setattr, try/except or ctypes: the TMA names are picked between triton 3.6 and 3.9 by
    `dir()` (as seeds/cross_entropy.py does)."""
    tree = ast.parse(Path(G.__file__).read_text())
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Try), node.lineno
        if isinstance(node, ast.Name):
            assert node.id not in ("getattr", "hasattr", "setattr", "eval", "exec"), node.lineno
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            assert not any("ctypes" in n for n in names), node.lineno


def test_sweep_smoke_resolves_every_row():
    """benchmarks/sweep_attention_gluon.py --smoke's rows: every variant in each mode it applies to, each config
    accepted by the launcher up to its CUDA check."""
    import time
    from benchmarks import sweep_attention_gluon as SWEEP
    rows = SWEEP.smoke_run(time.time())
    assert len(rows) == sum(2 if G.causal_ok(kw) else 1 for kw in G.VARIANTS.values())
    assert all(r["status"] == "smoke: config ok" for r in rows), [r["status"] for r in rows]


# ---- compiled for the H200 ----------------------------------------------------------------------------------------
def compile_variant(knobs: dict, causal: bool, head_dim: int = 128):
    """The kernel compiled for sm_90 at the B4 H32 S4096 specialisation of one variant (GluonASTSource: host
    tensor descriptors as `tensordesc<...>` signature entries), and its launch config."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    cfg = G.fa3_launch_config(head_dim, **knobs)
    m_c = cfg["BLOCK_M"] // cfg["CONSUMERS"]
    q_layout = gl.NVMMASharedLayout.get_default_for([m_c, head_dim], gl.bfloat16)
    kv_layout = gl.NVMMASharedLayout.get_default_for([cfg["BLOCK_N"], head_dim], gl.bfloat16)
    q_desc = f"tensordesc<bf16[{m_c},{head_dim}],{q_layout!r}>"
    kv_desc = f"tensordesc<bf16[{cfg['BLOCK_N']},{head_dim}],{kv_layout!r}>"
    fn = G._fa3_fwd_kernel
    values = dict(q_desc=q_desc, k_desc=kv_desc, v_desc=kv_desc, o_desc=q_desc, LSE="*fp32", qk_scale=0.1, S=4096,
                  NUM_M=4096 // cfg["BLOCK_M"], TILES=128 * 4096 // cfg["BLOCK_M"], HEAD_D=head_dim, CAUSAL=causal,
                  **{k: v for k, v in cfg.items() if k != "maxnreg"})
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
    kernel = triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=cfg["num_warps"], maxnreg=cfg["maxnreg"]))
    return kernel, cfg


def variant_facts(kernel, cfg) -> dict:
    """shared bytes, the launch's registers, local (spilled) bytes, the setmaxnreg values and wgmma waits."""
    import triton
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    cubin = Path(f"/tmp/attention_gluon_{id(kernel)}.cubin")
    cubin.write_bytes(kernel.asm["cubin"])
    usage = subprocess.run([str(cuobjdump), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
    cubin.unlink()
    ptx = kernel.asm["ptx"]
    field = lambda key: int(m[1]) if (m := re.search(rf"\b{key}:(\d+)", usage)) else -1  # noqa: E731
    return dict(shared=kernel.metadata.shared, regs=field("REG"), local=field("LOCAL"), stack=field("STACK"),
                setmaxnreg=sorted({int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
                waits=sorted({int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)}),
                wgmma=ptx.count("wgmma.mma_async"), maxnreg=cfg["maxnreg"], triton=triton.__version__)


def _compile_all() -> dict:
    out = {}
    for name, knobs in G.VARIANTS.items():
        for causal in (False, True) if G.causal_ok(knobs) else (False,):
            kernel, cfg = compile_variant(knobs, causal)
            out[name + (" causal" if causal else "")] = variant_facts(kernel, cfg)
    kernel, cfg = compile_variant({}, False, head_dim=64)
    out["coop 128x128 s2 D64"] = variant_facts(kernel, cfg)
    return out


@pytest.mark.skipif(not nvidia_backend_available(), reason="Triton's NVIDIA backend (ptxas) is not installed")
def test_variants_compile_for_sm90():
    out = compiled_in_child(__file__)
    want = sum(2 if G.causal_ok(kw) else 1 for kw in G.VARIANTS.values()) + 1
    assert len(out) == want, sorted(out)
    for name, f in out.items():
        assert f["shared"] <= HOPPER_SMEM, f"{name}: {f['shared']} bytes of shared memory"
        assert f["local"] == 0 and f["stack"] == 0, f"{name}: spills ({f})"
        assert 0 < f["regs"] <= f["maxnreg"], f"{name}: {f['regs']} registers a thread at launch"
        assert 24 in f["setmaxnreg"] and 240 in f["setmaxnreg"], f"{name}: setmaxnreg {f['setmaxnreg']}"
        assert 1 in f["waits"], f"{name}: no wgmma left in flight (wait_group {f['waits']})"


if __name__ == "__main__" and sys.argv[1:2] == ["--compile-sm90"]:
    print(json.dumps(_compile_all()))
