"""H200 sweep of the decode attention seeds (seeds/decode.py) at the ANCHORS shape: batch 64, one query, an 8k-token
KV cache, GQA 32/8, D128, bf16. do_bench read the dense seed at 0.501 ms against SDPA enable_gqa's 0.481;
its split count and tiles were heuristics, never swept. The variants:
    tma      the split kernel's whole K/V tiles through TMA descriptors (the tail through masked pointers)
    cfg      (BLOCK_N, warps, stages) of the split kernel
    splits   how many programs share one (sequence, kv head)'s keys (the default fills the GPU ~4 times over)
    balanced programs per SM of the balanced schedule (dense: every program the same number of key tiles, the
             sequences' tiles laid end to end), instead of the split grid
against SDPA enable_gqa (dense) and SDPA on the gathered cache with a key mask (paged: what a user without a paged
kernel runs; the gather is outside the timed call, so it is the kernel's own floor, not the task's eager). Every
variant's o is first compared with the float64 SDPA (a relative L2 over 3x SDPA bf16's own, or any NaN, prints
WRONG and is not timed). GB/s counts the KV bytes read once. Times are do_bench medians over rotating input sets
(benchmarks/_bench.py). The table comes last.

    PYTHONPATH=$PWD python3 benchmarks/sweep_decode.py [--budget 120] [--dense-only]
    TRITON_INTERPRET=1 python3 benchmarks/sweep_decode.py --smoke      (CPU interpreter, tiny shape: the script only)
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._bench import parser, rel_l2, rotating_median_ms  # noqa: E402
from seeds import decode as DEC  # noqa: E402

SETS = 2
T0 = time.time()
CONFIGS = [None, (64, 4, 2), (64, 4, 4), (128, 4, 3), (128, 8, 3), (128, 4, 2), (32, 4, 4), (256, 8, 2)]
SPLITS = [None, 1, 2]  # 4 and 8 were slower at every tile (measured on the H200)
BALANCED = [(1, (128, 4, 3)), (1, (128, 4, 2)), (2, (64, 4, 3)), (2, (64, 4, 4)), (2, (128, 4, 2)), (1, (64, 4, 4)),
            (3, (64, 4, 2)), (4, (64, 4, 2)), (1, (128, 8, 3))]


def _inputs(smoke: bool, paged: bool, dev: str):
    b, hkv, group, n, d, page = (2, 2, 4, 200, 64, 16) if smoke else (64, 8, 4, 8192, 128, 16)
    g = torch.Generator(device=dev).manual_seed(1 + paged)
    sets = []
    for _ in range(SETS):
        q = torch.randn(b, hkv * group, 1, d, device=dev, generator=g).to(torch.bfloat16)
        if paged:
            pages = -(-n // page)
            lens = torch.tensor([n - (i * 37) % (n // 4 + 1) for i in range(b)], dtype=torch.int32, device=dev)
            table = torch.randperm(b * pages, device=dev, generator=g).view(b, pages).to(torch.int32)
            kc, vc = (torch.randn(b * pages, page, hkv, d, device=dev, generator=g).to(torch.bfloat16)
                      for _ in range(2))
            k, v = (c[table.long()].reshape(b, pages * page, hkv, d).transpose(1, 2).contiguous() for c in (kc, vc))
            mask = (torch.arange(pages * page, device=dev)[None, :] < lens[:, None])[:, None, None, :]
            sets.append(dict(q=q, kc=kc, vc=vc, table=table, lens=lens, k=k, v=v, mask=mask))
            tokens = int(lens.sum())
        else:
            k, v = (torch.randn(b, hkv, n, d, device=dev, generator=g).to(torch.bfloat16) for _ in range(2))
            sets.append(dict(q=q, k=k, v=v, mask=None))
            tokens = b * n
    return sets, 2 * tokens * hkv * d * 2, f"B{b} Hq{hkv * group}/{hkv} N{n} D{d}"


def _sdpa(s: dict, dtype=None) -> torch.Tensor:
    cast = (lambda t: t.to(dtype)) if dtype else (lambda t: t)
    return F.scaled_dot_product_attention(cast(s["q"]), cast(s["k"]), cast(s["v"]), attn_mask=s["mask"],
                                          enable_gqa=True)


def main() -> int:
    ap = parser(__doc__.splitlines()[0], 120.0)
    ap.add_argument("--dense-only", action="store_true", help="skip the paged rows")
    args = ap.parse_args()
    smoke = args.smoke
    dev = "cpu" if smoke else "cuda"
    rows: list[tuple[str, str, float, float]] = []  # op, name, ms, rel L2
    wrong: list[str] = []

    for paged in (False,) if args.dense_only else (False, True):
        sets, nbytes, shape = _inputs(smoke, paged, dev)
        op = f"{'paged ' if paged else ''}decode {shape}"
        truth = _sdpa(sets[0], torch.float64)
        bound = 3 * max(rel_l2(_sdpa(sets[0]), truth), 1e-3)

        def row(name: str, fn, op=op, nbytes=nbytes, truth=truth, bound=bound) -> None:
            if time.time() - T0 > args.budget:
                print(f"skipped {op} {name}: past the budget", flush=True)
                return
            try:
                err = rel_l2(fn(0), truth)
                if err > bound:
                    wrong.append(f"{op} {name}")
                    print(f"WRONG {op} {name}: rel L2 {err:.3g} (bound {bound:.3g})", flush=True)
                    return
                ms = rotating_median_ms(fn, SETS, smoke)
            except Exception as exc:  # noqa: BLE001 (a variant that fails to build or launch: reported, the run goes on)
                wrong.append(f"{op} {name}")
                print(f"FAILED {op} {name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                return
            rows.append((op, name, ms, err))
            print(f"{op} {name:40s} {ms:8.4f} ms {nbytes / ms / 1e6:7.0f} GB/s rel L2 {err:.2e}", flush=True)

        row("SDPA enable_gqa" + (" (gathered cache, mask)" if paged else ""), lambda i: _sdpa(sets[i]))
        for tma in ((False,) if paged else (True, False)):
            for cfg in CONFIGS:
                for splits in SPLITS:
                    if smoke and cfg is not None:
                        cfg = (16, cfg[1], 1)
                    name = f"tma={int(tma)} cfg={cfg or 'default'} splits={splits or 'default'}"
                    if paged:
                        fn = (lambda i, c=cfg, n=splits: DEC.paged_decode_attention(
                            sets[i]["q"], sets[i]["kc"], sets[i]["vc"], sets[i]["table"], sets[i]["lens"],
                            num_splits=n, config=c))
                    else:
                        fn = (lambda i, c=cfg, n=splits, t=tma: DEC.decode_attention(
                            sets[i]["q"], sets[i]["k"], sets[i]["v"], num_splits=n, config=c, tma=t))
                    row(name, fn)
        if not paged:
            for programs, cfg in BALANCED:
                cfg = (16, cfg[1], 1) if smoke else cfg
                row(f"tma=1 cfg={cfg} balanced={programs}", lambda i, c=cfg, n=programs: DEC.decode_attention(
                    sets[i]["q"], sets[i]["k"], sets[i]["v"], config=c, tma=True, balanced=n))

    print(f"\ndecode attention, bf16; GB/s on the KV bytes; speedup vs SDPA in the same run ({time.time() - T0:.0f} s)")
    for op in dict.fromkeys(r[0] for r in rows):
        mine = sorted((r for r in rows if r[0] == op), key=lambda r: r[2])
        base = next((r[2] for r in mine if r[1].startswith("SDPA")), float("nan"))
        print(f"{op}")
        for _, name, ms, err in mine[:12]:
            print(f"  {name:48s} {ms:8.4f} ms {base / ms:6.3f}x  rel L2 {err:.1e}")
    if wrong:
        print(f"WRONG or FAILED: {', '.join(wrong)}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
