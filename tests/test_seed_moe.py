"""MoE seeds (router, align/dispatch, grouped GEMM fwd/bwd, fused layer) against the task references, through the
Triton interpreter at small shapes: odd token counts, several expert counts and top-k, skewed loads, empty experts."""
import copy
import importlib
from pathlib import Path

import pytest
import torch

from sandbox.task import load_task
from sandbox.tolerance import compare

TASKS = Path(__file__).resolve().parent.parent / "tasks"
LAYER_TASKS = {"softmax": "moe_layer_mixtral.py", "sigmoid": "moe_layer_deepseek.py"}


def _compare_all(got, ref, truth):
    got, ref, truth = [list(o) if isinstance(o, (tuple, list)) else [o] for o in (got, ref, truth)]
    for i, (g, r, t) in enumerate(zip(got, ref, truth)):
        assert g.dtype == r.dtype and g.shape == r.shape, (i, g.dtype, r.dtype, g.shape, r.shape)
        bad = compare(f"out[{i}]", g, r, t)
        assert bad is None, bad.describe()


def _run_task(task, seed_mod, inputs, device, dtype=None):
    model = task.make_reference(0, device)
    new = importlib.import_module(seed_mod).ModelNew(*task.init_inputs()).to(device)
    if dtype is not None:
        model, new = model.to(dtype), new.to(dtype)
        inputs = [x.to(dtype) if x.is_floating_point() else x for x in inputs]
    new.load_state_dict(model.state_dict())
    got = new(*inputs)
    ref = model(*inputs)
    truth = copy.deepcopy(model).double()(*[x.double() if x.is_floating_point() else x for x in inputs])
    _compare_all(got, ref, truth)
    return got


def _layer_task(scoring, t, e, k, h, f):
    return load_task(TASKS / LAYER_TASKS[scoring]).with_constants({"T": t, "EXPERTS": e, "TOP_K": k, "H": h,
                                                                    "FFN": f})


# ---- routing inputs are tie-free --------------------------------------------------------------------------------
@pytest.mark.parametrize("experts", [6, 8, 16, 64])
def test_task_routing_has_no_near_ties(experts):
    """Every pair of (grid logit, expert) choice scores differs by far more than fp32 rounding, so the float64
    truth, PyTorch's fp32 reference and the kernel choose the same experts."""
    task = _layer_task("sigmoid", 5, experts, 2, 16, 16)
    bias = task.make_reference(0, "cpu").router_bias.double()
    grid = task.module.router_logits(1, experts)[0].double().sort().values
    assert grid.unique().numel() == experts
    value = torch.sigmoid(grid)[:, None] + bias[None, :]  # grid value i taken by expert j
    gaps = (value[:, :, None, None] - value[None, None, :, :]).abs()
    same = torch.eye(experts, dtype=torch.bool)
    gaps[same[:, None, :, None].expand_as(gaps) | same[None, :, None, :].expand_as(gaps)] = float("inf")
    assert float(gaps.min()) > 1e-4
    assert float((grid[1:] - grid[:-1]).min()) >= 4.0 / experts * 0.99


# ---- router -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("t,e,k", [(1, 8, 2), (37, 64, 8), (70, 6, 3), (5, 16, 16)])
def test_router_matches_reference(scoring, t, e, k, device):
    from seeds.moe_layer import route
    task = _layer_task(scoring, t, e, k, 16, 16)
    model = task.make_reference(0, device)
    logits = task.make_inputs(3, "normal", device)[1]
    bias = model.router_bias if scoring == "sigmoid" else None
    weights, ids = route(logits, k, scoring, bias, model.routed_scale)
    ref_w, ref_ids = model.route(logits)
    assert torch.equal(ids.long(), ref_ids)
    bad = compare("weights", weights, ref_w, copy.deepcopy(model).double().route(logits.double())[0])
    assert bad is None, bad.describe()


# ---- align / dispatch -------------------------------------------------------------------------------------------
def _expected_layout(ids, experts, block_m):
    flat = ids.reshape(-1).tolist()
    n = len(flat)
    sorted_ids, expert_of_block = [], []
    for e in range(experts):
        mine = [i for i, x in enumerate(flat) if x == e]
        pad = -len(mine) % block_m
        sorted_ids += mine + [n] * pad
        expert_of_block += [e] * ((len(mine) + pad) // block_m)
    return sorted_ids, expert_of_block


@pytest.mark.parametrize("t,k,experts,block_m", [(1, 1, 3, 16), (5, 2, 64, 16), (300, 8, 64, 16),
                                                 (129, 3, 7, 64), (700, 2, 8, 32)])
@pytest.mark.parametrize("skew", [False, True])
def test_align_is_a_stable_padded_sort(t, k, experts, block_m, skew, device):
    from seeds.moe import align_block_size
    g = torch.Generator().manual_seed(t * 31 + k)
    ids = torch.argsort(torch.rand(t, experts, generator=g), dim=1)[:, :k]
    if skew:  # most pairs on expert 0, experts past the first few empty
        ids = torch.where(torch.rand(t, k, generator=g) < 0.8, ids % min(3, experts), ids)
        ids[:, 0] = 0
        ids = torch.stack([_distinct(r, experts) for r in ids])
    ids = ids.to(torch.int32).to(device)
    layout = align_block_size(ids, experts, block_m)
    want_sorted, want_blocks = _expected_layout(ids.cpu(), experts, block_m)
    used = int(layout.num_padded[0])
    assert used == len(want_sorted)
    assert layout.sorted_ids[:used].tolist() == want_sorted
    assert (layout.sorted_ids[used:] == t * k).all()
    assert layout.expert_ids[:used // block_m].tolist() == want_blocks
    assert (layout.expert_ids[used // block_m:] == -1).all()
    counts = torch.bincount(ids.reshape(-1).long().cpu(), minlength=experts)
    assert layout.expert_count.tolist() == counts.tolist()


def _distinct(row, experts):
    """A row of top-k ids made distinct again after skewing, keeping its first occurrences in order."""
    seen, out = set(), []
    for x in row.tolist() + list(range(experts)):
        if x not in seen:
            seen.add(x)
            out.append(x)
    return torch.tensor(out[:row.numel()])


# ---- grouped GEMM forward and backward --------------------------------------------------------------------------
COUNTS = {
    "uniform": lambda: None,
    "skew8": lambda: "skew",
    "empty_experts": lambda: torch.tensor([0, 40, 0, 0, 3, 0, 17, 0] + [0] * 56),
    "random": lambda: torch.bincount(torch.randint(0, 64, (97,), generator=torch.Generator().manual_seed(5)),
                                     minlength=64),
}


def _grouped_task(name, bwd, tokens, h, f):
    task = load_task(TASKS / ("moe_grouped_gemm_bwd.py" if bwd else "moe_grouped_gemm.py"))
    counts = COUNTS[name]()
    consts = {"TOKENS": tokens if not isinstance(counts, torch.Tensor) else int(counts.sum()), "H": h, "F": f}
    if counts == "skew":
        consts["SKEW"] = 8
    return task.with_constants(consts), counts if isinstance(counts, torch.Tensor) else None


@pytest.mark.parametrize("bwd", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("counts", list(COUNTS))
@pytest.mark.parametrize("tokens,h,f", [(1, 17, 19), (200, 40, 24)])
def test_grouped_gemm_matches_loop(bwd, counts, tokens, h, f, device):
    task, given = _grouped_task(counts, bwd, tokens, h, f)
    inputs = task.make_inputs(2, "normal", device)
    if given is not None:
        inputs[1] = given.to(device)
    if counts == "skew8" and tokens > 64:
        assert int(inputs[1][0]) > 4 * int(inputs[1][1]), inputs[1]  # expert 0 carries several times the rest
    _run_task(task, "seeds.moe_bwd" if bwd else "seeds.moe", inputs, device)


@pytest.mark.parametrize("bwd", [False, True], ids=["fwd", "bwd"])
def test_grouped_gemm_fp32(bwd, device):
    task, _ = _grouped_task("random", bwd, 0, 33, 20)
    inputs = task.make_inputs(4, "normal", device)
    inputs[1] = COUNTS["random"]().to(device)
    _run_task(task, "seeds.moe_bwd" if bwd else "seeds.moe", inputs, device, dtype=torch.float32)


def test_grouped_gemm_tile_configs_agree(device):
    from seeds.moe import grouped_linear_fwd
    from seeds.moe_bwd import grouped_linear_bwd
    g = torch.Generator().manual_seed(0)
    counts = torch.tensor([5, 0, 70, 1, 0, 30])
    x = torch.randn(106, 50, generator=g).to(device)
    w = torch.randn(6, 36, 50, generator=g).to(device)
    dy = torch.randn(106, 36, generator=g).to(device)
    y = grouped_linear_fwd(x, w, counts.to(device))
    dx, dw = grouped_linear_bwd(x, w, counts.to(device), dy)
    for cfg in ((16, 16, 16, 4, 1, 1), (32, 64, 16, 4, 1, 8)):
        torch.testing.assert_close(grouped_linear_fwd(x, w, counts.to(device), cfg), y, rtol=1e-5, atol=1e-5)
        dx2, dw2 = grouped_linear_bwd(x, w, counts.to(device), dy, cfg, (32, 16, 8, 4, 1))
        torch.testing.assert_close(dx2, dx, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(dw2, dw, rtol=1e-5, atol=1e-5)
    assert (dw[1] == 0).all() and (dw[4] == 0).all()


# ---- the TMA kernels against the pointer kernels -----------------------------------------------------------------
TMA_VARIANTS = [{"impl": "tma"}, {"impl": "tma", "warp_specialize": True}, {"impl": "tma", "flatten": True},
                {"impl": "tma", "tma_store": True}]
# Plain products only (the layer's gate/up GEMM already keeps two accumulators); with dX, split_n covers the
# transposed B's two column boxes too.
SPLIT_VARIANTS = [{"impl": "tma", "split_n": 2, "flatten": True},
                  {"impl": "tma", "split_n": 2, "tma_store": True, "warp_specialize": True}]
TMA_CFG, TMA_DW_CFG = (16, 16, 16, 4, 1, 2), (16, 16, 8, 4, 1)  # BK 16 divides F = 32: dx's transposed B by TMA too


def _grouped_case(h, f, dtype, device):
    g = torch.Generator().manual_seed(h * 7 + f)
    counts = torch.tensor([5, 0, 70, 1, 0, 30, 17])  # empty experts, a run of 1, partial last blocks and steps
    rows = int(counts.sum())
    x = torch.randn(rows, h, generator=g).to(dtype).to(device)
    w = torch.randn(counts.numel(), f, h, generator=g).to(dtype).to(device)
    dy = torch.randn(rows, f, generator=g).to(dtype).to(device)
    return x, w, counts.to(device), dy


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("h,f", [(48, 32), (40, 24), (17, 19)])  # rows TMA can read; odd row bytes (pointer fallback)
def test_tma_kernels_match_pointer_kernels(h, f, dtype, device):
    from seeds.moe import grouped_linear_fwd
    from seeds.moe_bwd import grouped_linear_bwd
    x, w, counts, dy = _grouped_case(h, f, dtype, device)
    y = grouped_linear_fwd(x, w, counts, TMA_CFG, impl="ptr")
    dx, dw = grouped_linear_bwd(x, w, counts, dy, TMA_CFG, TMA_DW_CFG, dw_impl="ptr", impl="ptr")
    variants = TMA_VARIANTS + SPLIT_VARIANTS
    if dtype == torch.float32 and (h, f) != (48, 32):
        # every option meets fp32 at (48, 32) and every shape in bf16; here the plain TMA kernel and split_n (whose
        # fp32 sums differ in order) only: the other options' code does not depend on the dtype
        variants = TMA_VARIANTS[:1] + SPLIT_VARIANTS
    for variant in variants:
        # split_n's narrower dots sum fp32 products in another order on the interpreter (numpy): fp32 rounding only
        tol = 1e-5 if variant in SPLIT_VARIANTS and dtype == torch.float32 else 0
        torch.testing.assert_close(grouped_linear_fwd(x, w, counts, TMA_CFG, **variant), y, rtol=tol, atol=tol)
        dx2, dw2 = grouped_linear_bwd(x, w, counts, dy, TMA_CFG, TMA_DW_CFG, dw_impl="tma", **variant)
        torch.testing.assert_close(dx2, dx, rtol=tol, atol=tol)
        torch.testing.assert_close(dw2, dw, rtol=0, atol=0)
    assert (dw[1] == 0).all() and (dw[4] == 0).all()


class _Recorder:
    """Stands in for TensorDescriptor: records the (shape, block) of each descriptor built."""

    def __init__(self, real, made):
        self.real, self.made = real, made

    def from_tensor(self, t, block):
        self.made.append((tuple(t.shape), list(block)))
        return self.real.from_tensor(t, block)


@pytest.mark.parametrize("split_n", [1, 2])
def test_tma_store_only_where_a_block_is_one_run_of_c(split_n, monkeypatch, device):
    """C's descriptor (block [BM, BN / split_n]) exists for a contiguous layout, and not for a top-K scatter, whose
    block rows are scattered (those stores stay pointer stores); both agree with the pointer kernel. The partial
    blocks (counts 5, 70, 1, 30, 17 at BM 16) must not be stored by TMA: a box would overwrite the next expert's
    first rows (removing that guard fails the comparison above)."""
    import seeds.moe as moe
    made = []
    monkeypatch.setattr(moe, "TensorDescriptor", _Recorder(moe.TensorDescriptor, made))
    x, w, counts, _ = _grouped_case(48, 32, torch.bfloat16, device)
    want = moe.grouped_linear_fwd(x, w, counts, TMA_CFG, impl="ptr")
    got = moe.grouped_linear_fwd(x, w, counts, TMA_CFG, impl="tma", tma_store=True, split_n=split_n)
    assert torch.equal(got, want)
    assert (tuple(want.shape), [16, 16 // split_n]) in made
    made.clear()
    ids = torch.randint(0, counts.numel(), (40, 2), generator=torch.Generator().manual_seed(1)).to(device)
    layout = moe.align_block_size(ids, counts.numel(), 16)
    scattered = torch.zeros(80, 32, dtype=x.dtype, device=device)
    moe.grouped_gemm(x[:40], w, layout, scattered, a_row_div=2, config=TMA_CFG, tma_store=True, split_n=split_n)
    assert all(shape != (80, 32) for shape, _ in made), made
    flat = ids.reshape(-1)
    for i in range(80):
        torch.testing.assert_close(scattered[i].float(), (x[i // 2].float() @ w[flat[i]].float().t()),
                                   rtol=2e-2, atol=2e-2)


def test_tma_options_are_checked(device):
    import seeds.moe as moe
    x, w, counts, _ = _grouped_case(48, 32, torch.bfloat16, device)
    with pytest.raises(ValueError, match="split_n must be"):
        moe.grouped_linear_fwd(x, w, counts, TMA_CFG, split_n=4)
    with pytest.raises(ValueError, match="options of the TMA kernel"):
        moe.grouped_linear_fwd(x, w, counts, TMA_CFG, impl="ptr", tma_store=True)
    layout = moe.align_counts(counts, x.shape[0], 16)
    with pytest.raises(ValueError, match="swiglu"):
        moe.grouped_gemm(x, w, layout, torch.empty(x.shape[0], 16, dtype=x.dtype, device=device), swiglu=True,
                         config=TMA_CFG, split_n=2)


class _Refused:
    """Stands in for a pointer kernel: launching it fails the test."""

    def __getitem__(self, grid):
        raise AssertionError("pointer kernel launched")


def test_tma_path_taken_where_its_rules_hold(monkeypatch, device):
    import seeds.moe as moe
    from seeds.moe_bwd import grouped_linear_bwd
    monkeypatch.setattr(moe, "_grouped_gemm_kernel", _Refused())
    monkeypatch.setattr(moe, "_grouped_dw_kernel", _Refused())
    x, w, counts, dy = _grouped_case(48, 32, torch.bfloat16, device)
    moe.grouped_linear_fwd(x, w, counts)  # "auto"
    grouped_linear_bwd(x, w, counts, dy, TMA_CFG, TMA_DW_CFG)
    with pytest.raises(AssertionError, match="pointer kernel"):  # 17 bf16 = 34-byte rows: no descriptor
        moe.grouped_linear_fwd(*_grouped_case(17, 32, torch.bfloat16, device)[:3])
    with pytest.raises(AssertionError, match="pointer kernel"):  # F = 32 not a multiple of BK 64: boxes would
        grouped_linear_bwd(x, w, counts, dy, (16, 16, 64, 4, 1, 2), TMA_DW_CFG)  # cross into the next expert
    with pytest.raises(ValueError, match="impl"):
        moe.grouped_linear_fwd(x, w, counts, impl="cutlass")


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_layer_tma_matches_pointer(scoring, device):
    from seeds.moe_layer import moe_layer_fwd
    task = _layer_task(scoring, 37, 8, 2, 40, 48)
    model = task.make_reference(0, device)
    x, logits = task.make_inputs(5, "normal", device)
    bias = model.router_bias if scoring == "sigmoid" else None
    args = (x, logits, model.w_gate_up.detach(), model.w_down.detach(), 2, scoring, bias, model.routed_scale)
    want = moe_layer_fwd(*args, impl="ptr")
    for variant in TMA_VARIANTS:
        assert torch.equal(moe_layer_fwd(*args, **variant), want)
    # without pregather (x's rows gathered inside the gate/up GEMM instead of copied into sorted order first by
    # _gather_rows_kernel): the same products
    assert torch.equal(moe_layer_fwd(*args, pregather=False, impl="ptr"), want)
    assert torch.equal(moe_layer_fwd(*args, pregather=False, **TMA_VARIANTS[0]), want)


# ---- the fused layer --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scoring,t,e,k,h,f", [
    ("softmax", 1, 8, 2, 40, 48), ("softmax", 37, 8, 2, 33, 29), ("softmax", 23, 6, 3, 16, 40),
    ("sigmoid", 1, 64, 8, 32, 22), ("sigmoid", 41, 64, 8, 31, 19), ("sigmoid", 29, 16, 4, 48, 24),
])
def test_layer_matches_loop(scoring, t, e, k, h, f, device):
    task = _layer_task(scoring, t, e, k, h, f)
    _run_task(task, "seeds.moe_layer", task.make_inputs(7, "normal", device), device)


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_layer_skewed_routing(scoring, device):
    """Expert 0 is every token's first choice (an 8x-plus overloaded expert), the rest spread as usual."""
    e = 8 if scoring == "softmax" else 16
    task = _layer_task(scoring, 45, e, 2, 24, 20)
    x, logits = task.make_inputs(9, "normal", device)
    top = logits.max(dim=1, keepdim=True).values
    was_top = logits == top
    logits = torch.where(was_top, logits[:, :1].expand_as(logits), logits)  # swap expert 0's logit with the top
    logits[:, 0] = top[:, 0] + (1.0 if scoring == "sigmoid" else 0.0)
    _run_task(task, "seeds.moe_layer", [x, logits], device)


@pytest.mark.parametrize("dist", ["large", "outliers", "constant_rows"])
def test_layer_distributions(dist, device):
    task = _layer_task("sigmoid", 19, 16, 4, 24, 20)
    _run_task(task, "seeds.moe_layer", task.make_inputs(11, dist, device), device)


def test_layer_is_deterministic(device):
    task = _layer_task("softmax", 50, 8, 2, 24, 20)
    model = task.make_reference(0, device)
    new = importlib.import_module("seeds.moe_layer").ModelNew(*task.init_inputs()).to(device)
    new.load_state_dict(model.state_dict())
    inputs = task.make_inputs(1, "normal", device)
    assert torch.equal(new(*inputs).view(torch.int16), new(*inputs).view(torch.int16))


def test_bad_inputs_are_refused(device):
    from seeds.moe import grouped_linear_fwd
    from seeds.moe_layer import moe_layer_fwd, route
    x = torch.randn(4, 8, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="top_k"):
        route(torch.randn(4, 3, device=device), 4)
    with pytest.raises(ValueError, match="bias"):
        route(torch.randn(4, 3, device=device), 2, "sigmoid")
    with pytest.raises(ValueError, match="logits"):
        moe_layer_fwd(x, torch.randn(4, 5, device=device), torch.randn(3, 6, 8, dtype=torch.bfloat16),
                      torch.randn(3, 8, 3, dtype=torch.bfloat16), 2)
    with pytest.raises(ValueError, match="counts"):
        grouped_linear_fwd(x, torch.randn(3, 6, 8, dtype=torch.bfloat16), torch.ones(2, dtype=torch.int64))
