"""The check's stage runners: compile, smoke, correctness, robustness (with its soak) and timing, and what they
share: one call of the candidate with its outputs read back and checked, and the comparison with the reference.

sandbox.harness.Harness.check runs them in order on one candidate's process; each takes the harness (its requests
to the child, its turn at the GPU) and the check in progress, and returns its value and the stage's details, or
raises Rejected.
"""
from __future__ import annotations

import math
import random
import time
from typing import TYPE_CHECKING, Any

import torch

from . import tolerance, warmer
from .handback import claim, poisoned
from .records import Reason, Rejected, Stage
from .reference import Reference
from .timing_child import derive

if TYPE_CHECKING:
    from .harness import Harness, _Run
    from .reference import Expected
    from .task import Task

# The soak's calls: (seconds of the candidate's time, most calls) by device, and the fewest. On the CPU interpreter a
# call costs milliseconds even at the smallest shape, so the soak stays short; on a GPU cheap calls run by hundreds.
SOAK_BUDGET_S = {"cpu": (0.2, 64), "cuda": (1.0, 2000)}
SOAK_MIN_CALLS = 3
# The soak's calls go to the child in requests of about this much wall time each, and in at most SOAK_SLICES: a
# request holds the GPU's gate (shared) while it runs, and a timing waiting for its exclusive turn waits for every
# shared holder to finish, while the other checks wait behind it (one 1 s soak in a request made every timing of a
# search wait that long); each slice waits its own turn behind the timings, so a soak is cut into few.
SOAK_SLICE_S, SOAK_SLICES = 0.1, 4
# The soak's calls whose inputs the child compares bitwise with copies taken before the call, besides the verified
# ones: the copy and the comparison are three passes over the inputs, more GPU work than a memory-bound call's own,
# and every other call of a check (smoke, correctness, robustness, the sampled timed calls) compares its inputs.
SOAK_INPUT_CHECKS = 8


def compile_candidate(harness: Harness, run: _Run) -> tuple[Reference, dict[str, Any]]:
    t0 = time.monotonic()
    reference = Reference(run.task, run.device, run.rng.randrange(1 << 31), gate=run.options.gate)
    reference_s = time.monotonic() - t0
    msg = harness._setup_msg(run, str(run.candidate), reference, harness._scratch(run.child))
    reply = harness._request(run, Stage.COMPILE, msg, within=run.within("the setup (import and ModelNew(...))"))
    if warmer.wanted(run):  # the robustness shapes' first calls made beside the next stages (sandbox.warmer)
        run.warmer = warmer.Warmer(harness, run, reference)
        run.warmer.start()
    run.network_isolated = bool(reply.get("network_isolated"))
    laps = reply.get("laps") if isinstance(reply.get("laps"), dict) else {}
    return reference, {"network_isolated": run.network_isolated, "reference_s": reference_s,
                       "filesystem_read_only": bool(reply.get("filesystem_read_only")),
                       "planted_files": len(msg["compiled"]),  # its own kept kernels sent (sandbox.compiled)
                       "capabilities_dropped": bool(reply.get("capabilities_dropped")),
                       "walls": reply.get("walls") if isinstance(reply.get("walls"), dict) else {}, **laps}


# The first call's expected values (the reference's outputs, the float64 truth, the alternates') are kept on the
# device for the robustness stage's repeat of that call up to this size; larger ones are computed again there, so
# that a check does not hold them through every correctness call (attention fwd+bwd: 3.2 GB of a check's 12 GB in
# the harness's process, where four checks at once filled an H100's 80 GB).
KEPT_EXPECTED_BYTES = 1 << 30


def smoke(harness: Harness, run: _Run, reference: Reference) -> tuple[dict[str, Any], dict[str, Any]]:
    seed = run.rng.randrange(1 << 31)
    with run.lap("inputs"), harness._gpu(run, work="inputs"):
        inputs = run.task.make_inputs(seed, run.task.meta.distributions[0], run.device)
    reply, expected = call(harness, run, Stage.SMOKE, reference, inputs)
    warmer.note_first_call(run, run.walls[id(reference)][0])  # the parent's wall time of it, compile included
    first = {"inputs": inputs, "outputs": reply["outputs"], "expected": expected,
             "label": f"{run.task.meta.distributions[0]} inputs"}
    return first, {"trace": reply.get("trace"), "seconds": reply.get("seconds")}


def correctness(harness: Harness, run: _Run, reference: Reference,
                first: dict[str, Any]) -> tuple[None, dict[str, Any]]:
    compare(harness, run, Stage.CORRECTNESS, first["outputs"], first["expected"], first["label"])
    if first["expected"].held_bytes > KEPT_EXPECTED_BYTES:  # the robustness stage's repeat computes it again
        first["expected"] = None
    checked = [run.task.meta.distributions[0]]
    if run.options.retime:  # verified in full by an earlier check: the first call only, then the timing
        return None, {"distributions": checked, "retime": True}
    rest = list(run.task.meta.distributions[1:])
    run.rng.shuffle(rest)  # no fixed order of calls to count on
    for dist in rest:
        with run.lap("inputs"), harness._gpu(run, work="inputs"):
            inputs = run.task.make_inputs(run.rng.randrange(1 << 31), dist, run.device)
        reply, expected = call(harness, run, Stage.CORRECTNESS, reference, inputs)
        compare(harness, run, Stage.CORRECTNESS, reply["outputs"], expected, f"{dist} inputs")
        checked.append(dist)
        del reply, expected, inputs  # not alive beside the next distribution's reference run
    return None, {"distributions": checked}


def robustness(harness: Harness, run: _Run, reference: Reference,
               first: dict[str, Any]) -> tuple[None, dict[str, Any]]:
    if run.warmer is not None:  # the shapes' kernels it compiled go into this process's cache; it is ended here
        planted = harness._request(run, Stage.ROBUSTNESS, {"op": "plant", "files": run.warmer.finish()})
        run.warmer.planted = int(planted.get("planted") or 0)
    # Repeat the first call on the same values at fresh addresses: a deterministic op must agree bitwise.
    reply, expected = call(harness, run, Stage.ROBUSTNESS, reference, first["inputs"], first["expected"])
    for i, (a, b) in enumerate(zip(first["outputs"], reply["outputs"])):
        if run.task.meta.deterministic and not torch.equal(_bits(a), _bits(b)):
            diff = int((_bits(a) != _bits(b)).sum())
            raise Rejected(Stage.ROBUSTNESS, Reason.NONDETERMINISTIC, f"output {i} differs between two runs on the "
                          f"same inputs in {diff} of {a.numel()} elements (a race or an uninitialised read?)")
    compare(harness, run, Stage.ROBUSTNESS, reply["outputs"], expected, "a repeat of the first inputs")
    first.clear()  # the smoke call's inputs, outputs and float64 truth are done with: the shapes below need the room
    del expected
    shapes = []
    with run.lap("variants"):
        variants = harness._variant_tasks(run.task)
    run.rng.shuffle(variants)
    tried = [(float(reply.get("seconds") or 0.0), run.task, reference)]  # the soak takes the cheapest shape
    del reply
    return_cached(run)
    for variant, vtask in variants:
        with run.lap("reference_build"):
            vref = Reference(vtask, run.device, reference.model_seed, gate=run.options.gate)
        with run.lap("rebuild"):
            harness._request(run, Stage.ROBUSTNESS, {"op": "rebuild", "init_inputs": vref.init_inputs(),
                                                  "state_dict": vref.state_dict(),
                                                  "seed": reference.model_seed},
                          within=run.within("the rebuild at a new shape"))
        with run.lap("inputs"), harness._gpu(run, work="inputs"):
            inputs = vtask.make_inputs(run.rng.randrange(1 << 31), "normal", run.device)
        reply, expected = call(harness, run, Stage.ROBUSTNESS, vref, inputs)
        label = "shape " + ", ".join(f"{k}={v}" for k, v in variant.items())
        compare(harness, run, Stage.ROBUSTNESS, reply["outputs"], expected, label)
        shapes.append(variant)
        tried.append((float(reply.get("seconds") or 0.0), vtask, vref))
        del reply, expected, inputs
        return_cached(run)
    seconds, soak_task, soak_ref = min(tried, key=lambda t: t[0])
    if soak_ref is not tried[-1][2]:
        with run.lap("rebuild"):
            harness._request(run, Stage.ROBUSTNESS, {"op": "rebuild", "init_inputs": soak_ref.init_inputs(),
                                                  "state_dict": soak_ref.state_dict(),
                                                  "seed": reference.model_seed},
                          within=run.within("the rebuild at the soak's shape"))
    soaked = soak(harness, run, soak_task, soak_ref, seconds)
    return None, {"shapes": shapes, "repeat_bitwise": run.task.meta.deterministic, "soak": soaked,
                  **({"warmed": run.warmer.warmed, "planted": run.warmer.planted} if run.warmer is not None else {})}


def soak(harness: Harness, run: _Run, task: Task, reference: Reference, seconds: float) -> dict[str, Any]:
    """Many calls back to back at the model's current shape (the cheapest tried), on fresh inputs: a number
    drawn log-uniformly up to what SOAK_BUDGET_S allows at this call's time, so a kernel that turns to a stored
    output after its first N calls cannot know N's safe value. The last call and one other drawn at random are
    verified here; the child checks every call as any other (trace, state), and compares the inputs of those two and
    of SOAK_INPUT_CHECKS others drawn at random with their copies from before the call. The calls go in slices of about
    SOAK_SLICE_S each, at most SOAK_SLICES (the child keeps the base sets between them), each slice its own turn at
    the GPU's gate."""
    n = soak_length(run.rng, seconds, run.device.split(":")[0])
    checked = sorted({n - 1} | set(run.rng.sample(range(n - 1), 1)))  # each costs a reference and a compare
    inputs_checked = set(checked) | set(run.rng.sample(range(n), min(n, SOAK_INPUT_CHECKS)))
    dists = task.meta.distributions
    with run.lap("inputs"), harness._gpu(run, work="inputs"):
        base = [task.make_inputs(run.rng.randrange(1 << 31), dist, run.device)
                for dist in (dists[0], run.rng.choice(dists))]
    expected = []
    for k in checked:
        with run.lap("reference"), harness._gpu(run, work="reference"):
            expected.append(reference.run(derive(base, k, task.meta.fixed_inputs)))
    per_slice = max(1, -(-n // SOAK_SLICES), int(SOAK_SLICE_S / max(run.own_s(reference) or seconds, 1e-6)))
    outs: list[Any] = []
    structure = expected[0].structure
    for start in range(0, n, per_slice):
        stop = min(n, start + per_slice)
        mine = [j for j, k in enumerate(checked) if start <= k < stop]
        used: set[int] = set()
        msg: dict[str, Any] = {"op": "soak", "n": n, "start": start, "stop": stop,
                               "checked": [checked[j] for j in mine], "fixed": list(task.meta.fixed_inputs),
                               "inputs_checked": sorted(k for k in inputs_checked if start <= k < stop)}
        buffers: list[torch.Tensor | None] = []
        with run.lap("ship"):
            if start == 0:  # the child keeps its copies of the base sets until the last slice
                msg["base"] = [run.lending.ship(b, used)[0] for b in base]
            if run.device != "cpu" and mine:  # the checked calls' outputs come back into lent GPU buffers
                msg["out_buffers"], buffers = run.lending.ship([poisoned(r.shape, r.dtype, r.device)
                                                                for j in mine for r in expected[j].ref], used)
        if start == 0:
            del base  # the lent copies are what the child derives its calls' inputs from
            return_cached(run)
        within = run.within(f"calls {start + 1} to {stop} of the soak's {n}", reference, calls=stop - start)
        with run.lap("soak"):
            reply = harness._request(run, Stage.ROBUSTNESS, msg, within=within,
                                     max_bytes=4 * sum(expected[j].nbytes for j in mine) + (1 << 24))
        run.calls += stop - start
        run.call_seconds += float(reply.get("seconds") or 0.0)
        got = claim(reply.get("outputs"), buffers)
        if not isinstance(got, list) or len(got) != len(expected[0].ref) * len(mine) or \
                (mine and reply.get("structure") != structure):
            outs = None
            break
        outs += got
    per = len(expected[0].ref)
    if not isinstance(outs, list) or len(outs) != per * len(checked) or not all(isinstance(t, torch.Tensor)
                                                                                for t in outs):
        raise Rejected(Stage.ROBUSTNESS, Reason.OUTPUT_SHAPE, f"the candidate's outputs over {n} calls in a row "
                      "did not come back as its single calls' did")
    for j, (k, exp) in enumerate(zip(checked, expected)):
        got = outs[j * per:(j + 1) * per]
        for i, (g, r) in enumerate(zip(got, exp.ref)):
            if g.shape != r.shape or g.dtype != r.dtype:
                raise Rejected(Stage.ROBUSTNESS, Reason.OUTPUT_SHAPE, f"call {k + 1} of {n} in a row: output {i} "
                              f"is {list(g.shape)} {g.dtype}, expected {list(r.shape)} {r.dtype}")
        compare(harness, run, Stage.ROBUSTNESS, [g.to(r.device) for g, r in zip(got, exp.ref)], exp,
                      f"call {k + 1} of {n} in a row (fresh inputs each call)")
    return {"calls": n, "verified": len(checked)}


def timing(harness: Harness, run: _Run, reference: Reference) -> tuple[dict[str, Any], dict[str, Any]]:
    from . import timing_parent
    if run.device != "cpu":  # all of the parent's cache goes back, for the child's input sets, baselines and outputs
        torch.cuda.empty_cache()
    return timing_parent.run(harness, run, reference)


# Cached but unused parent memory past which it is handed back to the driver before the child's next request.
CACHED_KEPT_BYTES = 1 << 30
CALL_ROOM = 4  # the free GPU memory a call should find, in multiples of its inputs' and outputs' bytes


def return_cached(run: _Run, room: float = math.inf) -> None:
    """The parent's freed but cached GPU blocks (float64 truths, earlier shapes' inputs) go back to the driver when
    they pass CACHED_KEPT_BYTES and the GPU has less than `room` bytes free: the child's process allocates from what
    is left of the same GPU, and a full-size task's next call needs the room; a small task keeps its cache (no
    allocation churn from check to check, and no device-wide wait inside the driver's free)."""
    if run.device == "cpu" or _idle_bytes(run.device) <= CACHED_KEPT_BYTES:
        return
    if room == math.inf or torch.cuda.mem_get_info(run.device)[0] < room:
        with run.lap("empty_cache"):
            torch.cuda.empty_cache()


# The idle cache a finished check may leave in the parent, as a share of the GPU's memory (return_idle).
IDLE_SHARE = 1 / 16


def return_idle(device: str) -> None:
    """At a check's end (its process dead, its lent blocks freed): the parent's cached but unused blocks go back to
    the driver when they pass IDLE_SHARE of the GPU. A check's freed blocks stay in the pool of its slot's stream
    (Harness._parent_stream), which no other slot's stream allocates from and no candidate's process can use, so
    each slot's pool would keep that slot's own peak while it waits for its next candidate (at attention fwd+bwd,
    several GB a slot). A small task's cache stays."""
    if device == "cpu":
        return
    if _idle_bytes(device) > max(CACHED_KEPT_BYTES, IDLE_SHARE * torch.cuda.get_device_properties(device).total_memory):
        torch.cuda.empty_cache()


def _idle_bytes(device: str) -> int:
    """The parent's GPU bytes cached by PyTorch's allocator but held by no tensor."""
    return torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def call_room(inputs: list[Any], expected: Expected) -> int:
    """The free GPU memory a call's process should find: CALL_ROOM times its inputs and outputs (its own copies,
    the outputs it returns and hands back, a kernel's workspace), and CACHED_KEPT_BYTES besides."""
    inputs_bytes = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    return CALL_ROOM * (inputs_bytes + expected.nbytes) + CACHED_KEPT_BYTES


def call(harness: Harness, run: _Run, stage: Stage, reference: Reference, inputs: list[Any],
         expected: Expected | None = None) -> tuple[dict[str, Any], Expected]:
    if expected is None:
        with run.lap("reference"), harness._gpu(run, work="reference"):
            expected = reference.run(inputs)
    return_cached(run, call_room(inputs, expected))  # what the last timing validation or reference left cached
    used: set[int] = set()
    with run.lap("ship"):
        msg: dict[str, Any] = {"op": "call", "inputs": run.lending.ship(inputs, used)[0]}
        buffers: list[torch.Tensor | None] = []
        if run.device != "cpu":
            # Outputs come back into lent buffers on the GPU (no trip through host memory).
            msg["out_buffers"], buffers = run.lending.ship([poisoned(r.shape, r.dtype, r.device) for r in expected.ref],
                                                           used)
    within = run.within(f"the {stage.value} call", reference, calls=1)
    with run.lap("first_call" if run.fresh_build else "request"):  # a first call after a build compiles
        reply = harness._request(run, stage, msg, max_bytes=4 * expected.nbytes + (1 << 24), within=within)
    run.timed_call(reference, time.monotonic() - within.start)
    run.calls += 1
    run.call_seconds += float(reply.get("seconds") or 0.0)
    outs = claim(reply.get("outputs"), buffers)
    if not isinstance(outs, list) or not all(isinstance(t, torch.Tensor) for t in outs):
        raise Rejected(stage, Reason.OUTPUT_TYPE, "the candidate's outputs could not be read back")
    # Outputs that came back by value (past the lending cap) go where the reference's are, so that every comparison
    # (including two calls' bits in the robustness stage, one from each path) sees one device.
    outs = reply["outputs"] = [o if o.device == r.device else o.to(r.device)
                               for o, r in zip(outs, expected.ref)] + outs[len(expected.ref):]
    if len(outs) != len(expected.ref) or reply.get("structure") != expected.structure:
        raise Rejected(stage, Reason.OUTPUT_SHAPE,
                      f"the candidate returned {len(outs)} output(s) as a {reply.get('structure')}; "
                      f"the reference returns {len(expected.ref)} as a {expected.structure}")
    for i, (got, ref, strides) in enumerate(zip(outs, expected.ref, reply.get("strides", []))):
        if got.shape != ref.shape:
            raise Rejected(stage, Reason.OUTPUT_SHAPE,
                          f"output {i} has shape {list(got.shape)}, expected {list(ref.shape)}")
        if got.dtype != ref.dtype:
            raise Rejected(stage, Reason.OUTPUT_DTYPE, f"output {i} has dtype {got.dtype}, expected {ref.dtype}")
        if ref.is_contiguous() and not _contiguous(list(got.shape), list(strides)):
            raise Rejected(stage, Reason.OUTPUT_SHAPE, f"output {i} has strides {strides}, expected contiguous "
                          f"{list(ref.stride())}")
    return reply, expected


def compare(harness: Harness, run: _Run, stage: Stage, outs: list[torch.Tensor], expected: Expected,
            label: str) -> None:
    meta = run.task.meta
    for i, got in enumerate(outs):
        truth = expected.truth[i] if expected.truth is not None else None
        with run.lap("compare"), harness._gpu(run, work="compare"):
            mismatch = tolerance.compare(f"output {i}", got.to(expected.ref[i].device), expected.ref[i], truth,
                                         allow_tf32=meta.allow_tf32, scale=meta.tolerance_scale,
                                         alternates=expected.alternates_for(i))
        if mismatch is not None:
            # NaN/Inf where the reference has none (or the reverse) is named as such: the clearest signal of
            # unwritten or uninitialised output.
            reason = Reason.NONFINITE_MISMATCH if mismatch.first_nonfinite_diff is not None \
                else Reason.OUTPUT_MISMATCH
            raise Rejected(stage, reason, f"wrong result on {label}:\n{mismatch.describe()}", mismatch=mismatch,
                          details={"inputs": label})


def soak_length(rng: random.Random, seconds: float, device: str) -> int:
    """The soak's number of calls: log-uniform between SOAK_MIN_CALLS and what the device's budget allows at
    `seconds` a call."""
    budget, cap = SOAK_BUDGET_S[device]
    most = max(SOAK_MIN_CALLS, min(cap, int(budget / max(seconds, 1e-6))))
    return int(round(math.exp(rng.uniform(math.log(SOAK_MIN_CALLS), math.log(most)))))


def _contiguous(shape: list[int], strides: list[int]) -> bool:
    """Row-major contiguity as torch defines it: the strides of size-1 dimensions do not matter."""
    if len(shape) != len(strides):
        return False
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _bits(t: torch.Tensor) -> torch.Tensor:
    kind = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(kind)
