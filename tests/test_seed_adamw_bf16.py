"""The bf16 AdamW seed (seeds/adamw_bf16.py) and crucible's optimizer around it (patching/optimizer.py), through the
Triton interpreter: the seed against the task's reference, in place against new tensors, several optimizer steps
against torch.optim.AdamW, state dicts both ways, and the verified constructor's fallback.

Bound against the reference: one bf16 ulp of the reference's value, plus 2^-20 of the output's largest magnitude.
Both compute in fp32 from the same bf16 values and round once, but in other orders (b1 m + (1 - b1) g against
torch's lerp, sqrt(v) times 1/sqrt(1 - b2^t) against a division, bias terms in fp64 against fp32), so the fp32
results differ by a few fp32 ulps: that flips a bf16 rounding where a value lies that close to a midpoint (one
ulp), and where a result cancels to near zero (m's two terms nearly opposite) the difference is fp32 rounding of
the terms, far below a bf16 ulp of the terms (the 2^-20 slack)."""
import copy
from pathlib import Path

import pytest
import torch
from torch.optim.adamw import adamw as torch_adamw

import patching
from patching.optimizer import AdamW, OptimizerResult, task_sizes, write_task
from patching.records import Verdict
from sandbox.task import load_task
from sandbox.tolerance import compare
from seeds.adamw_bf16 import ModelNew, adamw_bf16_step, adamw_bf16_step_
from tests.test_seed_adamw import unaligned_views

TASKS = Path(__file__).resolve().parent.parent / "tasks"
HYPER = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
SHAPES = [(37, 5), (1,), (1000,), (0,), (129,), (3, 7, 11), (64,), (2049,)]


def _ulp(x: torch.Tensor) -> torch.Tensor:
    """One bf16 ulp at each value of x (the spacing above |x|; the smallest normal's for zero)."""
    a = x.float().abs().clamp_min(torch.finfo(torch.bfloat16).tiny)
    return torch.ldexp(torch.ones_like(a), torch.frexp(a).exponent - 8)


def assert_within_ulp(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape, what
    if not want.numel():
        return
    diff = (got.float() - want.float()).abs()
    bound = _ulp(want) + 2.0 ** -20 * want.float().abs().max()
    bad = diff > bound
    if bad.any():
        i = int((diff - bound).argmax())
        raise AssertionError(f"{what}: {int(bad.sum())} of {want.numel()} beyond one bf16 ulp; worst at {i}: "
                             f"{got.flatten()[i].item()} against {want.flatten()[i].item()}")


@pytest.mark.parametrize("consts", [{"N0": 1, "N1": 1, "N2": 1, "N3": 1},
                                    {"N0": 4099, "N1": 257, "N2": 17, "N3": 2},
                                    {"N0": 30000, "N1": 4096, "N2": 31, "N3": 1000}])
@pytest.mark.parametrize("dist", ["normal", "uniform", "large", "outliers"])
def test_seed_against_the_task_reference(consts, dist, device):
    task = load_task(TASKS / "adamw_bf16.py").with_constants(consts)
    model = task.make_reference(0, device)
    inputs = task.make_inputs(3, dist, device)
    pristine = [x.clone() for x in inputs]
    got = ModelNew(*task.init_inputs())(*inputs)
    want = model(*inputs)
    truth = copy.deepcopy(model).double()(*[x.double() for x in inputs])
    assert all(torch.equal(a, b) for a, b in zip(inputs, pristine)), "the forward must not touch its inputs"
    assert len(got) == len(want) == 12
    for i, (g, w, t) in enumerate(zip(got, want, truth)):
        assert_within_ulp(g, w, f"out[{i}]")
        bad = compare(f"out[{i}]", g, w, t)
        assert bad is None, bad.describe()


def _state(shapes, seed=0, flat_offset=None, device="cpu"):
    """bf16 params, grads, exp_avgs, exp_avg_sqs; with flat_offset, each list views one buffer from that element on
    (so the arrays are not 16-element aligned)."""
    g = torch.Generator().manual_seed(seed)
    scales = (0.02, 1e-3, 1e-4, None)
    lists = [[((torch.rand(s, generator=g) * 1e-6) if k is None else torch.randn(s, generator=g) * k).bfloat16()
              .to(device) for s in shapes] for k in scales]
    return lists if flat_offset is None else unaligned_views(lists, flat_offset)


@pytest.mark.parametrize("flat_offset", [None, 5])
@pytest.mark.parametrize("block", [None, 64])
def test_in_place_equals_new_tensors_bitwise(flat_offset, block, device):
    """Eight tensors (one empty, odd sizes, optionally unaligned) in one launch, small chunks crossing tensors."""
    p, g, m, v = _state(SHAPES, flat_offset=flat_offset, device=device)
    step = torch.tensor(3.0, device=device)
    new = adamw_bf16_step(p, g, m, v, step, **HYPER, block=block)
    kept = [t.clone() for t in p + m + v]
    adamw_bf16_step_(p, g, m, v, step, **HYPER, block=block)
    assert all(torch.equal(a, b) for a, b in zip(p + m + v, [t for lst in new for t in lst]))
    assert not all(torch.equal(a, b) for a, b in zip(p + m + v, kept)), "the step changed nothing"


def test_a_step_per_param_is_read_per_tensor(device):
    """Per-param step tensors (an optimizer's state): each tensor's bias correction uses its own step."""
    p, g, m, v = _state([(300,), (70,)], seed=1, device=device)
    steps = [torch.tensor(1.0, device=device), torch.tensor(9.0, device=device)]
    one = adamw_bf16_step(p, g, m, v, steps, **HYPER, block=64)
    for i, s in enumerate(steps):
        alone = adamw_bf16_step([p[i]], [g[i]], [m[i]], [v[i]], s, **HYPER, block=64)
        assert all(torch.equal(one[k][i], alone[k][0]) for k in range(3)), i


def _torch_step(p, g, m, v, step):
    """torch's AdamW from this bf16 state: fp32 copies through torch.optim.adamw.adamw (single-tensor, fp32 math),
    rounded to bf16 once: what fused=True computes for bf16."""
    p32, m32, v32 = ([t.detach().float().clone()] for t in (p, m, v))
    torch_adamw(p32, [g.float()], m32, v32, [], [torch.tensor(float(step - 1))], foreach=False,
                            amsgrad=False, beta1=HYPER["betas"][0], beta2=HYPER["betas"][1], lr=HYPER["lr"],
                            weight_decay=HYPER["weight_decay"], eps=HYPER["eps"], maximize=False)
    return p32[0].bfloat16(), m32[0].bfloat16(), v32[0].bfloat16()


def test_optimizer_steps_against_torch_adamw(device):
    """Six steps of crucible's AdamW on bf16 params: each within one bf16 ulp of torch's update from the same state
    (the step counters, bias corrections and state handling included); over the six steps the params stay within
    6 x 2^-8 (normwise) of torch.optim.AdamW(foreach=False) run on fp32 copies, whose state is never rounded: each
    step rounds our p, m and v to bf16 once (2^-9 relative at most)."""
    torch.manual_seed(0)
    shapes = [(64, 48), (1000,), (17,), (3, 5)]
    params = [torch.nn.Parameter((torch.randn(s) * 0.02).bfloat16().to(device)) for s in shapes]
    fp32 = [torch.nn.Parameter(p.detach().float().clone()) for p in params]
    opt = AdamW(params, **HYPER)
    ref = torch.optim.AdamW(fp32, foreach=False, **HYPER)
    steps = 6
    for k in range(1, steps + 1):
        for p, q in zip(params, fp32):
            p.grad = (torch.randn(p.shape) * 1e-3).bfloat16().to(device)
            q.grad = p.grad.float()
        want = [_torch_step(p, p.grad, opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"], k) if opt.state
                else _torch_step(p, p.grad, torch.zeros_like(p), torch.zeros_like(p), k) for p in params]
        opt.step()
        ref.step()
        for i, (p, w) in enumerate(zip(params, want)):
            st = opt.state[p]
            assert st["step"].dtype == torch.float32 and float(st["step"]) == k
            for name, got, exp in zip(("param", "exp_avg", "exp_avg_sq"), (p.detach(), st["exp_avg"],
                                                                           st["exp_avg_sq"]), w):
                assert_within_ulp(got, exp, f"step {k} {name}[{i}]")
    for p, q in zip(params, fp32):
        gap = float((p.detach().float() - q.detach()).norm() / q.detach().norm())
        assert gap < steps * 2.0 ** -8, gap


def test_state_dict_round_trips_with_torch(device):
    params = [torch.nn.Parameter((torch.randn(s) * 0.02).bfloat16().to(device)) for s in [(40, 3), (7,)]]
    opt = AdamW(params, **HYPER)
    for p in params:
        p.grad = torch.randn(p.shape).bfloat16().to(device) * 1e-3
    opt.step()
    sd = opt.state_dict()
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert sd["state"][0]["exp_avg"].dtype == torch.bfloat16 and float(sd["state"][0]["step"]) == 1
    assert set(sd["param_groups"][0]) >= {"lr", "betas", "eps", "weight_decay", "params"}
    theirs = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone()) for p in params], **HYPER)
    theirs.load_state_dict(sd)  # torch's AdamW takes crucible's state, and crucible's takes torch's back
    again = AdamW(params, **HYPER)
    again.load_state_dict(theirs.state_dict())
    again.step()
    assert float(again.state[params[0]]["step"]) == 2


def test_other_dtypes_take_torch_functional_adamw(device):
    """An fp32 param beside bf16 ones: updated exactly as torch.optim.AdamW (its default path: foreach on a GPU,
    single-tensor on the CPU, which differ in their last bits) updates it."""
    torch.manual_seed(1)
    w32 = torch.nn.Parameter(torch.randn(33).to(device))
    w16 = torch.nn.Parameter(torch.randn(20).bfloat16().to(device))
    twin = torch.nn.Parameter(w32.detach().clone())
    opt, ref = AdamW([w32, w16], **HYPER), torch.optim.AdamW([twin], **HYPER)
    for _ in range(3):
        g = torch.randn(33).to(device)
        w32.grad, twin.grad, w16.grad = g.clone(), g.clone(), torch.randn(20).bfloat16().to(device)
        opt.step()
        ref.step()
    assert torch.equal(w32.detach(), twin.detach())
    assert opt.state[w32]["step"].device.type == "cpu" and float(opt.state[w16]["step"]) == 3


def test_task_written_at_the_model_sizes(tmp_path):
    params = [torch.zeros(s, dtype=torch.bfloat16) for s in [(512, 64), (64,), (1000,), (64, 64), (7, 3)]]
    assert task_sizes(params) == [32768, 1000, 21, 1000]
    path = write_task(task_sizes(params), tmp_path, "m", dict(lr=3e-4, beta1=0.8, beta2=0.99, eps=1e-6,
                                                             weight_decay=0.05))
    task = load_task(path, rescale=False)
    assert [task.current_constants()[f"N{i}"] for i in range(4)] == [32768, 1000, 21, 1000]
    assert task.init_inputs() == [3e-4, 0.8, 0.99, 1e-6, 0.05]


class _Rejecting:
    def first_accepted(self, task_path, shipped):
        return None, [Verdict(task_path, "seeds/adamw_bf16.py", "seed", False, "correctness: output 0 mismatched")]


def test_a_rejected_kernel_gives_torch_adamw_and_says_why(tmp_path):
    model = torch.nn.Linear(8, 4).to(torch.bfloat16)
    opt, result = patching.adamw(model, **HYPER, workdir=tmp_path, verifier=_Rejecting())
    assert type(opt) is torch.optim.AdamW and isinstance(result, OptimizerResult)
    assert not result.patched and "output 0 mismatched" in result.reason and "torch.optim.AdamW" in result.reason
    fp32 = torch.nn.Linear(8, 4)
    opt, result = patching.adamw(fp32, **HYPER, workdir=tmp_path)
    assert type(opt) is torch.optim.AdamW and "no bf16 parameters" in result.reason


@pytest.mark.slow
def test_the_harness_accepts_the_seed_at_a_model_sizes(tmp_path, device):
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 10)).to(torch.bfloat16).to(device)
    opt, result = patching.adamw(model, **HYPER, name="mlp", workdir=tmp_path)
    assert isinstance(opt, AdamW) and result.patched, result.reason
    assert [v.accepted for v in result.verdicts] == [True]
    assert load_task(result.task, rescale=False).current_constants()["N0"] == 96 * 64
