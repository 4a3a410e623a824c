"""Compiling seed kernels for the H200 (sm_90) on a machine without a GPU: Triton's NVIDIA backend and ptxas run
anywhere, so shared memory, vector widths and layout conversions can be checked here. The interpreter
(TRITON_INTERPRET=1, which conftest.py sets) never compiles, so compiling happens in a child process without it:
a test calls `compiled_in_child(__file__, ...)`, which runs that test file with `--compile-sm90 ARGS` and returns the
JSON its `__main__` block prints last."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def nvidia_backend_available() -> bool:
    import triton
    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


def compile_sm90(fn: Any, values: dict, num_warps: int, num_stages: int | None = None, *,
                 divisible_ints: bool = True, maxnreg: int | None = None) -> Any:
    """The compiled kernel from example argument values: pointers as dtype strings ("*fp32"), tensor descriptors as
    their type strings, floats, ints and constexprs. A Gluon kernel compiles through Gluon's source (its pointers,
    not its descriptors, marked 16-byte divisible); a Triton kernel's string arguments are all marked so, as they
    always were here. divisible_ints marks ints that are a multiple of 16 as such, as the launcher's
    specialisation would; False compiles every int as unspecialised (a kernel declared with do_not_specialize).
    maxnreg: the launch option of that name (a register cap a thread)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

    gluon = isinstance(fn, GluonJITFunction)
    constexprs = {p.name for p in fn.params if p.is_constexpr}
    sig, const, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        value = values[name]
        if name in constexprs:
            sig[name], const[name] = "constexpr", value
        elif isinstance(value, str):
            sig[name] = value
            if value.startswith("*") or not gluon:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if divisible_ints and value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = (GluonASTSource if gluon else triton.compiler.ASTSource)(fn=fn, signature=sig, constexprs=const,
                                                                       attrs=attrs)
    options = dict(num_warps=num_warps) if num_stages is None else dict(num_warps=num_warps, num_stages=num_stages)
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def kernel_facts(kernel: Any) -> dict:
    """A compiled kernel's shared bytes, registers a thread, local (spilled) and stack bytes (cuobjdump
    -res-usage), the setmaxnreg values and wgmma.wait_group depths in its PTX, its wgmma count, and the Triton that
    built it: what the warp-specialised Gluon kernels' compile tests assert on."""
    import re
    import tempfile

    import triton
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([str(cuobjdump), "-res-usage", cubin.name], capture_output=True, text=True).stdout
    ptx = kernel.asm["ptx"]
    field = lambda key: int(m[1]) if (m := re.search(rf"\b{key}:(\d+)", usage)) else -1  # noqa: E731
    return dict(shared=kernel.metadata.shared, regs=field("REG"), local=field("LOCAL"), stack=field("STACK"),
                setmaxnreg=sorted({int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
                waits=sorted({int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)}),
                wgmma=ptx.count("wgmma.mma_async"), triton=triton.__version__)


def compiled_in_child(test_file: str, *args: str) -> Any:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CRUCIBLE_COMPILE_CHILD"] = "1"  # conftest.py, imported by the test file, leaves the interpreter off
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, test_file, "--compile-sm90", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
