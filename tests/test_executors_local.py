"""LocalExecutor / LocalSession: which GPU each evaluation slot uses (`gpu_ids`), with a fake evaluator factory."""
import threading
import time

import pytest
import torch

from agent.search.executors import ExecutorError, LocalExecutor, LocalSession
from agent.search.runs import RunConfig
from sandbox.task import load_task
from tests.test_loop import TASK


@pytest.fixture
def task(tmp_path):
    path = tmp_path / "scale.py"
    path.write_text(TASK)
    return load_task(path)


class Recorder:
    """Evaluator factory: remembers (device, gpu) of each evaluator; check() answers which GPU it ran on."""

    def __init__(self):
        self.made = []
        self.lock = threading.Lock()

    def __call__(self, task, device, gpu):
        with self.lock:
            self.made.append((device, gpu))

        class Evaluator:
            closed = False

            def check(self, candidate, baselines=None, incumbent_ms=None, retime=False):
                return (device, gpu, candidate.name, baselines)

            def close(self):
                self.closed = True
        return Evaluator()


def config(task, **over):
    """One check per GPU: these tests are about which GPU a slot uses (tests/test_pipeline.py: several per GPU)."""
    return RunConfig(task_path=task.path, **{"device": "cuda", "checks_per_gpu": 1, **over})


def test_slot_i_evaluates_on_gpu_ids_i(task, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    factory = Recorder()
    executor = LocalExecutor(factory, resolve_device=lambda d: "cuda", gpu_ids=(3, 1))
    session = executor.session(task, config(task, gpus=1), tmp_path)  # gpu_ids, not --gpus, sets the slots
    assert session.device == "cuda" and session.slots == 2
    got = [session.submit(slot, tmp_path / f"c{slot}.py").result(timeout=10) for slot in (0, 1, 0)]
    assert got == [("cuda", 3, "c0.py", None), ("cuda", 1, "c1.py", None), ("cuda", 3, "c0.py", None)]
    assert sorted(factory.made) == [("cuda", 1), ("cuda", 3)]  # one warm evaluator per slot, reused
    assert session.submit(1, tmp_path / "f.py", ("eager", "compile")).result(timeout=10)[3] == ("eager", "compile")
    session.close()
    assert session.evaluators == {}


def test_the_executor_lists_each_check_its_slots_ran_with_its_span(task, tmp_path, monkeypatch):
    """A check that fails is listed too (a retried check is two spans): what `bench_throughput` counts the checks
    in flight from."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)

    class Failing(Recorder):
        def __call__(self, task, device, gpu):
            evaluator = super().__call__(task, device, gpu)
            if gpu == 1:
                evaluator.check = lambda *a, **k: 1 / 0
            return evaluator
    executor = LocalExecutor(Failing(), resolve_device=lambda d: "cuda")
    session = executor.session(task, config(task, gpus=2), tmp_path)
    before = time.monotonic()
    assert session.submit(0, tmp_path / "a.py").result(timeout=10)[2] == "a.py"
    with pytest.raises(ZeroDivisionError):
        session.submit(1, tmp_path / "b.py").result(timeout=10)
    session.close()
    assert [(c.slot, c.gpu, c.candidate) for c in executor.checks] == [(0, 0, "a.py"), (1, 1, "b.py")]
    assert all(before <= c.start <= c.end <= time.monotonic() for c in executor.checks)


def test_without_gpu_ids_slot_i_is_gpu_i_for_gpus_slots(task, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    factory = Recorder()
    session = LocalExecutor(factory, resolve_device=lambda d: "cuda").session(task, config(task, gpus=2), tmp_path)
    assert session.slots == 2 and session.gpu_ids == (0, 1)
    assert [session.submit(s, tmp_path / "c.py").result(timeout=10)[1] for s in (1, 0)] == [1, 0]
    with pytest.raises(ExecutorError, match="--gpus 3 asks for more GPUs than the 2 visible"):
        LocalExecutor(factory, resolve_device=lambda d: "cuda").session(task, config(task, gpus=3), tmp_path)


def test_the_highest_gpu_id_must_be_visible(task, tmp_path, monkeypatch):
    """One slot on GPU 2 needs three visible GPUs, though it is a single GPU."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ExecutorError, match="GPU 2 asks for more GPUs than the 2 visible"):
        LocalExecutor(Recorder(), resolve_device=lambda d: "cuda", gpu_ids=(2,)).session(task, config(task), tmp_path)
    session = LocalExecutor(Recorder(), resolve_device=lambda d: "cuda", gpu_ids=(1,)).session(task, config(task),
                                                                                                tmp_path)
    assert session.slots == 1 and session.submit(0, tmp_path / "c.py").result(timeout=10)[1] == 1


def test_on_the_cpu_one_slot_whatever_the_gpus(task, tmp_path):
    factory = Recorder()
    session = LocalExecutor(factory, resolve_device=lambda d: "cpu", gpu_ids=(1,)).session(
        task, config(task, device="cpu", gpus=2), tmp_path)
    assert session.device == "cpu" and session.slots == 1
    assert session.submit(0, tmp_path / "c.py").result(timeout=10)[:2] == ("cpu", 0)


def test_bad_gpu_ids_are_refused(task):
    for bad in ((), (-1,), (0, 0)):
        with pytest.raises(ValueError, match="gpu_ids"):
            LocalExecutor(gpu_ids=bad)
    with pytest.raises(ValueError, match="2 slot"):
        LocalSession(task, "cuda", 2, Recorder(), gpu_ids=(0,))


def test_a_task_of_gigabytes_is_checked_fewer_at_a_time():
    """The checks per GPU shrink to what the GPU holds (about 16x the inputs a check, beside two timings' input sets
    and kept outputs), never below one; a small task keeps what was asked; a task whose inputs cannot be probed
    too."""
    from types import SimpleNamespace

    from agent.search.executors import CHECKS_PER_GPU, checks_that_fit
    gib = 1 << 30
    relu = SimpleNamespace(input_bytes=lambda: int(6.4 * gib))  # KernelBench level 1's ReLU: 4096 x 393216 fp32
    swiglu = SimpleNamespace(input_bytes=lambda: 2 * 16384 * 14336 * 2)  # tasks/swiglu_fwd.py: 8 ran out (H200)
    small = SimpleNamespace(input_bytes=lambda: 64 << 20)
    def broken():
        raise RuntimeError("get_inputs failed")
    h200 = int(139.8 * gib)
    assert checks_that_fit(relu, h200) == 1
    assert checks_that_fit(relu, 40 * gib) == 1
    assert checks_that_fit(swiglu, h200, 8) == 4
    # an 80 GB H100: two timings' input sets and kept outputs take an eighth of it each (timing_child.set_budget)
    attention = SimpleNamespace(input_bytes=lambda: 4 * 4 * 32 * 4096 * 128 * 2)  # q, k, v, do of attention_fwd_bwd
    assert checks_that_fit(swiglu, int(79.2 * gib), 8) == 2
    assert checks_that_fit(attention, int(79.2 * gib), 8) == 4
    assert checks_that_fit(small, h200) == CHECKS_PER_GPU
    assert checks_that_fit(small, h200, 16) == 16
    assert checks_that_fit(SimpleNamespace(input_bytes=broken), h200) == CHECKS_PER_GPU


def test_reference_peaks_get_what_the_timings_and_checks_leave():
    """The memory budget of the parent's reference runs: the GPU less two timings' holdings and the checks' own
    footprints; at least a byte (the gate then runs them one at a time), and none off the GPU."""
    from types import SimpleNamespace

    from agent.search.executors import CHECK_FOOTPRINT, parent_memory_budget, timing_bytes
    gib = 1 << 30
    attention = SimpleNamespace(input_bytes=lambda: 4 * 4 * 32 * 4096 * 128 * 2)  # q, k, v, do of attention_fwd_bwd
    h200 = int(139.8 * gib)
    inputs = attention.input_bytes()
    assert parent_memory_budget(attention, h200, 4) == h200 - 2 * timing_bytes(inputs, h200) - 4 * CHECK_FOOTPRINT * inputs
    assert parent_memory_budget(attention, h200, 64) == 1
    assert parent_memory_budget(attention, 0, 4) == 0
    def broken():
        raise RuntimeError("get_inputs failed")
    assert parent_memory_budget(SimpleNamespace(input_bytes=broken), h200, 4) == 1


def test_input_bytes_are_probed_without_allocating():
    from pathlib import Path

    from sandbox.task import load_task
    task = load_task(Path(__file__).parent.parent / "tasks" / "rmsnorm_fwd.py", rescale=False)
    consts = task.current_constants()
    assert task.input_bytes() == consts["M"] * consts["N"] * 2  # one bf16 (M, N) input


def test_every_slot_is_warmed_as_the_session_opens_and_a_first_check_waits_for_its_warm_up(task, tmp_path):
    """The starting kernel's check takes one slot; the others start their workers meanwhile, not when their first
    candidates come. A check that comes during its slot's warm-up runs after it, on the same evaluator."""
    release, log, lock = threading.Event(), [], threading.Lock()

    class Warmed:
        def __init__(self, task, device, gpu):
            self.gpu, self.made = gpu, threading.Lock()

        def warm(self):
            with self.made:
                with lock:
                    log.append(("warm", self.gpu))
                release.wait(10)

        def check(self, candidate, baselines=None, incumbent_ms=None, retime=False):
            with self.made:
                with lock:
                    log.append(("check", self.gpu))
            return self.gpu

        def close(self):
            pass

    session = LocalSession(task, "cpu", 3, Warmed, gpu_ids=(0, 1, 2))
    for _ in range(200):
        if len(log) == 3:
            break
        threading.Event().wait(0.01)
    assert sorted(log) == [("warm", 0), ("warm", 1), ("warm", 2)]  # before any candidate was submitted
    first = session.submit(1, tmp_path / "c.py")
    assert not first.done()  # its slot is still warming
    release.set()
    assert first.result(timeout=10) == 1 and log[-1] == ("check", 1)
    assert len(session.evaluators) == 3  # the warm-up's evaluator is the one the check used
    session.close()


def test_a_harness_evaluator_warmed_then_checked_and_closed(tmp_path):
    """The real evaluator on the CPU: `warm` starts the worker and works out the task's shapes (of the task rescaled
    for the CPU, which every later check reuses); the checks then run on that harness, and a closed evaluator makes
    no worker again."""
    from pathlib import Path

    from agent.search.executors import HarnessEvaluator

    root = Path(__file__).resolve().parent.parent
    ev = HarnessEvaluator(load_task(root / "tasks" / "rmsnorm_fwd.py"), "cpu", 0, timeout_s=120,
                          baselines=("eager",), workdir=tmp_path)
    ev.warm()
    harness = ev._harness
    assert harness is not None and harness.zygote.health() is None and harness._variants
    assert ev.check(root / "tests" / "candidates" / "rmsnorm_honest.py").accepted
    assert ev._harness is harness and len(harness._variants) == 1  # the check's task is the warm-up's
    ev.close()
    with pytest.raises(RuntimeError, match="closed"):
        ev.warm()


def test_closing_during_a_warm_up_does_not_wait_for_it_and_leaves_no_worker(tmp_path, monkeypatch):
    """A run that ends while its slots still start their workers returns at once; the warm-up closes the harness
    it made as it ends, and a check that comes after the close makes none."""
    import sandbox.harness as harness_mod
    from agent.search.executors import HarnessEvaluator

    started, go, closed = threading.Event(), threading.Event(), []

    class SlowHarness:
        def __init__(self, device, workdir=None):
            started.set()
            go.wait(10)

        def _ensure_zygote(self):
            pass

        def load(self, task):
            return task

        def _variant_tasks(self, task):
            return []

        def close(self):
            closed.append(self)

    monkeypatch.setattr(harness_mod, "Harness", SlowHarness)
    ev = HarnessEvaluator(None, "cpu", 0, timeout_s=1, baselines=("eager",), workdir=tmp_path)
    warming = threading.Thread(target=ev.warm)
    warming.start()
    assert started.wait(10)
    ev.close()  # returns although the warm-up holds the evaluator
    assert closed == [] and warming.is_alive()
    go.set()
    warming.join(10)
    assert len(closed) == 1 and ev._harness is None
    with pytest.raises(RuntimeError, match="closed"):
        ev.check(tmp_path / "c.py")
