"""AdamW seed against the task reference (torch's AdamW update written out) and torch.optim.AdamW itself, through
the Triton interpreter: the multi-tensor launch with its device table (chunk -> tensor search, tails, persistent
grid, unaligned arrays; pageable or pinned) or with the tensors as launch arguments (no table, no host-to-device
copy), and the per-tensor form, every knob the benchmark sweeps; every path bitwise equal to the table's."""
import collections
import copy
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sandbox.task import load_task
from sandbox.tolerance import compare
from seeds.adamw import ARGS_MAX_TENSORS, ModelNew, adamw_step, plan_adamw, run_plan
from tests.sm90 import compile_sm90, compiled_in_child, nvidia_backend_available

TASKS = Path(__file__).resolve().parent.parent / "tasks"
SIZES = [  # N0..N3
    {"N0": 1, "N1": 1, "N2": 1, "N3": 1}, {"N0": 4099, "N1": 257, "N2": 17, "N3": 2},
    {"N0": 30000, "N1": 4096, "N2": 31, "N3": 1000},
]
# Knob sets the benchmark sweeps; small blocks so that the interpreter crosses chunk and tensor boundaries often.
VARIANTS = [
    dict(),
    dict(block=64, num_warps=1, iters=2),
    dict(block=128, num_warps=4, iters=1, vec=128),
    dict(block=64, num_warps=2, iters=4, programs=3),
    dict(block=64, num_warps=2, iters=2, split_tail=False),
    dict(block=64, num_warps=2, iters=2, streaming=True),
    dict(multi_tensor=False),
    dict(multi_tensor=False, block=64, iters=2, split_tail=False),
    dict(multi_tensor=False, host="loops"),
    dict(host="loops"),
    dict(host="loops", block=64, num_warps=2, iters=2, programs=3),
    dict(table="args"),
    dict(table="args", block=64, num_warps=1, iters=2),
    dict(table="args", block=64, num_warps=2, iters=2, split_tail=False, streaming=True),
    dict(table="pageable"),
    dict(table="pinned", block=64, num_warps=2, iters=2),
]
ODD_SHAPES = [(37, 5), (1,), (1000,), (0,), (129,), (3, 7, 11), (64,), (2049,)]


def _run(consts, grad_dtype, dist, device):
    task = load_task(TASKS / "adamw.py").with_constants(consts)
    model = task.make_reference(0, device)
    new = ModelNew(*task.init_inputs())
    inputs = task.make_inputs(4, dist, device)
    n = (len(inputs) - 1) // 4
    inputs = [x.to(grad_dtype) if n <= i < 2 * n else x for i, x in enumerate(inputs)]
    pristine = [x.clone() for x in inputs]
    got = new(*inputs)
    ref = model(*inputs)
    truth = copy.deepcopy(model).double()(*[x.double() for x in inputs])
    assert all(torch.equal(a, b) for a, b in zip(inputs, pristine)), "the task's forward must not touch its inputs"
    assert len(got) == len(ref) == 4 * n
    for i, (g, r, t) in enumerate(zip(got, ref, truth)):
        assert g.dtype == r.dtype and g.shape == r.shape
        bad = compare(f"out[{i}]", g, r, t)
        assert bad is None, bad.describe()


@pytest.mark.parametrize("consts", SIZES)
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_adamw_sizes_grad_dtypes(consts, grad_dtype, device):
    _run(consts, grad_dtype, "normal", device)


@pytest.mark.parametrize("dist", ["uniform", "large", "outliers", "constant_rows"])
def test_adamw_distributions(dist, device):
    _run(SIZES[1], torch.float32, dist, device)


def _state(shapes, device, seed=0, grad_dtype=torch.float32, flat_offset=None):
    """params, grads, exp_avgs, exp_avg_sqs; with flat_offset, each list is made of views of one buffer, the
    first starting flat_offset elements in (so the arrays are not 16-element aligned)."""
    g = torch.Generator().manual_seed(seed)
    lists = [[torch.randn(s, generator=g) * 0.02 for s in shapes],
             [(torch.randn(s, generator=g) * 1e-3).to(grad_dtype) for s in shapes],
             [torch.randn(s, generator=g) * 1e-4 for s in shapes],
             [torch.rand(s, generator=g) * 1e-6 for s in shapes]]
    if flat_offset is not None:
        lists = unaligned_views(lists, flat_offset)
    return [[t.to(device) for t in lst] for lst in lists]


def unaligned_views(lists: list[list[torch.Tensor]], flat_offset: int) -> list[list[torch.Tensor]]:
    """Each list's tensors copied into views of one buffer of their dtype and device, the first starting flat_offset
    elements in and 3 elements between them: arrays that are not 16-element aligned."""
    packed = []
    for lst in lists:
        flat = torch.empty(flat_offset + sum(t.numel() + 3 for t in lst), dtype=lst[0].dtype, device=lst[0].device)
        views, at = [], flat_offset
        for t in lst:
            views.append(flat[at:at + t.numel()].view(t.shape).copy_(t))
            at += t.numel() + 3
        packed.append(views)
    return packed


def _reference(p, g, m, v, step, lr, betas, eps, wd):
    """The update in float64, from the task's Model (one tensor at a time)."""
    model = load_task(TASKS / "adamw.py").module.Model(lr, betas[0], betas[1], eps, wd).double()
    n = len(p)
    out = model(*[t.double() for t in (*p, *g, *m, *v)], torch.tensor(float(step), dtype=torch.float64))
    return [list(out[i * n:(i + 1) * n]) for i in range(4)]


@pytest.mark.parametrize("knobs", VARIANTS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
@pytest.mark.parametrize("wd,step", [(0.1, 1), (0.0, 7)])
def test_adamw_variants_many_tensors(knobs, wd, step, device):
    """Eight tensors of odd sizes (one empty) in one call: every variant against float64, in place."""
    p, g, m, v = _state(ODD_SHAPES, device, seed=step)
    truth = _reference(p, g, m, v, step, 1e-2, (0.9, 0.999), 1e-8, wd)
    outs = adamw_step(p, g, m, v, torch.tensor(float(step), device=device), 1e-2, (0.9, 0.999), 1e-8, wd, **knobs)
    for got, came in zip(outs[:3], (p, m, v)):  # in place: the tensors that came in
        assert all(a is b for a, b in zip(got, came))
    for name, got, ref in zip(("param", "exp_avg", "exp_avg_sq"), outs[:3], truth[:3]):
        for i, (a, b) in enumerate(zip(got, ref)):
            torch.testing.assert_close(a.double(), b, rtol=3e-6, atol=1e-9, msg=f"{name}[{i}] {tuple(a.shape)}")
    for i, (h, b) in enumerate(zip(outs[3], truth[0])):
        assert h.dtype == torch.bfloat16 and h.shape == b.shape
        torch.testing.assert_close(h.double(), b, rtol=8e-3, atol=0, msg=f"bf16 param[{i}]")


@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
def test_adamw_unaligned_views(grad_dtype, device):
    """Arrays that are views of flat buffers at odd element offsets: the table's offsets are not multiples of 16,
    so the launch must fall back to a smaller ALIGN (and stay correct)."""
    shapes = [(33,), (100,), (5, 9)]
    p, g, m, v = _state(shapes, device, grad_dtype=grad_dtype, flat_offset=1)
    truth = _reference(p, g, m, v, 3, 1e-3, (0.9, 0.95), 1e-8, 0.1)
    plan = plan_adamw(p, g, m, v, inplace=False, block=32, num_warps=1, iters=2)
    assert plan.align == 1
    outs = run_plan(plan, 3, 1e-3, (0.9, 0.95), 1e-8, 0.1)
    for got, ref in zip(outs[:3], truth[:3]):
        for a, b in zip(got, ref):
            torch.testing.assert_close(a.double(), b, rtol=3e-6, atol=1e-9)


def test_adamw_bias_correction_at_step_one(device):
    """beta2 = 0.999 at step 1: 1 - beta2^t = 0.001, where an fp32 1 - exp2(t log2 b) would be off by ~1e-4."""
    p, g, m, v = _state([(300,)], device)
    m[0].zero_()
    v[0].zero_()
    truth = _reference(p, g, m, v, 1, 1.0, (0.9, 0.999), 1e-12, 0.0)
    outs = adamw_step(p, g, m, v, 1, 1.0, (0.9, 0.999), 1e-12, 0.0, inplace=False)
    # At step 1 from zero moments the update is lr * sign(g): the bias corrections cancel only if both are exact.
    torch.testing.assert_close(outs[0][0].double(), truth[0][0], rtol=0, atol=2e-7)


def test_adamw_plan_reuse_matches_torch_optim_over_steps(device):
    """One plan, three in-place steps, tracking torch.optim.AdamW (foreach=False) step for step, with the bf16
    copy written into caller-owned tensors."""
    g = torch.Generator().manual_seed(0)
    shapes = [(33, 7), (129,), (1,), (2048,)]
    params = [torch.randn(s, generator=g).to(device) for s in shapes]
    grads = [torch.zeros(s, device=device) for s in shapes]
    ref = [p.clone().requires_grad_() for p in params]
    opt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False)
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    out16 = [torch.empty(s, dtype=torch.bfloat16, device=device) for s in shapes]
    plan = plan_adamw(params, grads, m, v, out16=out16, block=64, num_warps=2, iters=2)
    for step in range(1, 4):
        for r, gr in zip(ref, grads):
            gr.copy_(torch.randn(gr.shape, generator=g))
            r.grad = gr.clone()
        opt.step()
        _, _, _, p16 = run_plan(plan, torch.tensor(float(step), device=device), 1e-2, (0.9, 0.95), 1e-8, 0.1)
        assert p16 is out16
        for p, r, h in zip(params, ref, p16):
            torch.testing.assert_close(p, r.detach(), rtol=2e-6, atol=2e-7)
            # Within one bf16 step: the interpreter rounds fp32 -> bf16 by truncation, the GPU to nearest.
            torch.testing.assert_close(h.float(), p.to(torch.bfloat16).float(), rtol=8e-3, atol=0)


@pytest.mark.parametrize("inplace,given16", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("unaligned", [False, True])
def test_adamw_host_paths_agree_bitwise(inplace, given16, unaligned, device):
    """The lean host path (one split per output dtype, one address list per role) and the first one (per-tensor
    slices and views) launch the same kernel on the same element offsets: bitwise equal outputs, for empty,
    multi-dimensional, odd and unaligned tensors, new or in-place outputs, a caller's bf16 buffers or new ones."""
    shapes = ODD_SHAPES + [(4, 4), (17,)]
    results = []
    for host in ("lean", "loops"):
        p, g, m, v = _state(shapes, device, seed=3, flat_offset=1 if unaligned else None)
        out16 = [torch.empty(s, dtype=torch.bfloat16, device=device) for s in shapes] if given16 else None
        outs = adamw_step(p, g, m, v, torch.tensor(5.0, device=device), 1e-2, (0.9, 0.95), 1e-8, 0.1,
                          inplace=inplace, out16=out16, block=64, num_warps=2, iters=2, host=host)
        if given16:
            assert all(a is b for a, b in zip(outs[3], out16))
        for lst in outs:
            assert [tuple(t.shape) for t in lst] == [tuple(s) for s in shapes]
            assert all(t.is_contiguous() for t in lst)
        results.append(outs)
    for a_list, b_list in zip(*results):
        for a, b in zip(a_list, b_list):
            assert torch.equal(a, b)


# Every path that may serve <= ARGS_MAX_TENSORS tensors, against the table from pageable memory (the measured path).
PATHS = {"args": dict(table="args"), "pinned": dict(table="pinned"), "auto": dict(table="auto"),
         "per tensor, lean": dict(multi_tensor=False), "per tensor, loops": dict(multi_tensor=False, host="loops"),
         "loops": dict(host="loops")}
SHAPE_SETS = {"task, scaled": [(4099,), (257,), (17,), (2,)], "task, halved": [(30000,), (4096,), (31,), (1000,)],
              "odd": ODD_SHAPES, "8, 1-D": [(1,), (16,), (17,), (33,), (255,), (64,), (1000,), (3,)]}


FLAGS = [(False, False, False), (True, False, False), (False, True, True), (True, True, True)]


# The flags (in place, given bf16 buffers, unaligned views) at every shape set but the largest ("task, halved", ~35k
# elements, seconds a case on the interpreter), which runs with the first: the flags change the pointers and the
# outputs, not the table's size, which the other sets cover at sizes below and above the block.
@pytest.mark.parametrize("shapes,inplace,given16,unaligned",
                         [(name, *flags) for flags in FLAGS for name in SHAPE_SETS
                          if name != "task, halved" or flags == FLAGS[0]])
def test_adamw_paths_bitwise_equal_to_the_table(shapes, inplace, given16, unaligned, device):
    """The launch-argument form, the pinned table, per-tensor launches (lean and first host paths) and the first
    host path run the same per-element code on the same elements: bitwise the pageable table's outputs, on the
    task's shapes scaled down, odd and multi-dimensional sizes (one empty), in place or new outputs, a caller's
    bf16 buffers or new ones, 16-element aligned arrays or views at odd offsets."""
    shapes = SHAPE_SETS[shapes]

    def run(knobs):
        p, g, m, v = _state(shapes, device, seed=5, flat_offset=1 if unaligned else None)
        out16 = [torch.empty(s, dtype=torch.bfloat16, device=device) for s in shapes] if given16 else None
        outs = adamw_step(p, g, m, v, torch.tensor(4.0, device=device), 1e-2, (0.9, 0.95), 1e-8, 0.1,
                          inplace=inplace, out16=out16, block=64, num_warps=2, iters=2, **knobs)
        if inplace:
            assert all(a is b for a, b in zip(outs[0], p)) and all(a is b for a, b in zip(outs[2], v))
        if given16:
            assert all(a is b for a, b in zip(outs[3], out16))
        for lst in outs:
            assert [tuple(t.shape) for t in lst] == [tuple(s) for s in shapes]
        return outs

    ref = run(dict(table="pageable"))
    for name, knobs in PATHS.items():
        got = run(knobs)
        for k, (a_list, b_list) in enumerate(zip(got, ref)):
            for i, (a, b) in enumerate(zip(a_list, b_list)):
                assert torch.equal(a, b), f"{name}: output {k}, tensor {i} {tuple(a.shape)} differs from the table's"


def test_adamw_table_form_by_tensor_count():
    """"auto" passes up to ARGS_MAX_TENSORS non-empty tensors as launch arguments and keeps the measured pageable
    table beyond (the 1B-param / 64-tensor anchor), and for a persistent grid or the first host path; an explicit
    "args" beyond the limit is refused in one sentence."""
    def state(n, empty=0):
        shapes = [(5,)] * n + [(0,)] * empty
        return [[torch.zeros(s) for s in shapes] for _ in range(4)]

    auto = dict(table="auto")
    assert plan_adamw(*state(4)).form == "args"  # the default is "auto" (faster than the table on the H200)
    assert plan_adamw(*state(ARGS_MAX_TENSORS), inplace=False, **auto).form == "args"
    assert plan_adamw(*state(ARGS_MAX_TENSORS, empty=3), inplace=False, **auto).form == "args"  # empty ones skipped
    assert plan_adamw(*state(ARGS_MAX_TENSORS + 1), **auto).form == "pageable"
    assert plan_adamw(*state(64), **auto).form == "pageable"
    assert plan_adamw(*state(4), programs=8, **auto).form == "pageable"
    assert plan_adamw(*state(4), host="loops", **auto).form == "pageable"
    assert plan_adamw(*state(4), table="pinned").form == "pinned"
    args = plan_adamw(*state(4), table="args")
    assert args.table is None and args.firsts == (0, 1, 2, 3, 4) and args.numels == (5, 5, 5, 5)
    with pytest.raises(ValueError, match="at most"):
        plan_adamw(*state(ARGS_MAX_TENSORS + 1), table="args")
    with pytest.raises(ValueError, match="host='lean'"):
        plan_adamw(*state(4), table="args", programs=8)
    with pytest.raises(ValueError, match="table must be one of"):
        plan_adamw(*state(4), table="pinnd")


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


class _Spy:
    """Stands in for a Triton kernel: records each launch's grid and arguments, runs nothing."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.launches.append((grid, args, kw))


def _tensors_in(args) -> list[torch.Tensor]:
    found = []
    for a in args:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, tuple):
            found += _tensors_in(a)
    return found


def test_adamw_lean_host_path_torch_ops(monkeypatch):
    """What the task's forward does around its launch (host work decides at its 22.5M params), counted under a
    dispatch mode with the kernels replaced by spies: the launch-argument form ("auto" up to
    ARGS_MAX_TENSORS tensors) and the lean per-tensor launches run only the outputs' two allocations and two
    splits (plus a view per tensor and output list where a shape is not 1-D); the table forms add the table
    (lift_fresh) whatever the number of tensors; the first host path ran two ops per tensor and role."""
    import seeds.adamw as A

    spies = {name: _Spy() for name in ("_adamw_multi_kernel", "_adamw_args_kernel", "_adamw_tensor_kernel")}
    for name, spy in spies.items():
        monkeypatch.setattr(A, name, spy)
    step = torch.tensor(10.0)
    counts = {}
    for name, shapes in (("task", [(4096,), (1408,), (64,), (1000,)]), ("many", [(2048,)] * 64),
                         ("2-D", [(64, 32), (7, 3), (1000,)])):
        state = [[torch.randn(s) for s in shapes] for _ in range(4)]
        for path, knobs in (("auto", {}), ("pageable", dict(table="pageable")), ("loops", dict(host="loops")),
                            ("per tensor", dict(multi_tensor=False))):
            with _CountOps() as mode:
                A.adamw_step(*state, step, inplace=False, **knobs)
            counts[name, path] = collections.Counter(mode.ops)
    outputs = {"empty": 2, "split_with_sizes": 2}
    assert counts["task", "auto"] == outputs, counts
    assert counts["task", "per tensor"] == outputs, counts
    assert counts["task", "pageable"] == {**outputs, "lift_fresh": 1}, counts
    assert counts["many", "auto"] == {**outputs, "lift_fresh": 1}, counts  # 64 tensors: the table
    assert counts["2-D", "auto"] == {**outputs, "view": 8}, counts
    assert counts["2-D", "pageable"] == {**outputs, "view": 8, "lift_fresh": 1}, counts
    assert sum(counts["many", "loops"].values()) > 2 * 4 * 64, counts
    # auto: 2 launch-argument launches (task, 2-D) and a table launch (many); plus the pageable and loops rows
    assert len(spies["_adamw_args_kernel"].launches) == 2
    assert len(spies["_adamw_multi_kernel"].launches) == 1 + 3 + 3
    assert len(spies["_adamw_tensor_kernel"].launches) == 4 + 64 + 3


def test_adamw_args_form_copies_nothing_to_the_device(monkeypatch):
    """The launch-argument form's whole call on the task's shapes: no torch.tensor, no .to / copy_ (the calls a
    table or a step would need to reach the device), no lift_fresh / _to_copy / copy_ under a dispatch mode, and one
    launch whose only tensors are the caller's and the outputs (pointers, no table). The per-tensor lean path
    likewise, one launch per tensor. The table forms do build and move a table (so this test can fail)."""
    import seeds.adamw as A

    spies = {name: _Spy() for name in ("_adamw_multi_kernel", "_adamw_args_kernel", "_adamw_tensor_kernel")}
    for name, spy in spies.items():
        monkeypatch.setattr(A, name, spy)
    made, moved = [], []
    real_tensor, real_to, real_copy = torch.tensor, torch.Tensor.to, torch.Tensor.copy_
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: made.append(k) or real_tensor(*a, **k))
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: moved.append((a, k)) or real_to(self, *a, **k))
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, *a, **k: moved.append(a) or real_copy(self, *a, **k))
    shapes = [(4099,), (257,), (17,), (2,)]
    state = [[real_tensor(0.5).expand(s).contiguous() for s in shapes] for _ in range(4)]
    step = real_tensor(10.0)
    outs = []
    for knobs in (dict(table="args"), dict(multi_tensor=False)):
        with _CountOps() as mode:
            outs.append(A.adamw_step(*state, step, inplace=False, **knobs))
        assert not made and not moved, (knobs, made, moved)
        assert not {"lift_fresh", "_to_copy", "copy_", "to"} & set(mode.ops), (knobs, mode.ops)
    (grid, args, kw), = spies["_adamw_args_kernel"].launches
    given = {id(t) for lst in state + list(outs[0]) for t in lst} | {id(step)}
    passed = _tensors_in(args)
    assert len(passed) == 8 * 4 + 1 and {id(t) for t in passed} <= given and kw["N_TENSORS"] == 4
    chunk, firsts = kw["BLOCK"] * kw["ITERS"], [0]
    for (size,) in shapes:
        firsts.append(firsts[-1] - (-size // chunk))
    assert grid == (firsts[-1],) and args[-2:] == (tuple(firsts), (4099, 257, 17, 2))  # one program per chunk
    assert len(spies["_adamw_tensor_kernel"].launches) == 4
    A.adamw_step(*state, step, inplace=False, table="pageable")
    assert made == [{"dtype": torch.int64, "pin_memory": False}] and len(moved) == 1, (made, moved)


def test_adamw_pinned_table_is_pinned_on_cuda_only(monkeypatch):
    """table="pinned" builds the table in pinned host memory where the device is CUDA (so the copy is queued
    behind the stream's work instead of making the host wait for it), and in ordinary memory elsewhere;
    "pageable" never pins. The copy is non-blocking either way."""
    import seeds.adamw as A

    seen = []

    class FakeHostTable:
        def to(self, device, non_blocking=False):
            seen[-1]["to"] = (device, non_blocking)
            return self

    def fake_tensor(rows, dtype=None, pin_memory=False):
        seen.append({"dtype": dtype, "pin": pin_memory})
        return FakeHostTable()

    monkeypatch.setattr(A.torch, "tensor", fake_tensor)
    knobs = dict(vec=4, programs=None, split_tail=True, streaming=False)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    for form, device, pinned in (("pinned", cuda, True), ("pinned", cpu, False), ("pageable", cuda, False)):
        plan = A._make_plan((), (), (), [0, 1], 1, 16, (1024, 4, 1), knobs, device, form)
        assert seen[-1] == {"dtype": torch.int64, "pin": pinned, "to": (device, True)}, (form, device, seen[-1])
        assert plan.form == form


def test_adamw_rejects_bad_state():
    with pytest.raises(ValueError, match="float32"):
        adamw_step([torch.zeros(3, dtype=torch.bfloat16)], [torch.zeros(3)], [torch.zeros(3)], [torch.zeros(3)],
                   torch.tensor(1.0))
    with pytest.raises(ValueError, match="grads"):
        adamw_step([torch.zeros(3)], [], [torch.zeros(3)], [torch.zeros(3)], torch.tensor(1.0))
    with pytest.raises(ValueError, match="one dtype"):
        adamw_step([torch.zeros(3), torch.zeros(2)], [torch.zeros(3), torch.zeros(2, dtype=torch.bfloat16)],
                   [torch.zeros(3), torch.zeros(2)], [torch.zeros(3), torch.zeros(2)], torch.tensor(1.0))
    with pytest.raises(ValueError, match="contiguous"):
        adamw_step([torch.zeros(4, 4).t()], [torch.zeros(4, 4)], [torch.zeros(4, 4)], [torch.zeros(4, 4)], 1)
    with pytest.raises(ValueError, match="betas"):
        adamw_step([torch.zeros(3)], [torch.zeros(3)], [torch.zeros(3)], [torch.zeros(3)], 1, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="host"):
        adamw_step([torch.zeros(3)], [torch.zeros(3)], [torch.zeros(3)], [torch.zeros(3)], 1, host="magic")
    for host in ("lean", "loops"):
        with pytest.raises(ValueError, match="shape"):
            adamw_step([torch.zeros(3)], [torch.zeros(4)], [torch.zeros(3)], [torch.zeros(3)], 1, host=host)
        with pytest.raises(ValueError, match="no parameters"):
            adamw_step([], [], [], [], 1, host=host)


# ---- the GPU code: 16-byte vectors, one register layout (compiled for sm_90 without a GPU) ----------------------
def _facts(fn, values: dict, num_warps: int) -> dict:
    """PTX facts of one kernel compiled for the H200 (ints unspecialised, as at n = 15,625,000)."""
    kernel = compile_sm90(fn, values, num_warps, divisible_ints=False)
    ptx = kernel.asm["ptx"]
    return {"ld_v4": len(re.findall(r"ld\.global[.:\w]*\.v4", ptx)),
            "st_v4": len(re.findall(r"st\.global[.:\w]*\.v4", ptx)),
            "converts": kernel.asm["ttgir"].count("convert_layout"), "shared": kernel.metadata.shared}


def _args_facts(fn, hyper: dict, n: int) -> dict:
    """PTX facts of the launch-argument kernel for n tensors: its tuple arguments need their own signature (one
    type per tuple element), which tests/sm90.compile_sm90 does not build; pointers 16-byte aligned, as the
    launcher specialises them, sizes unspecialised (15,625,000 is no multiple of 16)."""
    import triton
    from triton.backends.compiler import GPUTarget

    roles = dict(P="*fp32", G="*fp32", M="*fp32", V="*fp32", P_OUT="*fp32", M_OUT="*fp32", V_OUT="*fp32",
                 P16="*bf16")
    const = dict(N_TENSORS=n, BLOCK=1024, ITERS=1, VEC=4, SPLIT_TAIL=True, STREAMING=False)
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in roles:
            sig[name] = tuple([roles[name]] * n)
            attrs.update({(i, j): [["tt.divisibility", 16]] for j in range(n)})
        elif name == "STEP":
            sig[name], attrs[(i,)] = "*fp32", [["tt.divisibility", 16]]
        elif name in ("FIRST", "NUMEL"):
            sig[name] = tuple(["i32"] * (n + (name == "FIRST")))
        else:
            sig[name] = "fp32" if name in hyper else "constexpr"
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    ptx = kernel.asm["ptx"]
    return {"ld_v4": len(re.findall(r"ld\.global[.:\w]*\.v4", ptx)),
            "st_v4": len(re.findall(r"st\.global[.:\w]*\.v4", ptx)),
            "converts": kernel.asm["ttgir"].count("convert_layout"), "shared": kernel.metadata.shared}


def _compile_all() -> dict:
    import seeds.adamw as A  # noqa: N812 - compiled, not interpreted

    hyper = dict(lr=1e-3, decay=0.9999, beta1=0.9, beta2=0.95, one_minus_beta1=0.1, one_minus_beta2=0.05,
                 ln_beta1=-0.1, ln_beta2=-0.05, eps=1e-8)
    arrays = dict(P="*fp32", G="*fp32", M="*fp32", V="*fp32", P_OUT="*fp32", M_OUT="*fp32", V_OUT="*fp32",
                  P16="*bf16", STEP="*fp32")
    multi = dict(**arrays, TABLE="*i64", n_tensors=63, n_chunks=1001, search_steps=6, **hyper, ALIGN=16,
                 PERSISTENT=False, SPLIT_TAIL=True, STREAMING=False)
    tensor = dict(**arrays, numel=15625000, **hyper, STREAMING=False)
    return {
        "args, 4 tensors": _args_facts(A._adamw_args_kernel, hyper, 4),
        "multi default": _facts(A._adamw_multi_kernel, {**multi, "BLOCK": 1024, "ITERS": 1, "VEC": 4}, 4),
        "multi vec=block": _facts(A._adamw_multi_kernel, {**multi, "BLOCK": 1024, "ITERS": 4, "VEC": 1024}, 4),
        "first seed": _facts(A._adamw_tensor_kernel, {**tensor, "BLOCK": 1024, "ITERS": 1, "VEC": 1024,
                                                      "SPLIT_TAIL": False}, 4),
    }


@pytest.mark.skipif(not nvidia_backend_available(), reason="Triton's NVIDIA backend (ptxas) is not installed")
def test_gpu_kernel_vectorises_for_sm90():
    """Full chunks: every array in 16-byte vectors and no shared-memory layout conversion at VEC=4, though the
    tensor size is no multiple of 16. Letting Triton choose the layout (vec=block) converts the fp32 stores through
    shared memory; the first seed's all-masked form had no vector access at all (why it reached 65% of copy)."""
    facts = compiled_in_child(__file__)
    # 1 block of 1024 at 4 warps (the default): 2 vectors per thread and array; 4 arrays read, 3 fp32 arrays written.
    assert facts["multi default"] == {"ld_v4": 8, "st_v4": 6, "converts": 0, "shared": 0}, facts
    # The launch-argument form: the same per tensor, one copy of the chunk code per tensor (4 here).
    assert facts["args, 4 tensors"] == {"ld_v4": 32, "st_v4": 24, "converts": 0, "shared": 0}, facts
    assert facts["multi vec=block"]["converts"] > 0 and facts["multi vec=block"]["shared"] > 0, facts
    assert facts["first seed"]["ld_v4"] == 0 and facts["first seed"]["st_v4"] == 0, facts


if __name__ == "__main__" and sys.argv[1:2] == ["--compile-sm90"]:
    print(json.dumps(_compile_all()))
