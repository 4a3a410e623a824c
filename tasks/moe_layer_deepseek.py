"""A DeepSeek/Qwen-like MoE layer forward (64 small experts, top-8, H 2048, F 1408, 16k tokens, bf16): DeepSeek-V3
routing (sigmoid scores; experts chosen on scores + a per-expert bias; weights the unbiased scores, renormalised and
scaled by 2.5), each expert a SwiGLU FFN (gate/up [2F, H], down [H, F]), outputs combined with the routing weights
in fp32. DeepSeek-V3's group-limited choice (best groups first) is left out. The reference is the per-expert loop
(index_select, matmul, index_add) that ANCHORS.md measured: 12.9 ms = 176 TFLOP/s on the H200.

The router's projection (x @ W_router^T, T x H x E, about 0.2% of the FLOPs) is the caller's: its logits are an
input, drawn on a grid of distinct values per token so that the top-k choice has no ties and no near-ties. A
bf16 router GEMM summed in another order flips near-tied choices, which no tolerance on the output absorbs."""
import torch
import torch.nn as nn
import torch.nn.functional as F

T = 16384        # tokens
H = 2048         # hidden size
FFN = 1408       # expert FFN width
EXPERTS = 64
TOP_K = 8

CRUCIBLE_FIXED = ["EXPERTS"]  # the router keeps all experts of a token in one block
CRUCIBLE_FIXED_INPUTS = [1]  # the router logits: a tie-free grid, never redrawn
CRUCIBLE_FLOPS = "lambda c: 6 * c['T'] * c['TOP_K'] * c['H'] * c['FFN']"


class Model(nn.Module):
    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int, scoring: str = "softmax",
                 routed_scale: float = 1.0):
        super().__init__()
        self.w_gate_up = nn.Parameter(torch.randn(experts, 2 * ffn, hidden, dtype=torch.bfloat16) * hidden ** -0.5)
        self.w_down = nn.Parameter(torch.randn(experts, hidden, ffn, dtype=torch.bfloat16) * ffn ** -0.5)
        if scoring == "sigmoid":  # DeepSeek-V3's load-balancing correction, only for choosing experts
            self.register_buffer("router_bias", 0.11 * (torch.arange(experts) % 3 - 1).float())
        self.experts, self.top_k, self.scoring, self.routed_scale = experts, top_k, scoring, routed_scale

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        if self.scoring == "softmax":  # Mixtral
            weights, ids = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
        else:  # DeepSeek-V3: choose on sigmoid + bias, weigh by the unbiased sigmoid
            scores = torch.sigmoid(logits)
            ids = torch.topk(scores + self.router_bias.to(scores.dtype), self.top_k, dim=-1)[1]
            weights = scores.gather(1, ids)
        return weights / weights.sum(dim=-1, keepdim=True) * self.routed_scale, ids

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(router_logits)
        out = torch.zeros(x.shape, dtype=weights.dtype, device=x.device)
        for e in range(self.experts):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            xe = x.index_select(0, tok)
            gate, up = (xe @ self.w_gate_up[e].t()).chunk(2, dim=-1)
            ye = (F.silu(gate) * up) @ self.w_down[e].t()
            out.index_add_(0, tok, ye.to(weights.dtype) * weights[tok, slot, None])
        return out.to(x.dtype)


def router_logits(tokens: int, experts: int) -> torch.Tensor:
    """Each token's logits are a random permutation of the grid (j - E/2) * 4/E, exact in bf16."""
    perm = torch.argsort(torch.rand(tokens, experts), dim=1)
    return ((perm - experts // 2) * (4.0 / experts)).to(torch.bfloat16)


def get_inputs():
    return [torch.randn(T, H, dtype=torch.bfloat16), router_logits(T, EXPERTS)]


def get_init_inputs():
    return [H, FFN, EXPERTS, TOP_K, "sigmoid", 2.5]


def crucible_vendor(model):
    """torch._grouped_mm for both projections, routing/SwiGLU/combine as PyTorch ops: the `vendor` baseline."""
    from profiler.vendor_ops import moe_layer
    return moe_layer(model)
