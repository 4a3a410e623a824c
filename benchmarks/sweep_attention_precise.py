"""The attention fwd+bwd seed's `precise` numerics, piece by piece: which of its parts the harness's bound
needs on the H200, and what each part and each tile configuration costs.

1. Acceptance: the failing cells of the precision diagnostic (non-causal outliers and constant rows, causal
   normal, outliers and constant rows), one draw each, against the harness's Reference with its alternate
   references, for delta from dP with dS split in both products, in dQ's only, in dK's only, and in neither.
2. Cost: fwd+bwd at B4 H32 S4096 D128 bf16, non-causal and causal, for the default, the same four, and tile
   configurations of the precise forward and backward; SDPA cuDNN and FA2 in the same run.

    python3 benchmarks/sweep_attention_precise.py [--smoke] [--budget 150] [--skip-acceptance]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks._bench import parser, rotating_median_ms  # noqa: E402
from sandbox.reference import Reference  # noqa: E402
from sandbox.task import load_task  # noqa: E402
from sandbox.tolerance import compare  # noqa: E402
from seeds import attention as A  # noqa: E402

NAMES = ("o", "dq", "dk", "dv")
# name -> (precise forward, split_ds)
NUMERICS = {
    "default (delta from fp32 o)": (False, False),
    "precise: delta from dP, split dq+dk": (True, True),
    "delta from dP, split dq only": (True, "dq"),
    "delta from dP, split dk only": (True, "dk"),
    "delta from dP, no split": (True, False),
}
CELLS = [("attention_fwd_bwd", "outliers"), ("attention_fwd_bwd", "constant_rows"),
         ("attention_fwd_bwd_causal", "normal"), ("attention_fwd_bwd_causal", "outliers"),
         ("attention_fwd_bwd_causal", "constant_rows")]
# (forward config, backward config) of the precise path; None = the launcher's default
CONFIGS = [
    ((128, 64, 8, 3), None),
    ((128, 64, 4, 3), None),
    ((64, 128, 4, 3), None),
    (None, (64, 128, 128, 64, 8, 2)),
    (None, (64, 128, 64, 64, 4, 3)),
    (None, (64, 64, 64, 64, 4, 3)),
]


def seed(precise, split, fcfg=None, bcfg=None):
    def run(q, k, v, do, causal):
        o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, causal, config=fcfg, precise=precise)
        return (o, *A.attention_bwd(do, q, k, v, o, lse, causal, config=bcfg, delta=delta, split_ds=split))
    return run


def sdpa(backend, q, k, v, do, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    with sdpa_kernel([chosen]), torch.enable_grad():
        q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
        o = F.scaled_dot_product_attention(q_, k_, v_, is_causal=causal)
        return (o.detach(), *torch.autograd.grad(o, (q_, k_, v_), do))


def acceptance(dev: str, smoke: bool) -> list[tuple[str, str, str, list[str]]]:
    rows = []
    for task_name, dist in CELLS[:2] if smoke else CELLS:
        task = load_task(f"tasks/{task_name}.py")
        causal = bool(task.init_inputs()[0])
        if smoke:
            task = task.scaled_for_cpu()
        reference = Reference(task, dev, 0)
        inputs = task.make_inputs(1000, dist, dev)
        expected = reference.run(inputs)
        for name, (precise, split) in NUMERICS.items():
            got = seed(precise, split)(*inputs, causal)
            cells = []
            for j, out in enumerate(NAMES):
                m = compare(f"output {j}", got[j], expected.ref[j], expected.truth[j],
                            alternates=expected.alternates_for(j))
                cells.append(f"{out}:ok" if m is None else f"{out}:{m.mismatched}")
            rows.append((task_name, dist, name, cells))
            print(f"{task_name:26} {dist:14} {name:38} {'  '.join(cells)}", flush=True)
            del got
        del expected, inputs
    return rows


def cost(dev: str, smoke: bool, deadline: float) -> list[tuple[str, str, float, float]]:
    b, h, s, d = (1, 2, 64, 64) if smoke else (4, 32, 4096, 128)
    gen = torch.Generator(device=dev).manual_seed(0)
    sets = [[torch.randn(b, h, s, d, device=dev, generator=gen, dtype=torch.bfloat16) for _ in range(4)]
            for _ in range(1 if smoke else 3)]
    rows = []
    for causal in (False, True):
        flops = 3.5 * 4 * b * h * s * s * d / (2 if causal else 1)
        label = "causal" if causal else "non-causal"
        variants = {} if smoke else {f"SDPA {bk} + autograd": (lambda bk: lambda *a: sdpa(bk, *a))(bk)
                                     for bk in ("cudnn", "flash")}
        variants.update({name: seed(p, sp) for name, (p, sp) in NUMERICS.items()})
        for fcfg, bcfg in CONFIGS:
            variants[f"precise fwd {fcfg or 'default'} bwd {bcfg or 'default'}"] = seed(True, True, fcfg, bcfg)
        for name, fn in variants.items():
            if time.time() > deadline:
                print(f"budget spent: {label} {name} not timed", flush=True)
                continue
            try:
                ms = rotating_median_ms(lambda i, fn=fn: fn(*sets[i], causal), len(sets), smoke)
            except Exception as exc:  # a configuration that does not compile (shared memory) is a row, not a stop
                print(f"{label} {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", flush=True)
                continue
            rows.append((label, name, ms, flops / ms / 1e9))
            print(f"{label:10} {name:60} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s", flush=True)
    return rows


def main() -> int:
    ap = parser(__doc__.splitlines()[0], 150.0)
    ap.add_argument("--skip-acceptance", action="store_true")
    args = ap.parse_args()
    dev = "cpu" if args.smoke else "cuda"
    start = time.time()
    acc = [] if args.skip_acceptance else acceptance(dev, args.smoke)
    timed = cost(dev, args.smoke, start + args.budget)
    print("\n== acceptance (elements outside the harness's bound, alternates counted; one draw)")
    for task_name, dist, name, cells in acc:
        print(f"{task_name:26} {dist:14} {name:38} {'  '.join(cells)}")
    print("\n== fwd+bwd B4 H32 S4096 D128 bf16 (do_bench median over 3 rotating input sets)")
    best = {label: max((t for lb, n, _, t in timed if lb == label and n.startswith("SDPA")), default=None)
            for label in ("non-causal", "causal")}
    for label, name, ms, tf in timed:
        vs = f"{tf / best[label]:.2f}x best SDPA" if best[label] else ""
        print(f"{label:10} {name:60} {ms:8.3f} ms {tf:7.1f} TFLOP/s {vs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
