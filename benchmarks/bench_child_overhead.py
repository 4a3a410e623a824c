"""Host time of a candidate's calls in a plain process against the harness's confined child (the AdamW seed
read 0.774 ms of host time a call in `crucible bench` against 0.214 in a plain loop, and so was host-bound).

Three functions, each called back to back on rotating input sets: the AdamW seed as the harness calls it
(`ModelNew(*inputs)` on the task's inputs: 22.5M params, new outputs), a trivial torch op loop (10 x an empty of 3K
floats split in three) and a trivial Triton launch (one 16-element store). Two processes, each started fresh:
- plain: a Python process that imports the seed and calls it;
- child: a process prepared as sandbox.zygote prepares its forks (the same imports, the TraceMode warm-up, no CUDA),
  forked, then confined by sandbox.worker's own `_setup` (resource limits, namespaces, capabilities, the audit
  hook, Triton's launch wrapper; the seed file imported as the candidate, ModelNew built) - the harness's code,
  not a copy of it.
On CUDA both time the functions with profiler.timing.measure, as the timing stage does (0.5 ms of flush ahead of
each call, the seed's outputs held for the later fingerprint re-check), once without the allocator reserve
(`reserve=False`: the timer before the fix) and once with it; the child also runs sandbox.timing_child.run itself,
the timing stage's own entry point (eager and torch.compile as baselines). The table gives median host ms per
call, median device ms, host-bound calls and the cudaMallocs (allocator segments) the timed rounds needed.
On the CPU (`--device cpu`, TRITON_INTERPRET=1, the task at a small shape) there is no timer stage: each function
runs in measure's host loop (gc off, the seed's outputs fingerprinted and held), and the table gives host us.
Both roles also report what could slow Python down (trace/profile functions, torch modes, threads, GC, switch
interval, faulthandler) and the audit events one seed call fires, with the cost of one audit event.

    python3 benchmarks/bench_child_overhead.py                 # the H200 (<= 90 s)
    TRITON_INTERPRET=1 python3 benchmarks/bench_child_overhead.py --device cpu   # (= --smoke)
"""
from __future__ import annotations

import argparse
import collections
import faulthandler
import functools
import gc
import json
import shutil
import signal
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TASK = ROOT / "tasks" / "adamw.py"
SEED = ROOT / "seeds" / "adamw.py"
CPU_CONSTANTS = {"N0": 5000, "N1": 300, "N2": 17}  # the CPU interpreter's shape (N3 stays 1000)
REPS, WARMUP, CPU_CALLS = 30, 5, 12
ROLE_TIMEOUT_S = {"plain": 40, "child": 70}
CACHE_ENV = "CRUCIBLE_BENCH_TRITON_CACHE"  # the plain role's Triton cache, copied into the child's scratch


# ---- the functions timed ---------------------------------------------------------------------------------------------
def _functions(model, device: str):
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _tiny_kernel(X, N: tl.constexpr):
        tl.store(X + tl.arange(0, N), tl.arange(0, N).to(tl.float32))

    tiny = torch.empty(16, device=device)

    def torch_loop(args):
        for _ in range(10):
            parts = torch.empty(3072, device=device).split(1024)
        return parts

    def triton_launch(args):
        _tiny_kernel[(1,)](tiny, 16)
        return tiny

    return {"seed": lambda args: model(*args), "torch_loop": torch_loop, "triton_launch": triton_launch}


def _input_sets(task, device: str, n: int):
    """As the timing stage makes them: two base sets from the task, the rest derived on the device."""
    from sandbox.timing_child import derive
    base = [task.make_inputs(seed, "normal", device) for seed in (11, 12)]
    return [derive(base, k, task.meta.fixed_inputs) for k in range(n)]


def _task(device: str):
    from sandbox.task import load_task
    task = load_task(TASK)
    return task.with_constants(CPU_CONSTANTS) if device == "cpu" else task


# ---- timing ----------------------------------------------------------------------------------------------------------
def _median(xs):
    s = sorted(xs)
    return s[len(s) // 2] if s else float("nan")


def _cuda_rows(fns, sets, label: str) -> list[dict]:
    """profiler.timing.measure over the three functions (the seed watched, as the candidate is), without and with
    the allocator reserve."""
    from profiler import timing
    rows = []
    for reserve in (False, True):
        m = timing.measure(fns, sets, reps=REPS, warmup=WARMUP, watch="seed", reserve=reserve)
        for name, p in m["fns"].items():
            rows.append({"process": label, "fn": name, "reserve": reserve, "host_ms": _median(p["host_ms"]),
                         "ms": _median(p["ms"]), "host_bound": p["host_bound"], "calls": len(p["ms"]),
                         "segments": m["config"]["allocator_segments_timed"], "error": p["error"]})
    return rows


def _cpu_rows(fns, sets, label: str) -> list[dict]:
    """measure's host loop without the GPU: gc off, perf_counter around each call, the seed's outputs fingerprinted
    and held (as measure holds the watched function's)."""
    from profiler import timing
    rows = []
    for name, fn in fns.items():
        calls = CPU_CALLS if name == "seed" else 200
        for k in range(2):
            fn(sets[k % len(sets)])
        held, host = [], []
        gc.collect()
        gc.disable()
        try:
            for i in range(calls):
                args = sets[i % len(sets)]
                t0 = time.perf_counter()
                out = fn(args)
                host.append((time.perf_counter() - t0) * 1e3)
                if name == "seed":
                    timing.fingerprint(out)
                    held.append(out)
        finally:
            gc.enable()
        rows.append({"process": label, "fn": name, "reserve": None, "host_ms": _median(host), "ms": None,
                     "host_bound": None, "calls": calls, "segments": None, "error": None})
    return rows


def _breakdown(task, sets, device: str) -> list[dict]:
    """Where the seed's host time goes, in a plain loop (outputs dropped, so the allocator reuses their blocks; the
    device synchronised every 10 calls so the launch queue never fills): the whole call, its outputs and checks
    without the launch, the launch of a plan built beforehand, and the pinned-table form's whole call."""
    import torch
    from seeds.adamw import ModelNew, adamw_step, plan_adamw, run_plan
    lr, b1, b2, eps, wd = task.init_inputs()
    n = (len(sets[0]) - 1) // 4
    model = ModelNew(lr, b1, b2, eps, wd)
    lists = [(x[:n], x[n:2 * n], x[2 * n:3 * n], x[3 * n:4 * n]) for x in sets]
    plans = [plan_adamw(*ls, inplace=False) for ls in lists[:4]]
    variants = {
        "seed (whole call)": lambda i: model(*sets[i]),
        "outputs+checks": lambda i: plan_adamw(*lists[i], inplace=False),
        "launch (plan built)": lambda i: run_plan(plans[i % 4], sets[i][-1], lr, (b1, b2), eps, wd),
        "pinned table call": lambda i: adamw_step(*lists[i], sets[i][-1], lr, (b1, b2), eps, wd, inplace=False,
                                                  table="pinned"),
    }
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    want = [t.clone() for t in model(*sets[0])]  # every form must give the seed's outputs bit for bit
    for name, fn in variants.items():
        got = fn(0)
        got = [t for lst in got for t in lst] if name != "seed (whole call)" and not name.startswith("outputs") \
            else got
        if not name.startswith("outputs") and not all(torch.equal(a, b) for a, b in zip(got, want)):
            rows.append({"process": "plain, host loop", "fn": name, "reserve": None, "host_ms": float("nan"),
                         "ms": None, "host_bound": None, "calls": 0, "segments": None,
                         "error": {"type": "WRONG", "message": "outputs differ from the seed's"}})
            continue
        blocks = 3 if device == "cpu" else 10
        per = 2 if device == "cpu" else 10
        fn(0)
        times = []
        for blk in range(blocks):
            sync()
            t0 = time.perf_counter()
            for j in range(per):
                fn((blk * per + j) % 4)
            times.append((time.perf_counter() - t0) * 1e3 / per)
        sync()
        rows.append({"process": "plain, host loop", "fn": name, "reserve": None, "host_ms": _median(times),
                     "ms": None, "host_bound": None, "calls": blocks * per, "segments": None, "error": None})
    return rows


def _probe(model, sets) -> dict:
    """What could slow Python down in this process, and the audit events one seed call fires."""
    import torch
    from sandbox import policy
    counts: collections.Counter = collections.Counter()
    n_events = 20000
    t0 = time.perf_counter()
    for _ in range(n_events):
        sys.audit("crucible.bench.event")
    audit_us = (time.perf_counter() - t0) * 1e6 / n_events
    with policy.trusted():  # the policy refuses new audit hooks from untrusted code; this one only counts
        sys.addaudithook(lambda event, args: counts.update([event]) if counting[0] else None)
    counting = [True]
    model(*sets[0])
    counting[0] = False
    rlimit = {}
    try:
        import resource
        rlimit = {"cpu": resource.getrlimit(resource.RLIMIT_CPU)[0],
                  "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}
    except (ImportError, OSError):
        pass
    return {
        "trace": repr(sys.gettrace()), "profile": repr(sys.getprofile()), "gc_enabled": gc.isenabled(),
        "threads": threading.active_count(), "native_threads": len(os.listdir("/proc/self/task")),
        "switch_interval_s": sys.getswitchinterval(), "faulthandler": faulthandler.is_enabled(),
        "torch_function_modes": torch._C._len_torch_function_stack(),
        "dispatch_modes": torch._C._len_torch_dispatch_stack(), "rlimit": rlimit,
        "audit_event_us": audit_us, "seed_call_events": dict(counts),
    }


# ---- the two roles ---------------------------------------------------------------------------------------------------
def _plain(device: str) -> dict:
    import torch
    from seeds.adamw import ModelNew
    if device == "cuda":
        torch.cuda.set_device(0)
    task = _task(device)
    model = ModelNew(*task.init_inputs())
    sets = _input_sets(task, device, REPS + WARMUP + 1)
    check = _check(model, task, sets[0])
    fns = _functions(model, device)
    rows = _cuda_rows(fns, sets, "plain") if device == "cuda" else _cpu_rows(fns, sets, "plain")
    rows += _breakdown(task, sets, device)
    return {"rows": rows, "probe": _probe(model, sets), "check": check}


def _check(model, task, inputs) -> dict:
    """The seed's outputs against the task's reference in float64 (worst relative L2 over the outputs)."""
    import torch
    ref = task.make_reference(0, "cpu").double()
    with torch.no_grad():
        want = ref(*[x.detach().cpu().double() for x in inputs])
        got = model(*inputs)
    worst = max(float((g.detach().cpu().double() - w).norm() / w.norm().clamp_min(1e-30)) for g, w in zip(got, want))
    return {"rel_l2": worst, "ok": worst < 1e-2}


def _zygote_preamble() -> None:
    """What sandbox.zygote.serve does before it forks a candidate's process (no CUDA)."""
    import torch
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    import profiler.timing  # noqa: F401
    from profiler import env
    from sandbox import trace
    for dist in ("triton", "liger-kernel"):
        env._version(dist)
    env.driver_version()
    with trace.tracing():
        torch.nn.Linear(4, 4)(torch.empty(2, 4).fill_(1.0))


def _child(device: str, out_path: str, budget_s: float) -> dict:
    """Fork as the zygote does, confine with sandbox.worker._setup, then time inside. The result comes back through
    a file in the child's scratch directory (the one place it may write)."""
    from sandbox.reference import Reference
    task = _task(device)
    reference = Reference(task, "cpu", 1234)
    work = Path(tempfile.mkdtemp(prefix="crucible-bench-child-"))
    scratch = work / "scratch"
    (work / "shared").mkdir()
    if os.environ.get(CACHE_ENV) and os.path.isdir(os.environ[CACHE_ENV]):  # the seed compiled once, not twice
        shutil.copytree(os.environ[CACHE_ENV], scratch / "triton")
    (scratch / "triton").mkdir(parents=True, exist_ok=True)
    _zygote_preamble()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setsid()
            signal.alarm(ROLE_TIMEOUT_S["child"] - 5)  # a confined child that hangs ends itself (SIGALRM)
            _in_child(device, task, reference, scratch, work / "shared", started, budget_s)
        except BaseException:  # noqa: BLE001 - the fork must never return into the caller
            import traceback
            traceback.print_exc()
            code = 70
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    path = scratch / "result.json"
    if not path.exists():
        raise RuntimeError(f"the confined child left no result (wait status {status})")
    return json.loads(path.read_text())


def _in_child(device, task, reference, scratch: Path, shared: Path, started: float, budget_s: float) -> None:
    from profiler import timing
    from sandbox import worker
    state: dict = {}
    # Triton's driver stub comes from the plain role's cache (built there once), as from the harness's shared cache
    msg = {"op": "setup", "candidate": str(SEED), "seeds_dir": str(SEED.parent), "device": device, "gpu": 0,
           "scratch": str(scratch), "write_roots": [str(scratch)], "triton_cache": str(scratch / "triton"),
           "triton_shared": os.environ.get(CACHE_ENV) or str(shared), "cpu_seconds": 600,
           "allow_compute": task.meta.allow_torch_compute,
           "seed": reference.model_seed, "init_inputs": reference.init_inputs(), "state_dict": reference.state_dict()}
    reply = worker._setup(state, msg)
    if not reply.get("ok"):
        raise RuntimeError(f"setup failed: {reply.get('message')}")
    confined = {k: reply.get(k) for k in ("network_isolated", "filesystem_read_only", "capabilities_dropped")}
    model = state["model"]
    sets = _input_sets(task, device, REPS + WARMUP + 1)
    fns = _functions(model, device)
    rows = _cuda_rows(fns, sets, "child") if device == "cuda" else _cpu_rows(fns, sets, "child")
    del sets
    result = {"rows": rows, "confined": confined, "probe": "not reached"}

    def save() -> None:  # after each step: a child the alarm ends (a slow torch.compile) still leaves its rows
        (scratch / "result.json").write_text(json.dumps(result))

    save()
    if device == "cuda":  # the timing stage's own entry point, before the fix and after
        original = timing.measure
        for reserve, baselines in ((False, ["eager"]), (True, ["eager", "compile"])):
            if not reserve or time.monotonic() - started > budget_s:
                baselines = ["eager"]
            timing.measure = functools.partial(original, reserve=reserve)
            try:
                out = worker._time(state, {"op": "time", "task": str(TASK), "overrides": {}, "base_seeds": [5, 6],
                                           "reps": REPS, "warmup": WARMUP, "baselines": baselines,
                                           "model_seed": reference.model_seed, "sample_every": REPS // 4,
                                           "burst": 1, "settle_ms": 0.0})
            finally:
                timing.measure = original
            m = out["measured"]
            for name, p in m["fns"].items():
                rows.append({"process": "child, timing stage", "fn": "seed" if name == "candidate" else name,
                             "reserve": reserve, "host_ms": _median(p["host_ms"]), "ms": _median(p["ms"]),
                             "host_bound": p["host_bound"], "calls": len(p["ms"]),
                             "segments": m["config"]["allocator_segments_timed"], "error": p["error"]})
            save()
    result["probe"] = _probe(model, _input_sets(task, device, 1))  # last: its counting audit hook stays installed
    save()


# ---- the parent: one fresh process per role, then the table ----------------------------------------------------------
def _run_role(role: str, device: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, str(Path(__file__).resolve()), "--role", role, "--device", device, "--out", out]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if role == "plain":
        env["TRITON_CACHE_DIR"] = os.environ[CACHE_ENV]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=ROLE_TIMEOUT_S[role])
    if proc.returncode != 0 or not os.path.getsize(out):
        raise RuntimeError(f"{role}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads(Path(out).read_text())
    os.unlink(out)
    result["seconds"] = time.monotonic() - t0
    return result


def _table(results: dict, device: str) -> None:
    for role, r in results.items():
        print(f"\n{role} ({r['seconds']:.1f} s): {json.dumps(r['probe'])}")
        if "check" in r:
            print(f"seed vs float64 reference: worst rel L2 {r['check']['rel_l2']:.2e}"
                  f" {'ok' if r['check']['ok'] else 'WRONG'}")
        if "confined" in r:
            print(f"confinement: {r['confined']}")
    unit = "host ms" if device == "cuda" else "host us"
    scale = 1.0 if device == "cuda" else 1e3
    print(f"\n{'process':<22} {'function':<20} {'reserve':>7} {unit:>9} {'device ms':>9} {'host-bound':>10} "
          f"{'cudaMallocs':>11}")
    for r in results.values():
        for row in r["rows"]:
            dev = f"{row['ms']:.4f}" if row["ms"] is not None else "-"
            bound = f"{row['host_bound']}/{row['calls']}" if row["host_bound"] is not None else "-"
            seg = str(row["segments"]) if row["segments"] is not None else "-"
            res = "-" if row["reserve"] is None else ("on" if row["reserve"] else "off")
            err = f"  ERROR {row['error']['type']}: {row['error']['message'][:80]}" if row.get("error") else ""
            print(f"{row['process']:<22} {row['fn']:<20} {res:>7} {row['host_ms'] * scale:9.3f} {dev:>9} "
                  f"{bound:>10} {seg:>11}{err}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--smoke", action="store_true", help="the CPU interpreter at a small shape (= --device cpu)")
    ap.add_argument("--budget", type=float, default=20.0, help="child seconds after which torch.compile is skipped")
    ap.add_argument("--role", choices=("plain", "child"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    device = "cpu" if args.smoke else args.device
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if args.role:
        result = _plain(device) if args.role == "plain" else _child(device, args.out, args.budget)
        Path(args.out).write_text(json.dumps(result))
        return 0
    if device == "auto":
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="crucible-bench-triton-")
    results, failed = {}, []
    for role in ("plain", "child"):
        try:
            results[role] = _run_role(role, device)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            failed.append(f"{role}: {exc}")
    _table(results, device)
    for line in failed:
        print(f"FAILED {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
