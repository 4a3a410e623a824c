"""Grouped GEMM over experts, backward: for y = x_e @ W_e^T per expert (rows of x grouped by expert, expert e
owning the next counts[e] rows; W [E, F, H]), the gradients dx_e = dy_e @ W_e and dW_e = dy_e^T @ x_e.
An expert without rows gets dW_e = 0. Shapes as tasks/moe_grouped_gemm.py (64 experts x 2048 rows, H 4096,
F 1408, bf16; SKEW = s gives expert 0 s times the average load)."""
import torch
import torch.nn as nn

EXPERTS = 64
TOKENS = 131072
H = 4096
F = 1408
SKEW = 1

CRUCIBLE_FIXED = ["EXPERTS"]
CRUCIBLE_FIXED_INPUTS = [1]
CRUCIBLE_FLOPS = "lambda c: 4 * c['TOKENS'] * c['H'] * c['F']"  # dx and dW products


def expert_counts(tokens: int, experts: int, skew: int) -> list[int]:
    """Rows per expert: expert 0 gets `skew` times the average (at most all rows), the others share the rest."""
    heavy = min(tokens, skew * tokens // experts) if skew > 1 else 0
    rest, others = tokens - heavy, experts - (1 if skew > 1 else 0)
    even = [rest // others + (1 if i < rest % others else 0) for i in range(others)]
    return ([heavy] if skew > 1 else []) + even


class Model(nn.Module):
    def __init__(self, experts: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(experts, out_features, in_features, dtype=torch.bfloat16)
                                   * in_features ** -0.5)

    def forward(self, x: torch.Tensor, counts: torch.Tensor, dy: torch.Tensor):
        x = x.detach().requires_grad_()
        outs, start = [], 0
        for e, n in enumerate(counts.tolist()):
            outs.append(x[start:start + n] @ self.weight[e].t())
            start += n
        return torch.autograd.grad(torch.cat(outs), (x, self.weight), dy)


def get_inputs():
    return [torch.randn(TOKENS, H, dtype=torch.bfloat16), torch.tensor(expert_counts(TOKENS, EXPERTS, SKEW)),
            torch.randn(TOKENS, F, dtype=torch.bfloat16)]


def get_init_inputs():
    return [EXPERTS, H, F]


def crucible_vendor(model):
    """torch._grouped_mm for dx and dW (cuBLAS's grouped GEMM), the `vendor` baseline."""
    from profiler.vendor_ops import grouped_linear_backward
    return grouped_linear_backward(model.weight)
