"""The task's reference, run in the trusted parent: in its own dtype (what PyTorch delivers) and in float64 (the
truth the tolerance module measures errors against). Also the check that a task is usable at all."""
from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

import torch

from .task import Task, TaskError

log = logging.getLogger(__name__)


@dataclass
class Expected:
    ref: list[torch.Tensor]
    truth: list[torch.Tensor] | None
    structure: str  # "tensor" or "tuple"

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.ref)


class Reference:
    def __init__(self, task: Task, device: str, model_seed: int):
        self.task = task
        self.device = device
        self.model_seed = model_seed
        try:
            self.model = task.make_reference(model_seed, device)
        except Exception as exc:
            raise TaskError(f"{task.path.name}: Model(*get_init_inputs()) failed: {type(exc).__name__}: {exc}") from None
        self.model64: torch.nn.Module | None = None
        try:
            self.model64 = copy.deepcopy(self.model).double()
        except Exception as exc:  # a module that cannot be upcast: compare against its own dtype only
            log.info("no float64 reference for %s: %s", task.name, exc)

    def init_inputs(self) -> list[Any]:
        return self.task.init_inputs()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu").clone() for k, v in self.model.state_dict().items()}

    def run(self, inputs: list[Any]) -> Expected:
        dev_inputs = [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]
        try:
            out = self.model(*dev_inputs)
        except Exception as exc:
            raise TaskError(f"{self.task.path.name}: the reference Model failed on its own inputs: "
                            f"{type(exc).__name__}: {exc}") from None
        structure = "tuple" if isinstance(out, (tuple, list)) else "tensor"
        ref = _as_list(out)
        if not all(isinstance(t, torch.Tensor) for t in ref):
            raise TaskError(f"{self.task.path.name}: the reference must return a tensor or a tuple of tensors")
        truth = None
        if self.model64 is not None and any(t.is_floating_point() for t in ref):
            try:
                up = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in dev_inputs]
                truth = [t.detach() for t in _as_list(self.model64(*up))]
                if len(truth) != len(ref) or any(a.shape != b.shape for a, b in zip(truth, ref)):
                    truth = None
            except Exception as exc:
                log.info("float64 reference failed for %s: %s", self.task.name, exc)
                self.model64, truth = None, None
        return Expected(ref=[t.detach() for t in ref], truth=truth, structure=structure)


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def check_task(task: Task, device: str, seed: int = 0) -> dict[str, Any]:
    """Refuse a task that cannot run or whose output ignores its inputs; return a summary of it otherwise."""
    ref = Reference(task, device, seed)
    a = ref.run(task.make_inputs(seed + 1, "normal", device))
    b = ref.run(task.make_inputs(seed + 2, "normal", device))
    if all(torch.equal(x, y) for x, y in zip(a.ref, b.ref)):
        raise TaskError(f"{task.path.name}: the reference returns the same output for different inputs, so any "
                        "constant would pass; make its output depend on its inputs")
    if all(x.numel() == 0 or (x.is_floating_point() and not bool(x.any())) for x in a.ref):
        raise TaskError(f"{task.path.name}: the reference returns only zeros; make its output depend on its inputs")
    return {
        "outputs": [{"shape": list(t.shape), "dtype": str(t.dtype)} for t in a.ref],
        "float64_reference": a.truth is not None,
        "constants": task.current_constants(),
    }
