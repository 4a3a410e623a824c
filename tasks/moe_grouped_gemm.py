"""Grouped GEMM over experts, the expert projection of an MoE layer: the rows of x are grouped by expert, expert e
owning the next counts[e] rows, and y = x_e @ W_e^T for each expert (W [E, F, H], nn.Linear's layout).
64 experts x 2048 rows, H 4096 -> F 1408 (a DeepSeek/Qwen-sized expert's gate projection), bf16.
SKEW = 1 gives every expert the same load; SKEW = s > 1 gives expert 0 s times the average load and spreads the
rest evenly (the target: within 15% of the uniform speed at s = 8). With few rows some experts get none.
ANCHORS.md (H200): this loop over experts 592 TFLOP/s, torch._grouped_mm 573, a uniform bmm 669."""
import torch
import torch.nn as nn

EXPERTS = 64
TOKENS = 131072  # routed rows in all (64 x 2048)
H = 4096         # in features
F = 1408         # out features
SKEW = 1

CRUCIBLE_FIXED = ["EXPERTS"]
CRUCIBLE_FIXED_INPUTS = [1]
CRUCIBLE_FLOPS = "lambda c: 2 * c['TOKENS'] * c['H'] * c['F']"


def expert_counts(tokens: int, experts: int, skew: int) -> list[int]:
    """Rows per expert: expert 0 gets `skew` times the average (at most all rows), the others share the rest."""
    heavy = min(tokens, skew * tokens // experts) if skew > 1 else 0
    rest, others = tokens - heavy, experts - (1 if skew > 1 else 0)
    even = [rest // others + (1 if i < rest % others else 0) for i in range(others)]
    return ([heavy] if skew > 1 else []) + even


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    outs, start = [], 0
    for e, n in enumerate(counts.tolist()):
        outs.append(x[start:start + n] @ weight[e].t())
        start += n
    return torch.cat(outs)


class Model(nn.Module):
    def __init__(self, experts: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(experts, out_features, in_features, dtype=torch.bfloat16)
                                   * in_features ** -0.5)

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return grouped_linear(x, self.weight, counts)


def get_inputs():
    return [torch.randn(TOKENS, H, dtype=torch.bfloat16), torch.tensor(expert_counts(TOKENS, EXPERTS, SKEW))]


def get_init_inputs():
    return [EXPERTS, H, F]


def crucible_vendor(model):
    """torch._grouped_mm (cuBLAS's grouped GEMM), the `vendor` baseline: ANCHORS.md's 573 TFLOP/s."""
    from profiler.vendor_ops import grouped_linear as vendor_grouped_linear
    return vendor_grouped_linear(model.weight)
