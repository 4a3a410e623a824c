"""Pipelined checking: several candidates in flight per GPU, one timing at a time, and the same verdicts as one by one.

The fast tests drive the loop with a scripted evaluator whose checks take the real gate (sandbox/gate.py) as the
harness does: compiling ungated, checking shared, timing exclusive. The slow one runs the real harness through
Triton's interpreter with three checks at once and compares verdicts and archive with the serial path.
"""
import contextlib
import threading
import time
from pathlib import Path

import pytest
import torch

from agent.archive.store import Archive
from agent.search.executors import CHECKS_PER_GPU, LocalExecutor
from agent.llm.fake import FakeProvider
from agent.search.loop import RunConfig, run_search
from sandbox.gate import EXCLUSIVE, SHARED, GpuGate, Hold, busy_seconds, held_by_work, overlapping_exclusive
from sandbox.records import CheckResult, Reason, Stage, StageResult, Verdict
from tests.test_loop import GOOD, SYNTAX_ERROR, WRONG, fenced
from tests.test_loop import task as task  # noqa: F401 - the fixture


# ---- the gate ---------------------------------------------------------------------------------------------------

def test_shared_holders_overlap_and_an_exclusive_holder_is_alone():
    gate = GpuGate()
    start = threading.Barrier(6)

    def reader(i):
        start.wait()
        for _ in range(5):
            with gate.shared(f"r{i}"):
                time.sleep(0.01)

    def writer(i):
        start.wait()
        for _ in range(3):
            with gate.exclusive(f"w{i}"):
                time.sleep(0.01)
            time.sleep(0.005)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)] + \
              [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    holds = gate.holds()
    assert sum(h.mode == EXCLUSIVE for h in holds) == 6 and sum(h.mode == SHARED for h in holds) == 20
    assert overlapping_exclusive(holds) == []
    shared = sorted((h for h in holds if h.mode == SHARED), key=lambda h: h.start)
    assert any(b.start < a.end for a, b in zip(shared, shared[1:])), "no two shared holds overlapped"


def test_the_memory_budget_keeps_peaks_that_do_not_fit_apart():
    """Reference runs take bytes of the gate's memory budget: two that fit overlap, two that do not wait for each
    other, one of unknown size (None) runs alone, and one larger than the whole budget is still admitted."""
    gate = GpuGate(memory_bytes=100)
    spans: list[tuple[str, float, float]] = []
    lock = threading.Lock()
    start = threading.Barrier(5)

    def run(name, nbytes):
        start.wait()
        with gate.memory(nbytes):
            t0 = time.monotonic()
            time.sleep(0.05)
            with lock:
                spans.append((name, t0, time.monotonic()))

    jobs = [("small1", 30), ("small2", 30), ("big1", 70), ("big2", 70), ("unknown", None)]
    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(spans) == 5
    by = {n: (a, b) for n, a, b in spans}
    overlap = lambda x, y: by[x][0] < by[y][1] and by[y][0] < by[x][1]  # noqa: E731
    assert not overlap("big1", "big2")
    assert all(not overlap("unknown", other) for other in by if other != "unknown")
    with gate.memory(10_000):  # past the budget, alone: admitted
        pass
    assert GpuGate().memory_bytes == 0
    with GpuGate().memory(None) as waited:  # no budget: nothing waits
        assert waited == 0.0


def test_a_request_for_the_whole_memory_budget_is_not_overtaken():
    """While a run of unknown size (the whole budget) waits, a smaller request that comes later waits behind it."""
    gate = GpuGate(memory_bytes=100)
    order, first_in, release = [], threading.Event(), threading.Event()

    def holder():
        with gate.memory(10):
            first_in.set()
            release.wait(5)

    def run(name, nbytes):
        with gate.memory(nbytes):
            order.append(name)
            time.sleep(0.02)

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    first_in.wait(5)
    threads.append(threading.Thread(target=run, args=("unknown", None)))
    threads[-1].start()
    time.sleep(0.05)
    threads.append(threading.Thread(target=run, args=("small", 10)))
    threads[-1].start()
    time.sleep(0.05)
    assert order == []  # the small one fits beside the holder, yet waits behind the unknown one
    release.set()
    for t in threads:
        t.join(timeout=10)
    assert order == ["unknown", "small"]


def test_a_reference_run_on_a_shared_gpu_takes_its_measured_peak_from_the_gate(monkeypatch):
    """The first run of a task's shape holds the gate's whole memory budget and measures its peak; the next asks
    for that peak (with a margin). Off the GPU, or without a gate, nothing is asked (the CUDA calls are stood in
    for: the logic is what is tested here, the GPU run in benchmarks/bench_throughput.py)."""
    from types import SimpleNamespace

    from sandbox import reference as reference_mod
    from sandbox.reference import Reference

    asked, allocated = [], {"now": 100, "peak": 0}

    class Gate:
        def memory(self, nbytes):
            asked.append(nbytes)
            return contextlib.nullcontext(0.0)

    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev=None: allocated["now"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda dev=None: allocated.update(peak=0))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda dev=None: allocated["peak"])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(reference_mod, "_PEAKS", {})
    ref = Reference.__new__(Reference)
    ref.task = SimpleNamespace(path="t.py", overrides={"N": 8})
    ref.device, ref.gate = "cuda:0", Gate()
    with ref._memory_turn():
        allocated["peak"] = 100 + 4000  # the run's passing peak above what was held before it
    with ref._memory_turn():
        pass
    assert asked == [None, int(4000 * reference_mod.PEAK_MARGIN)]
    ref.task = SimpleNamespace(path="t.py", overrides={"N": 16})  # another shape: measured again, alone
    with ref._memory_turn():
        pass
    ref.device = "cpu"
    with ref._memory_turn():
        pass
    ref.device, ref.gate = "cuda:0", None
    with ref._memory_turn():
        pass
    assert asked == [None, int(4000 * reference_mod.PEAK_MARGIN), None]


def test_a_waiting_exclusive_holder_stops_new_shared_ones():
    """Writer preference: once a timing waits, a check that asks later waits behind it."""
    gate = GpuGate()
    order = []
    release_first = threading.Event()

    def first():
        with gate.shared("first"):
            order.append("first")
            release_first.wait(5)

    def timing():
        with gate.exclusive("timing"):
            order.append("timing")
            time.sleep(0.05)
            order.append("timing done")

    def late():
        with gate.shared("late"):
            order.append("late")

    threads = [threading.Thread(target=f) for f in (first, timing, late)]
    threads[0].start()
    time.sleep(0.05)
    threads[1].start()
    time.sleep(0.05)  # the timing now waits for "first"
    threads[2].start()
    time.sleep(0.05)
    assert order == ["first"]
    release_first.set()
    for t in threads:
        t.join(timeout=5)
    assert order == ["first", "timing", "timing done", "late"]


def test_busy_seconds_is_the_union_of_the_holds():
    holds = [Hold(SHARED, "a", 0.0, 2.0, 0.0), Hold(SHARED, "b", 1.0, 3.0, 0.0), Hold(EXCLUSIVE, "c", 5.0, 6.0, 0.0)]
    assert busy_seconds(holds, 0.0, 10.0) == pytest.approx(4.0)
    assert busy_seconds(holds, 2.5, 5.5) == pytest.approx(1.0)
    assert overlapping_exclusive(holds + [Hold(SHARED, "d", 5.5, 7.0, 0.0)]) != []


def test_the_gate_s_holds_are_summed_by_the_work_they_were_for():
    holds = [Hold(SHARED, "a", 0.0, 2.0, 0.0, "reference"), Hold(SHARED, "b", 1.0, 3.0, 0.0, "reference"),
             Hold(SHARED, "b", 3.0, 4.0, 0.0, "call"), Hold(EXCLUSIVE, "c", 5.0, 6.0, 0.0, "time")]
    assert held_by_work(holds, 0.0, 10.0) == pytest.approx({"shared:reference": 4.0, "shared:call": 1.0,
                                                             "exclusive:time": 1.0})
    assert held_by_work(holds, 1.5, 5.5) == pytest.approx({"shared:reference": 2.0, "shared:call": 1.0,
                                                            "exclusive:time": 0.5})


# ---- slots ------------------------------------------------------------------------------------------------------

def test_k_slots_per_gpu_share_one_gate(task, tmp_path, monkeypatch):
    from sandbox.task import load_task

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    made = []
    executor = LocalExecutor(lambda t, d, gpu: made.append(gpu), resolve_device=lambda d: "cuda")
    session = executor.session(load_task(task), RunConfig(task_path=task, device="cuda", gpus=2, checks_per_gpu=3),
                               tmp_path)
    assert session.slots == 6 and session.gpu_ids == (0, 1, 0, 1, 0, 1)
    assert set(executor.gates) == {0, 1} and session.gates is executor.gates
    default = LocalExecutor(resolve_device=lambda d: "cuda").session(load_task(task), RunConfig(
        task_path=task, device="cuda"), tmp_path)
    assert default.slots == CHECKS_PER_GPU and 4 <= CHECKS_PER_GPU <= 8
    cpu = LocalExecutor(resolve_device=lambda d: "cpu").session(load_task(task), RunConfig(task_path=task), tmp_path)
    assert cpu.slots == 1


# ---- the loop, scripted -----------------------------------------------------------------------------------------

class GatedEvaluator:
    """A check that uses its GPU's gate as the harness does, with a verdict that depends on the source alone."""

    gates: dict = {}
    spans: list = []  # (candidate, start, end) of every check
    lock = threading.Lock()

    def __init__(self, task_obj, device, gpu):
        with GatedEvaluator.lock:
            self.gate = GatedEvaluator.gates.setdefault(gpu, GpuGate())
        self.device = device

    def check(self, path: Path, baselines=None, incumbent_ms=None, retime=False) -> CheckResult:
        start = time.monotonic()
        source = path.read_text()
        time.sleep(0.05)  # compiling: no turn at the gate
        with self.gate.shared(path.name):
            time.sleep(0.03)  # correctness
        wrong = "x * 3.0" in source
        timing = None
        if not wrong and self.device == "cuda":
            with self.gate.exclusive(path.name):
                time.sleep(0.03)
            block = int(source.split("BLOCK_SIZE = ")[1].split("\n")[0])
            timing = {"candidate_ms": 1.0, "baselines": {"eager": {"ms": 1.0, "speedup": 1.0 + block / 1e6,
                                                                  "ci_low": 0.5, "ci_high": 1.5}},
                      "roofline": {"pct_of_roofline": 10.0, "bound": "memory"}}
        stage = StageResult(Stage.CORRECTNESS, not wrong, Reason.OUTPUT_MISMATCH if wrong else Reason.OK)
        with GatedEvaluator.lock:
            GatedEvaluator.spans.append((path.name, start, time.monotonic()))
        return CheckResult(task="t", candidate=str(path), device=self.device,
                           verdict=Verdict.REJECTED if wrong else Verdict.ACCEPTED, stage=stage.stage,
                           reason=stage.reason, message="scripted", stages=(stage,), seconds=0.1,
                           timed=timing is not None, timing=timing)

    def close(self):
        pass


def _variants(n: int) -> list[tuple[str, str]]:
    """n distinct proposals: good kernels at several block sizes and wrong ones."""
    out = []
    for i in range(n):
        code = GOOD.replace("BLOCK_SIZE = 1024", f"BLOCK_SIZE = {2 ** (5 + i)}")
        out.append((f"v{i}", WRONG.replace("BLOCK_SIZE = 1024", f"BLOCK_SIZE = {2 ** (5 + i)}") if i % 3 == 2
                    else code))
    return out


def _run(task, tmp_path, name, per_gpu, proposals, *, device="cpu", evaluator_factory=GatedEvaluator):
    fake = FakeProvider("fake:model")
    for note, code in proposals:
        fake.enqueue(fenced(code, note), delay_s=0.01)
    GatedEvaluator.gates, GatedEvaluator.spans = {}, []
    with Archive(tmp_path / f"{name}.db") as archive:
        summary = run_search(RunConfig(task_path=task, budget=len(proposals), device=device, polish=0,
                                       concurrency=per_gpu, samples=per_gpu, checks_per_gpu=per_gpu), archive,
                             provider=fake,
                             evaluator_factory=evaluator_factory)
        rows = {c.reply.split("\n")[0]: (c.verdict, c.stage, c.reason, c.source_sha)
                for c in archive.candidates() if c.origin == "llm"}
    return summary, rows


def test_k_checks_overlap_and_verdicts_match_the_serial_path(task, tmp_path):
    proposals = _variants(6)
    serial, serial_rows = _run(task, tmp_path, "serial", 1, proposals)
    spans_serial = list(GatedEvaluator.spans)
    piped, piped_rows = _run(task, tmp_path, "piped", 3, proposals)
    spans = list(GatedEvaluator.spans)
    assert piped_rows == serial_rows and len(piped_rows) == 6
    assert (piped.progress.accepted, piped.progress.rejected) == (serial.progress.accepted, serial.progress.rejected)

    def most_at_once(spans):
        edges = sorted([(s, 1) for _, s, _ in spans] + [(e, -1) for _, _, e in spans], key=lambda x: (x[0], x[1]))
        now = peak = 0
        for _, step in edges:
            now += step
            peak = max(peak, now)
        return peak

    assert most_at_once(spans_serial) == 1
    assert most_at_once(spans) == 3  # K candidates in flight: their check intervals overlap


def test_on_a_gpu_the_timing_slot_is_never_held_by_two(task, tmp_path, monkeypatch):
    import agent.search.loop as loop_mod

    monkeypatch.setattr(loop_mod, "_device", lambda device: "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    summary, rows = _run(task, tmp_path, "gpu", 4, _variants(8), device="cuda")
    holds = GatedEvaluator.gates[0].holds()
    assert overlapping_exclusive(holds) == []
    timed = [h for h in holds if h.mode == EXCLUSIVE]
    assert len(timed) >= sum(v == "accepted" for v, *_ in rows.values())  # duels' legs are timed too
    checks = sorted(GatedEvaluator.spans, key=lambda s: s[1])
    assert any(b[1] < a[2] for a, b in zip(checks, checks[1:])), "no two checks overlapped"


# ---- the real harness, through the interpreter ------------------------------------------------------------------

@pytest.mark.slow
def test_real_harness_three_at_once_matches_the_serial_path(task, tmp_path):
    """Three checks at once (three zygotes) give the verdicts, stages and reasons of one at a time."""
    proposals = [("good", GOOD.replace("BLOCK_SIZE = 1024", "BLOCK_SIZE = 512")), ("wrong", WRONG),
                 ("syntax", SYNTAX_ERROR), ("good256", GOOD.replace("BLOCK_SIZE = 1024", "BLOCK_SIZE = 256"))]

    def run(name, per_gpu):
        fake = FakeProvider("fake:model")
        for note, code in proposals:
            fake.enqueue(fenced(code, note))
        executor = LocalExecutor(resolve_device=lambda d: "cpu")
        with Archive(tmp_path / f"{name}.db") as archive:
            run_search(RunConfig(task_path=task, budget=len(proposals), device="cpu", polish=0, concurrency=per_gpu,
                                 samples=per_gpu,
                                 checks_per_gpu=per_gpu), archive, provider=fake, executor=executor)
            rows = {c.reply.split("\n")[0]: (c.verdict, c.stage, c.reason,
                                             [s["stage"] for s in (c.diagnostics or {}).get("stages", [])])
                    for c in archive.candidates() if c.origin == "llm"}
        return rows, executor.gates[0].holds()

    serial, _ = run("serial", 1)
    piped, holds = run("piped", 3)
    assert piped == serial
    assert serial["good"][:3] == ("accepted", "robustness", "ok") and serial["wrong"][2] == "output_mismatch"
    assert {h.mode for h in holds} == {SHARED} and len({h.holder for h in holds}) >= 3
    # each hold says what it was for: the parent's steps and the candidate's requests (its first call, which
    # compiles, takes no turn)
    assert {"inputs", "reference", "compare", "call", "soak", "rebuild"} <= {h.work for h in holds}
    # (that checks overlap is test_k_checks_overlap_and_verdicts_match_the_serial_path's, with scripted times: here
    # a check's gated work is a fraction of a second beside its loading, so on a loaded machine none may overlap)


def test_the_benchmark_reads_where_a_candidates_seconds_went():
    from benchmarks.bench_throughput import parts_of

    stages = tuple(StageResult(st, True, Reason.OK, seconds=sec) for st, sec in (
        (Stage.STATIC, 0.01), (Stage.COMPILE, 0.3), (Stage.SMOKE, 1.2), (Stage.CORRECTNESS, 0.2),
        (Stage.ROBUSTNESS, 0.9), (Stage.TIMING, 1.5)))
    result = CheckResult(task="t", candidate="c.py", device="cuda", verdict=Verdict.ACCEPTED, stage=Stage.TIMING,
                         reason=Reason.OK, message="ok", stages=stages, seconds=4.5, timed=True,
                         costs={"spawn_s": 0.05, "gpu_wait_s": 0.4, "timing_wait_s": 0.7})
    assert parts_of(result.to_dict()) == pytest.approx({
        "static": 0.01, "load": 0.35, "compile": 1.2, "correctness": 0.2, "robustness": 0.9, "timing": 1.5,
        "gpu_wait": 0.4, "timing_wait": 0.7})


def test_the_benchmark_tells_kernels_apart_and_rejections_by_their_size():
    from agent.search.tuner import compiled_signature as kernel_signature
    from benchmarks.bench_throughput import rejection_kind

    def diag(warps, block):
        return {"timing": {"kernels": [{"name": "k", "kernel": "k_0", "num_warps": warps, "num_stages": 1,
                                        "constants": {"BLOCK": block}}]}}
    assert kernel_signature(diag(4, 1024)) == kernel_signature(diag(4, 1024))
    assert len({kernel_signature(diag(w, b)) for w in (4, 8) for b in (1024, 2048)}) == 4
    assert kernel_signature({}) is None and kernel_signature({"timing": {"kernels": []}}) is None
    few = rejection_kind("correctness", "output_mismatch", "output 0: 2/67108864 elements outside tolerance; worst")
    many = rejection_kind("correctness", "output_mismatch", "output 1: 25311344/67108864 elements outside tolerance")
    assert few.endswith("(a few elements)") and many.endswith("(many elements)")
    assert rejection_kind("timing", "harness_error", "out of memory") == "timing/harness_error"


def test_the_benchmark_says_when_a_run_ended_with_fewer_checks_at_once():
    from benchmarks.bench_throughput import _fewer

    assert _fewer({"checks_per_gpu": 4, "checks_at_end": 4}) == ""
    assert _fewer({"checks_per_gpu": 4, "checks_at_end": 3}) == ", 3 at the end: the GPU's memory was full"
    assert _fewer({"checks_per_gpu": 4}) == ""  # rows from before the column
    assert _fewer({"checks_per_gpu": 4, "checks_at_end": 8, "gpus": 2}) == ""  # over both GPUs
    assert _fewer({"checks_per_gpu": 4, "checks_at_end": 7, "gpus": 2}) == ", 7 at the end: the GPU's memory was full"


def test_the_benchmark_s_gpu_shares_are_each_gpu_s_mean():
    """Two GPUs, one busy the whole window and one idle: each was busy half the time on average, not the whole
    window as the union of their holds would say."""
    from benchmarks.bench_throughput import first_rounds, mean_busy
    from sandbox.gate import Hold

    busy = [Hold("shared", "a.py", 0.0, 6.0, 0.0), Hold("exclusive", "b.py", 4.0, 10.0, 0.0)]
    assert mean_busy([busy, []], 0.0, 10.0) == pytest.approx(0.5)
    assert mean_busy([busy], 2.0, 10.0) == pytest.approx(1.0)
    assert "first round" in first_rounds({"checks_per_gpu": 4, "gpus": 2, "proposals": 12})


def test_the_benchmark_counts_the_checks_in_flight_over_its_window():
    """Four slots over a 10 s window: two checks throughout, a third from 2 s to 5 s, and one retried check whose
    first try ended before the window (not counted) and whose second ran past its end (counted up to it)."""
    from agent.search.executors import CheckSpan
    from benchmarks.bench_throughput import in_flight_shares

    spans = [CheckSpan(0, 0, "a.py", -5.0, 11.0), CheckSpan(1, 0, "b.py", 0.0, 5.0), CheckSpan(2, 0, "c.py", 2.0, 5.0),
             CheckSpan(1, 0, "d.py", 5.0, 12.0), CheckSpan(3, 0, "e.py", -4.0, -1.0), CheckSpan(3, 0, "e.py", -1.0, 0.0)]
    shares = in_flight_shares(spans, 0.0, 10.0)
    assert shares == pytest.approx({3: 0.3, 2: 0.7}) and list(shares) == [3, 2]
    assert in_flight_shares([], 0.0, 10.0) == {0: 1.0}


def test_the_benchmark_reads_the_gpu_s_memory_up_to_a_moment():
    """The most memory in use read up to the starting kernel's verdict is that check's (the only one then)."""
    from benchmarks.bench_throughput import NvmlSampler

    sampler = NvmlSampler(0, every_s=60.0)
    sampler.stop()
    sampler.memory = [(1.0, 10.0, 2.0, 1.0), (2.0, 30.0, 2.0, 1.0), (3.0, 70.0, 9.0, 5.0), (4.0, 20.0, 9.0, 1.0)]
    assert sampler.peak(2.5) == 30.0 and sampler.peak(9.0) == 70.0 and sampler.peak(0.5) is None
    assert sampler.peak() == 70.0 and sampler.peak(column=NvmlSampler.RESERVED) == 9.0


def test_the_benchmark_asks_for_gpus_it_can_have(capsys):
    from benchmarks.bench_throughput import main

    assert main(["--device", "cpu", "--gpus", "2", "--no-csv"]) == 2
    assert main(["--device", "cpu", "--gpus", "0", "--no-csv"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["--gpus 2 needs --device cuda: on the CPU the run has its interpreter workers, no GPUs",
                   "--checks-per-gpu, --gpus and --check-footprint must be at least 1 and --seconds above 0"]


def test_the_benchmark_says_when_a_window_holds_one_round():
    from benchmarks.bench_throughput import first_rounds
    assert "the rate is the first round's" in first_rounds({"checks_per_gpu": 4, "proposals": 5})
    assert first_rounds({"checks_per_gpu": 4, "proposals": 8}) == ""


def test_the_loop_overhead_benchmark_times_the_coordinator_alone(tmp_path):
    """Its evaluator answers at once, so what it reports is the loop's own seconds between a verdict and the next
    check, for every proposal the budget allows."""
    from benchmarks.bench_loop_overhead import ROOT, measure
    row = measure(ROOT / "tasks" / "swiglu_fwd.py", slots=2, budget=4, check_s=0.05)
    assert row["proposals"] == 4 and 0 <= row["first_submit_s"] < 5 and 0 <= row["verdict_to_submit_s"] < 5


def test_the_parent_s_cpu_is_put_down_to_the_code_that_spent_it():
    """A thread that spins in one function for 0.3 s of CPU: the sampler puts most of that CPU down to it, by
    name, and next to nothing to a thread that sleeps."""
    from benchmarks.thread_cpu import ThreadCpu, thread_cpu_s

    def spin_here() -> None:
        end = time.monotonic() + 10.0  # however busy the machine, its own CPU seconds end it
        while time.thread_time() < 0.3 and time.monotonic() < end:
            pass

    sampler = ThreadCpu(every_s=0.02).start()
    threads = [threading.Thread(target=spin_here), threading.Thread(target=time.sleep, args=(0.5,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sampler.stop()
    spent = dict(sampler.spent)
    mine = sum(cpu for at, cpu in spent.items() if at.startswith("test_pipeline.py:spin_here"))
    assert mine >= 0.2, spent
    assert sum(cpu for at, cpu in spent.items() if "sleep" in at) < 0.05
    assert thread_cpu_s(threading.get_native_id()) > 0 and thread_cpu_s(2**31 - 1) is None
