"""Cross-entropy seed (loss and dlogits; ignore_index, label smoothing, mean/sum) and the fused linear +
cross-entropy seed against the task references, through the Triton interpreter."""
import copy
import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

from sandbox.task import load_task
from sandbox.tolerance import compare
from tests.conftest import needs_gpu
from tests.sm90 import compile_sm90, compiled_in_child, nvidia_backend_available

TASKS = Path(__file__).resolve().parent.parent / "tasks"


def _compare_all(got, ref, truth):
    assert len(got) == len(ref)
    for i, (g, r, t) in enumerate(zip(got, ref, truth)):
        assert g.dtype == r.dtype and g.shape == r.shape, (i, g.dtype, r.dtype, g.shape, r.shape)
        bad = compare(f"out[{i}]", g, r, t)
        assert bad is None, bad.describe()


def _truth(model, inputs):
    return copy.deepcopy(model).double()(*[x.double() if x.is_floating_point() else x for x in inputs])


CE_SHAPES = [(1, 1), (1, 37), (5, 2048), (7, 3001), (16, 4999)]


def _check_knobs(shape, smoothing, reduction, device, **knobs):
    """bf16 logits with outliers, ignored rows first, last and in a run: the seed with `knobs` against the task."""
    from seeds.cross_entropy import cross_entropy_fwd_bwd
    task = load_task(TASKS / "cross_entropy.py").with_constants({"N": shape[0], "V": shape[1]})
    model = task.module.Model(-100, smoothing, reduction).to(device)
    x, t = task.make_inputs(3, "outliers", device)
    t[0] = -100
    t[-1] = -100
    t[2:4] = -100
    got = cross_entropy_fwd_bwd(x, t, -100, smoothing, reduction, **knobs)
    _compare_all(got, model(x, t), _truth(model, [x, t]))


def _latin(cases, shapes, options):
    """Each case at every shape, the options taking turns (case i at shape j takes option (i + j) mod their
    number): every case meets every shape and every option (there are at least as many shapes as options), and
    every shape every option, at 1/len(options) of the full cross product's cost."""
    assert len(shapes) >= len(options)
    name = lambda v: "x".join(map(name, v)) if isinstance(v, tuple) else str(v)  # noqa: E731
    return [pytest.param(*case, *options[(i + j) % len(options)], shape,
                         id="-".join(map(name, (*case, *options[(i + j) % len(options)], shape))))
            for i, case in enumerate(cases) for j, shape in enumerate(shapes)]

@pytest.mark.parametrize("task_file", ["cross_entropy.py", "cross_entropy_smooth_sum.py"])
@pytest.mark.parametrize("shape", CE_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cross_entropy(task_file, shape, dtype, device):
    task = load_task(TASKS / task_file).with_constants({"N": shape[0], "V": shape[1]})
    model = task.make_reference(0, device)
    new = importlib.import_module("seeds.cross_entropy").ModelNew(*task.init_inputs()).to(device)
    inputs = [x.to(dtype) if x.is_floating_point() else x for x in task.make_inputs(5, "normal", device)]
    _compare_all(new(*inputs), model(*inputs), _truth(model, inputs))


@pytest.mark.parametrize("dist", ["uniform", "large", "outliers", "constant_rows"])
@pytest.mark.parametrize("smoothing,reduction", [(0.0, "mean"), (0.2, "mean"), (0.0, "sum"), (0.1, "sum")])
def test_cross_entropy_options(dist, smoothing, reduction, device):
    task = load_task(TASKS / "cross_entropy.py").with_constants({"N": 11, "V": 1500})
    model = task.module.Model(-100, smoothing, reduction).to(device)
    new = importlib.import_module("seeds.cross_entropy").ModelNew(-100, smoothing, reduction)
    inputs = task.make_inputs(7, dist, device)
    inputs[1][::3] = -100  # many ignored rows
    _compare_all(new(*inputs), model(*inputs), _truth(model, inputs))


@pytest.mark.parametrize("block", [16, 64, 1024])
def test_cross_entropy_segments_agree(block, device):
    """Rows split over many programs give the loss and gradient of rows kept whole (segment combination)."""
    from seeds.cross_entropy import cross_entropy_fwd_bwd
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 1000, generator=g) * 4).to(device)
    t = torch.randint(0, 1000, (6,), generator=g).to(device)
    t[2] = -100
    loss, dx = cross_entropy_fwd_bwd(x, t, block=block, num_warps=4, fused=False)
    ref = torch.nn.functional.cross_entropy(x.double(), t)
    assert abs(float(loss) - float(ref)) < 1e-5 * max(1.0, abs(float(ref)))
    assert torch.equal(dx[2], torch.zeros_like(dx[2]))
    loss2, dx2 = cross_entropy_fwd_bwd(x, t, block=1024, num_warps=4, fused=False)
    torch.testing.assert_close(dx, dx2, rtol=1e-5, atol=1e-7)


FORM_CASES = [  # (form, programs, lanes, hints): the persistent form with fewer programs than rows, one per row, more
    ("persistent", 3, False, True), ("persistent", 3, True, True), ("persistent", 3, True, False),
    ("persistent", None, True, True), ("persistent", 1000, False, False), ("persistent", 1000, True, True),
    ("staged", 3, True, True), ("staged", 1000, False, False), ("staged", None, True, False),
    ("two_pass", None, False, True),
]


@pytest.mark.parametrize("form,programs,lanes,hints,smoothing,reduction,shape_block", _latin(
    FORM_CASES, [((10, 1000), 256), ((7, 515), 128), ((4, 100), 128)], [(0.0, "mean"), (0.1, "sum"), (0.3, "mean")]))
def test_cross_entropy_forms(form, programs, lanes, hints, smoothing, reduction, shape_block, device):
    """Every form and knob the bench sweeps: several tiles a row (a partial last tile; V below one tile), ignored
    rows first, last and in a run, bf16 logits with outliers."""
    shape, block = shape_block
    _check_knobs(shape, smoothing, reduction, device, form=form, programs=programs, lanes=lanes, hints=hints,
                 block=block, num_warps=4)


@pytest.mark.parametrize("form", ["persistent", "staged", "two_pass"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_all_ignored(form, reduction, device):
    """No valid row: the mean is 0/0 = NaN and the sum 0, as in PyTorch; the gradient is all zeros either way."""
    from seeds.cross_entropy import cross_entropy_fwd_bwd
    x = torch.randn(5, 300, device=device, dtype=torch.bfloat16)
    t = torch.full((5,), -100, device=device)
    x_ = x.float().requires_grad_()
    ref = torch.nn.functional.cross_entropy(x_, t, reduction=reduction, label_smoothing=0.1)
    (ref_dx,) = torch.autograd.grad(ref, x_)
    loss, dx = cross_entropy_fwd_bwd(x, t, label_smoothing=0.1, reduction=reduction, form=form, programs=2, block=128)
    assert torch.equal(torch.isnan(loss), torch.isnan(ref)) and (reduction == "mean" or float(loss) == 0.0)
    assert torch.equal(dx, torch.zeros_like(dx)) and torch.equal(ref_dx, torch.zeros_like(ref_dx))


@pytest.mark.parametrize("form,lanes,stages", [("persistent", True, 3), ("persistent", False, 3), ("staged", True, 4),
                                               ("staged", False, 1)])
def test_cross_entropy_in_place(form, lanes, stages, device):
    """out=logits (a buffer the caller owns, as in linear + CE): the gradient overwrites the logits and equals the
    out-of-place result bitwise, ignored rows included."""
    from seeds.cross_entropy import cross_entropy_fwd_bwd
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(9, 700, generator=g) * 3).to(device=device, dtype=torch.bfloat16)
    t = torch.randint(0, 700, (9,), generator=g).to(device)
    t[4] = -100
    kw = dict(form=form, lanes=lanes, programs=2, block=128, stages=stages)
    loss, dx = cross_entropy_fwd_bwd(x, t, label_smoothing=0.1, **kw)
    buf = x.clone()
    loss2, dx2 = cross_entropy_fwd_bwd(buf, t, label_smoothing=0.1, out=buf, **kw)
    assert dx2.data_ptr() == buf.data_ptr()
    assert torch.equal(loss, loss2) and torch.equal(dx, dx2)


@pytest.mark.parametrize("lanes", [True, False])
def test_cross_entropy_forms_bitwise_across_programs(lanes, device):
    """A row's loss and gradient do not depend on which program computes it (grid size, lanes fixed), and the
    staged form (the same maths, Triton's pipeliner instead of the hand-written one) equals the persistent form
    bitwise."""
    from seeds.cross_entropy import cross_entropy_fwd_bwd
    x = torch.randn(12, 900, device=device)
    t = torch.randint(0, 900, (12,), device=device)
    t[5] = -100
    a = cross_entropy_fwd_bwd(x, t, form="persistent", lanes=lanes, programs=1, block=256)
    b = cross_entropy_fwd_bwd(x, t, form="persistent", lanes=lanes, programs=5, block=256)
    c = cross_entropy_fwd_bwd(x, t, form="staged", lanes=lanes, programs=3, block=256)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])


VARIANT_CASES = [  # (programs, block, sub, store_cache, split): tiles of sub x block columns, the stores' cache
    # modifier, programs per row (split 8 at block 256 leaves segments with no column at V 1000 and below)
    (3, 128, 2, "", 1), (3, 64, 4, "", 1), (None, 128, 2, ".cs", 1), (1000, 256, 2, "", 1), (3, 128, 1, ".cs", 1),
    (2, 128, 1, ".cg", 1), (3, 32, 8, ".cg", 1),
    (4, 128, 1, "", 2), (7, 64, 2, ".cs", 2), (None, 64, 1, "", 4), (1000, 128, 1, "", 2), (8, 256, 1, "", 8),
]


@pytest.mark.parametrize("programs,block,sub,store_cache,split,smoothing,reduction,shape", _latin(
    VARIANT_CASES, [(10, 1000), (7, 515), (4, 100)], [(0.0, "mean"), (0.1, "sum"), (0.3, "mean")]))
def test_cross_entropy_sweep_options(programs, block, sub, store_cache, split, smoothing, reduction, shape, device):
    """The persistent form's sweep options (benchmarks/sweep_ce.py): sub x block tiles (a partial last tile, a row
    shorter than one tile, whole rows of -inf padding in a tile), the stores' cache modifier and rows split over
    programs (the interpreter runs programs one after another: earlier programs always compute their partners'
    statistics themselves, later ones read them published), with ignored rows first, last and in a run, bf16
    logits with outliers."""
    _check_knobs(shape, smoothing, reduction, device, programs=programs, block=block, num_warps=4, sub=sub,
                 store_cache=store_cache, split=split)


@pytest.mark.parametrize("sub", [2, 4])
def test_cross_entropy_sub_tiles_bitwise_and_in_place(sub, device):
    """With sub > 1 a row's result does not depend on the grid, the store modifier changes no bit, and writing
    the gradient over the logits (out=logits) gives the out-of-place result bitwise."""
    from seeds.cross_entropy import cross_entropy_fwd_bwd
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(9, 700, generator=g) * 3).to(device=device, dtype=torch.bfloat16)
    t = torch.randint(0, 700, (9,), generator=g).to(device)
    t[4] = -100
    kw = dict(block=64, sub=sub, label_smoothing=0.1)
    a = cross_entropy_fwd_bwd(x, t, programs=1, **kw)
    b = cross_entropy_fwd_bwd(x, t, programs=4, store_cache=".cs", **kw)
    buf = x.clone()
    c = cross_entropy_fwd_bwd(buf, t, programs=2, out=buf, **kw)
    assert c[1].data_ptr() == buf.data_ptr()
    for other in (b, c):
        assert torch.equal(a[0], other[0]) and torch.equal(a[1], other[1])


@pytest.mark.parametrize("split,sub", [(2, 1), (4, 2)])
def test_cross_entropy_split_rows_bitwise_across_grids(split, sub, device):
    """With rows split over programs, a row's result does not depend on the grid (which group of programs takes
    it, how many rows a group loops over). On the interpreter the first program of a group always recomputes its
    partners' statistics and the others read them published; test_cross_entropy_sweep_options checks both paths
    against the reference."""
    from seeds.cross_entropy import cross_entropy_fwd_bwd
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(9, 1500, generator=g) * 3).to(device=device, dtype=torch.bfloat16)
    t = torch.randint(0, 1500, (9,), generator=g).to(device)
    t[4] = -100
    kw = dict(block=64, sub=sub, split=split, label_smoothing=0.1)
    a = cross_entropy_fwd_bwd(x, t, programs=split, **kw)
    for programs in (2 * split, 9 * split, 100):
        b = cross_entropy_fwd_bwd(x, t, programs=programs, **kw)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), programs


def test_cross_entropy_sub_tiles_differ_from_one_lane_per_column(device):
    """sub > 1 folds sub columns into a lane (a different rounding order from sub = 1), so the test above is not
    comparing the default with itself: the gradients agree to fp32 rounding but not bitwise."""
    from seeds.cross_entropy import cross_entropy_fwd_bwd
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(8, 2000, generator=g) * 5).to(device)
    t = torch.randint(0, 2000, (8,), generator=g).to(device)
    one = cross_entropy_fwd_bwd(x, t, programs=2, block=64)
    two = cross_entropy_fwd_bwd(x, t, programs=2, block=64, sub=2)
    torch.testing.assert_close(two[1], one[1], rtol=1e-5, atol=1e-9)
    assert not torch.equal(one[1], two[1])


def test_cross_entropy_default_is_persistent_with_lanes(monkeypatch, device):
    """The default path (ModelNew, cross_entropy_fwd_bwd, ce_rows with fused=None as linear + CE's token form calls
    it) launches the persistent kernel with LANES on (the H200's measured best) and nothing else; "pipelined" (wrong
    on the H200) is no longer a form."""
    ce = importlib.import_module("seeds.cross_entropy")
    lce = importlib.import_module("seeds.linear_cross_entropy")
    launches = []

    class Spy:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kw):
                launches.append((self.name, kw.get("LANES")))
                return self.kernel[grid](*args, **kw)
            return launch

    monkeypatch.setattr(ce, "_ce_persistent_kernel", Spy("persistent", ce._ce_persistent_kernel))
    monkeypatch.setattr(ce, "_ce_segments_kernel", Spy("segments", ce._ce_segments_kernel))
    assert ce.DEFAULT_FORM == "persistent" and "pipelined" not in ce.FORMS
    x = torch.randn(4, 300, device=device)
    t = torch.randint(0, 300, (4,), device=device)
    ce.ModelNew()(x, t)
    ce.cross_entropy_fwd_bwd(x, t, label_smoothing=0.1, reduction="sum")
    w = torch.randn(300, 16, device=device)
    lce.linear_cross_entropy_fwd_bwd(torch.randn(4, 16, device=device), w, t, form="token")
    assert launches == [("persistent", True)] * 3
    with pytest.raises(ValueError, match="form"):
        ce.cross_entropy_fwd_bwd(x, t, form="pipelined")


def test_cross_entropy_rejects_bad_inputs():
    from seeds.cross_entropy import cross_entropy_fwd_bwd
    with pytest.raises(ValueError, match="reduction"):
        cross_entropy_fwd_bwd(torch.randn(2, 5), torch.zeros(2, dtype=torch.long), reduction="none")
    with pytest.raises(ValueError, match=r"\[N, V\]"):
        cross_entropy_fwd_bwd(torch.randn(2, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="form"):
        cross_entropy_fwd_bwd(torch.randn(2, 5), torch.zeros(2, dtype=torch.long), form="magic")
    with pytest.raises(ValueError, match="out"):
        cross_entropy_fwd_bwd(torch.randn(2, 5), torch.zeros(2, dtype=torch.long), out=torch.empty(2, 4))
    x, t = torch.randn(2, 5), torch.zeros(2, dtype=torch.long)
    for kw in (dict(sub=3), dict(sub=0), dict(sub=2, lanes=False), dict(sub=2, form="staged")):
        with pytest.raises(ValueError, match="sub"):
            cross_entropy_fwd_bwd(x, t, **kw)
    with pytest.raises(ValueError, match="store_cache"):
        cross_entropy_fwd_bwd(x, t, store_cache=".ca")
    for kw in (dict(split=3), dict(split=2, lanes=False), dict(split=2, form="staged"), dict(split=2, out=x),
               dict(form="resident", split=1, out=x)):
        with pytest.raises(ValueError, match="split"):
            cross_entropy_fwd_bwd(x, t, **kw)



RESIDENT_CASES = [  # (programs, block, split, prefetch): a row's share is one R x block tile in registers
    (4, 128, 2, True), (8, 64, 4, False), (3, 256, 1, True), (1000, 16, 8, True), (None, 64, 2, False),
    (6, 32, 2, True),  # R 8 (at V 515): many sub-rows of a tile, the last ones past the row
]


@pytest.mark.parametrize("programs,block,split,prefetch,smoothing,reduction,shape", _latin(
    RESIDENT_CASES, [(10, 1000), (7, 515), (4, 100), (5, 40)], [(0.0, "mean"), (0.1, "sum"), (0.3, "mean")]))
def test_cross_entropy_resident(programs, block, split, prefetch, smoothing, reduction, shape, device):
    """The resident form (each row read once, its shares held in registers by split programs that meet once per
    row): segments with no column (split 8 at V 100 and 40), rows shorter than one tile, ignored rows first, last
    and in a run (their zero gradient and the next row's prefetch both skip the handshake), bf16 logits with
    outliers. On the interpreter the earlier programs of a group compute their partners' statistics themselves,
    the later ones read them published: both paths are checked against the reference."""
    _check_knobs(shape, smoothing, reduction, device, form="resident", programs=programs, block=block, num_warps=4,
                 split=split, prefetch=prefetch)


def test_cross_entropy_resident_bitwise_across_grids_and_prefetch(device):
    """A row's result does not depend on the grid (which group of programs takes it, how many rows a group loops
    over) or on the prefetch."""
    from seeds.cross_entropy import cross_entropy_fwd_bwd
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(9, 1500, generator=g) * 3).to(device=device, dtype=torch.bfloat16)
    t = torch.randint(0, 1500, (9,), generator=g).to(device)
    t[4] = -100
    kw = dict(form="resident", block=64, split=4, label_smoothing=0.1)
    a = cross_entropy_fwd_bwd(x, t, programs=4, **kw)
    for programs, prefetch in ((8, True), (36, False), (100, True)):
        b = cross_entropy_fwd_bwd(x, t, programs=programs, prefetch=prefetch, **kw)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), programs


LCE_SHAPES = [(1, 16, 1), (5, 24, 37), (70, 32, 129), (33, 48, 300)]  # BT, H, V


@pytest.mark.parametrize("shape", LCE_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_linear_cross_entropy(shape, dtype, device):
    bt, h, v = shape
    task = load_task(TASKS / "linear_cross_entropy.py").with_constants({"BT": bt, "H": h, "V": v})
    model = task.make_reference(0, device).to(dtype)
    new = importlib.import_module("seeds.linear_cross_entropy").ModelNew(*task.init_inputs())
    new.load_state_dict(model.state_dict())
    new = new.to(device=device, dtype=dtype)
    inputs = [x.to(dtype) if x.is_floating_point() else x for x in task.make_inputs(9, "normal", device)]
    _compare_all(new(*inputs), model(*inputs), _truth(model, inputs))


@pytest.mark.parametrize("chunk,split_k", [(16, 1), (32, 2), (64, 5)])
@pytest.mark.parametrize("smoothing,reduction", [(0.0, "sum"), (0.1, "mean")])
def test_linear_cross_entropy_chunks(chunk, split_k, smoothing, reduction, device):
    """Every chunking and split-K gives the reference's loss and gradients (several chunks accumulate dweight)."""
    from seeds.linear_cross_entropy import linear_cross_entropy_fwd_bwd
    task = load_task(TASKS / "linear_cross_entropy.py").with_constants({"BT": 77, "H": 40, "V": 203})
    model = task.module.Model(40, 203, -100, smoothing, reduction).float().to(device)
    x, target = task.make_inputs(11, "outliers", device)
    x = x.float()
    got = linear_cross_entropy_fwd_bwd(x, model.weight.detach(), target, -100, smoothing, reduction, chunk=chunk,
                                       split_k=split_k)
    _compare_all(got, model(x, target), _truth(model, [x, target]))


TAIL_CASES = [  # (programs, block, sub, split, order, head, tail_drop): pass 2's order, tiles kept in registers
    (3, 64, 2, 1, "forward", False, False), (3, 64, 2, 1, "oldest_first", False, False),
    (2, 64, 1, 1, "reverse", True, False), (4, 32, 2, 1, "oldest_first", True, True),
    (None, 64, 2, 1, "reverse", False, True), (1000, 128, 1, 1, "forward", True, True),
    (4, 64, 1, 2, "oldest_first", True, True),  # rows split over two programs: each segment has its own tile 0
]


@pytest.mark.parametrize("programs,block,sub,split,order,head,tail_drop,smoothing,reduction,shape", _latin(
    TAIL_CASES, [(10, 1000), (7, 515), (4, 100), (5, 40)], [(0.0, "mean"), (0.1, "sum")]))
def test_cross_entropy_tail_options(programs, block, sub, split, order, head, tail_drop, smoothing, reduction, shape,
                                    device):
    """Pass 2's order of the re-read tiles, tile 0 kept in registers (head) and the last tile loaded to be dropped
    (tail_drop), benchmarks/sweep_ce.py --tail: rows of one tile (tile 0 is the last: head has nothing to keep), two
    (nothing re-read), three and more (every order differs), a partial last tile, ignored rows first, last and in a
    run, bf16 logits with outliers."""
    _check_knobs(shape, smoothing, reduction, device, programs=programs, block=block, num_warps=4, sub=sub,
                 split=split, order=order, head=head, tail_drop=tail_drop)


@pytest.mark.parametrize("v", [700, 257, 100])
def test_cross_entropy_tail_options_change_no_bit(v, device):
    """The order of pass 2, head and tail_drop move loads, stores and hints, not arithmetic: every
    variant gives the default's loss and gradient bitwise, also writing the gradient over the logits (head holds
    tile 0 until the end of pass 2, after later tiles' stores; every re-read tile is loaded before its store)."""
    from seeds.cross_entropy import cross_entropy_fwd_bwd
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(9, v, generator=g) * 4).to(device=device, dtype=torch.bfloat16)
    t = torch.randint(0, v, (9,), generator=g).to(device)
    t[3] = -100
    kw = dict(block=32, sub=2, label_smoothing=0.1, programs=4)
    a = cross_entropy_fwd_bwd(x, t, **kw)
    variants = [dict(order="forward"), dict(order="oldest_first", head=True), dict(head=True, tail_drop=True),
                dict(order="oldest_first", tail_drop=True)]
    for var in variants:
        b = cross_entropy_fwd_bwd(x, t, **kw, **var)
        buf = x.clone()
        c = cross_entropy_fwd_bwd(buf, t, out=buf, **kw, **var)
        for other in (b, c):
            assert torch.equal(a[0], other[0]) and torch.equal(a[1], other[1]), var


def test_cross_entropy_tail_options_rejected_outside_persistent():
    from seeds.cross_entropy import cross_entropy_fwd_bwd
    x, t = torch.randn(2, 5), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="order must"):
        cross_entropy_fwd_bwd(x, t, order="sideways")
    for kw in (dict(order="forward"), dict(head=True), dict(tail_drop=True)):
        with pytest.raises(ValueError, match="persistent form"):
            cross_entropy_fwd_bwd(x, t, form="staged", **kw)


@needs_gpu
@pytest.mark.parametrize("smoothing,reduction", [(0.0, "mean"), (0.1, "sum")])
@pytest.mark.parametrize("v,async_kept,kept", [(40000, True, None), (65536, False, None), (64144, True, None),
                                               (128256, True, 2), (128256, False, 3)])
def test_cross_entropy_smem_form_on_the_gpu(v, async_kept, kept, smoothing, reduction):
    """The smem form (Gluon: the interpreter cannot run it) against the task's reference on a GPU: a partial last
    tile, rows of exactly four tiles, every kept tile read back (kept None: as many as fit) or only the first two
    or three with the tiles between them and the last re-read from global memory, with and without cp.async;
    ignored rows first, last and in a run, bf16 logits with outliers. GPU-only (CRUCIBLE_TEST_DEVICE=cuda)."""
    _check_knobs((37, v), smoothing, reduction, "cuda", form="smem", block=8192, num_warps=16, sub=2,
                 async_kept=async_kept, kept=kept)


def test_cross_entropy_smem_form_rejected_off_cuda():
    """The smem form is Gluon, which the interpreter cannot run: on the CPU it is refused in one sentence, as are
    options it does not have."""
    from seeds.cross_entropy import cross_entropy_fwd_bwd
    x, t = torch.randn(2, 5), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="CUDA"):
        cross_entropy_fwd_bwd(x, t, form="smem")
    with pytest.raises(ValueError, match="kept"):
        cross_entropy_fwd_bwd(x, t, kept=3)
    with pytest.raises(ValueError, match="async_kept"):
        cross_entropy_fwd_bwd(x, t, async_kept=True)
    with pytest.raises(ValueError, match="hinted stores"):
        cross_entropy_fwd_bwd(x, t, form="smem", store_cache=".cs")


def _compile_smem_forms() -> dict:
    """sm_90 facts of the smem form's kernel at the H200 task's specialisation (child process, no interpreter)."""
    import re
    from seeds.cross_entropy import _ce_smem_kernel as kernel
    facts = {}
    for block, sub, kept, warps, async_kept in ((8192, 2, 6, 16, False), (4096, 2, 13, 16, False),
                                                (8192, 2, 6, 16, True)):
        values = dict(X="*bf16", stride_x=128256, DX="*bf16", stride_dx=128256, TARGET="*i64", LOSS_ROWS="*fp32",
                      N_VALID="*fp32", N=8192, V=128256, ignore_index=-100, smoothing=0.0, MEAN=True, SMOOTH=False,
                      BLOCK=block, SUB=sub, KEPT=kept, WARPS=warps, KEEP="evict_last", DROP="evict_first",
                      ASYNC=async_kept)
        compiled = compile_sm90(kernel, values, warps)
        ptx = compiled.asm["ptx"]
        facts[f"{block}x{sub} kept {kept}" + (" async" if async_kept else "")] = {
            "shared": compiled.metadata.shared, "st_shared_v4": len(re.findall(r"st\.shared\.v4", ptx)),
            "ld_shared_v4": len(re.findall(r"ld\.shared\.v4", ptx)),
            "hinted_loads": len(re.findall(r"ld\.global\.L1::evict_(?:last|first)\.L2::cache_hint\.v4", ptx)),
            "cp_async_16B": len(re.findall(r"cp\.async\.cg\.shared\.global[^;]*\], (?:16|0x10)\b", ptx)),
            "wait_group": ptx.count("cp.async.wait_group")}
    return facts


@pytest.mark.skipif(not nvidia_backend_available(), reason="Triton's NVIDIA backend (ptxas) is not installed")
def test_cross_entropy_smem_form_compiles_for_sm90():
    """The smem form (not runnable on the interpreter) compiles for the H200: its kept tiles take the shared memory
    asked for (kept x sub x block x 2 bytes, with a little for the reductions) within the 227 KB a block may opt
    into, stored and read back in 16-byte vectors, and its global loads carry the L2 hints."""
    facts = compiled_in_child(__file__)
    for name, kept_bytes in (("8192x2 kept 6", 6 * 16384 * 2), ("4096x2 kept 13", 13 * 8192 * 2),
                             ("8192x2 kept 6 async", 6 * 16384 * 2)):
        f = facts[name]
        assert kept_bytes <= f["shared"] <= min(kept_bytes + 4096, 232448), (name, f)
        assert f["ld_shared_v4"] > 0 and f["hinted_loads"] > 0, (name, f)
        if name.endswith("async"):  # the kept tiles go global -> shared in 16-byte copies, never through registers
            assert f["cp_async_16B"] > 0 and f["wait_group"] > 0 and f["st_shared_v4"] == 0, (name, f)
        else:
            assert f["st_shared_v4"] > 0 and f["cp_async_16B"] == 0, (name, f)


if __name__ == "__main__" and sys.argv[1:2] == ["--compile-sm90"]:
    print(json.dumps(_compile_smem_forms()))
