"""crucible's AdamW for a model: bf16 params (with bf16 moments, as torch keeps them for a bf16 model) are updated by
the fused seed (seeds/adamw_bf16.py: fp32 math, one launch per param group, 14 B/param), params of other dtypes by
torch's own functional AdamW. `patching.adamw(model, ...)` builds it only after the harness accepted the kernel at
the model's parameter sizes; otherwise it returns torch.optim.AdamW and says why.

    opt, outcome = patching.adamw(model, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
"""
from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
import torch
from torch.optim.adamw import adamw as torch_adamw

from patching.extract import TASKS_DIR, with_constants
from patching.kernels import Verifier
from patching.records import Verdict

log = logging.getLogger(__name__)

TASK = "adamw_bf16.py"


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update (decoupled weight decay, bias correction; no amsgrad, maximize or capturable) with
    the state torch keeps (`exp_avg`, `exp_avg_sq` in the param's dtype, `step`), so a state dict moves between the
    two. Per param group and dtype: bf16 params go through one launch of `adamw_bf16_step_`, their step counters
    are float32 tensors on the params' device, incremented there (no host sync per step); other dtypes through
    torch.optim.adamw.adamw (torch's foreach or single-tensor path, which reads its CPU step counters on the host)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"AdamW: invalid lr {lr}, betas {betas}, eps {eps} or weight_decay {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def _state_of(self, p: torch.Tensor, fused: bool) -> dict:
        state = self.state[p]
        if not state:
            # the fused path reads its step on the params' device; torch's path keeps it on the host, as torch does
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device if fused else "cpu")
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        elif fused and state["step"].device != p.device:  # loaded from a state dict of torch's AdamW
            state["step"] = state["step"].to(device=p.device, dtype=torch.float32)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            buckets: dict[torch.dtype, list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is not None:
                    if p.grad.is_sparse:
                        raise RuntimeError("AdamW does not support sparse gradients")
                    buckets.setdefault(p.dtype, []).append(p)
            for dtype, params in buckets.items():
                self._update(group, params, fused=dtype == torch.bfloat16)
        return loss

    def _update(self, group: dict, params: list[torch.Tensor], fused: bool) -> None:
        from seeds.adamw_bf16 import adamw_bf16_step_

        states = [self._state_of(p, fused) for p in params]
        grads = [p.grad for p in params]
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        steps = [s["step"] for s in states]
        lr, betas, eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if fused:
            torch._foreach_add_(steps, 1.0)
            adamw_bf16_step_(params, grads, exp_avgs, exp_avg_sqs, steps, lr, betas, eps, wd)
            return
        torch_adamw(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, beta1=betas[0],
                                beta2=betas[1], lr=lr, weight_decay=wd, eps=eps, maximize=False)


@dataclass(frozen=True)
class OptimizerResult:
    """Which AdamW `patching.adamw` returned, and why: crucible's when the harness accepted the fused kernel at the
    model's parameter sizes, torch's otherwise (never silently)."""

    optimizer: str           # "crucible" or "torch"
    reason: str
    task: str | None = None  # the task file written at the model's sizes
    verdicts: tuple[Verdict, ...] = ()

    @property
    def patched(self) -> bool:
        return self.optimizer == "crucible"

    def to_dict(self) -> dict:
        return {"optimizer": self.optimizer, "reason": self.reason, "task": self.task,
                "verdicts": [v.__dict__ for v in self.verdicts]}


def task_sizes(params: list[torch.Tensor]) -> list[int]:
    """Four representative sizes of the bf16 params (the task's N0..N3): the largest, the smallest, an odd one
    (no multiple of 16, where the model has one) and the median; repeats where the model has fewer."""
    sizes = sorted({p.numel() for p in params if p.numel()}, reverse=True)
    odd = [s for s in sizes if s % 16] or [sizes[len(sizes) // 2]]
    picked = [sizes[0], sizes[len(sizes) // 2], sizes[-1], odd[0]]
    return picked


def write_task(sizes: list[int], out_dir: Path, name: str, hyper: dict[str, float]) -> Path:
    """The shipped bf16 AdamW task at these four sizes and hyperparameters (as its init inputs)."""
    source = (TASKS_DIR / TASK).read_text(encoding="utf-8")
    values = {**{f"N{i}": s for i, s in enumerate(sizes)}, **{k.upper(): float(v) for k, v in hyper.items()}}
    text = with_constants(source, values, f"Written by `patching.adamw` for {name}: four of its bf16 parameter "
                                          "sizes and its optimizer's hyperparameters.")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / TASK
    path.write_text(text, encoding="utf-8")
    return path


def adamw(model_or_params, *, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
          weight_decay: float = 1e-2, name: str = "model", workdir: str | Path | None = None,
          verifier: Verifier | None = None
          ) -> tuple[torch.optim.Optimizer, OptimizerResult]:
    """AdamW for a model (or an iterable of params / param groups): crucible's when the harness accepts the fused
    bf16 kernel on the task written at the model's own parameter sizes, else torch.optim.AdamW (default foreach);
    the result says which and why. Only the seed is checked (its in-place step is what the optimizer runs; an
    archived winner of the task has only the task's out-of-place contract). `verifier`: a warm one to share."""
    params = list(model_or_params.parameters() if isinstance(model_or_params, torch.nn.Module) else model_or_params)
    flat = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    kwargs = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
    bf16 = [p for p in flat if p.dtype == torch.bfloat16 and p.numel()]
    if not bf16:
        return torch.optim.AdamW(params, **kwargs), OptimizerResult(
            "torch", "no bf16 parameters: crucible's fused AdamW is for bf16 params and moments")
    workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="crucible-adamw-"))
    task = write_task(task_sizes(bf16), workdir / "tasks", name,
                      dict(lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay))
    own = verifier is None
    if own:
        device = bf16[0].device
        verifier = Verifier("cuda" if device.type == "cuda" else "cpu", None, workdir)
    try:
        src, verdicts = verifier.first_accepted(str(task), TASK)
    finally:
        if own:
            verifier.close()
    if src is None or src.origin != "seed":
        why = "; ".join(f"{Path(v.kernel).name} ({v.origin}): {v.message}" for v in verdicts) or "none registered"
        if src is not None:
            why = f"{Path(src.path).name} ({src.origin}) was accepted, but the optimizer runs the seed's in-place step"
        return torch.optim.AdamW(params, **kwargs), OptimizerResult(
            "torch", f"{TASK}: {why}; torch.optim.AdamW instead", str(task), tuple(verdicts))
    others = sorted({str(p.dtype).removeprefix("torch.") for p in flat if p.dtype != torch.bfloat16})
    note = f"; {', '.join(others)} params through torch's functional AdamW" if others else ""
    return AdamW(params, **kwargs), OptimizerResult(
        "crucible", f"accepted at the model's parameter sizes: {Path(src.path).name} (seed){note}", str(task),
        tuple(verdicts))
