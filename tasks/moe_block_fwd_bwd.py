"""A Mixtral-style sparse MoE block, forward and backward (8 experts, top-2, H 4096, F 14336, 16k tokens, bf16): for
router logits, the output y and the gradients of x, of the logits and of the experts' weights for an upstream
gradient dy. Each token takes the top-k experts of softmax(logits) with their weights renormalised, each expert is
a SwiGLU MLP down(silu(x W1^T) * x W3^T) on its tokens, and the experts' outputs are combined with the routing
weights in fp32: the forward of tasks/moe_layer_mixtral.py, whose seed serves a patched model's forward. The
reference loops over the experts with autograd; seeds/moe_block.py groups the tokens by expert.

As in tasks/moe_layer_mixtral.py, the router's projection (x @ W_router^T and its two gradients, about 0.01% of the
FLOPs) is the caller's: the logits are an input, on a grid of distinct values per token, so the top-k choice has no
ties and no near-ties. A bf16 router GEMM summed in another order flips near-tied choices, which no tolerance on the
outputs absorbs. The caller adds dlogits @ W_router to dx and takes dW_router = dlogits^T x.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

T = 16384      # tokens (batch x sequence)
H = 4096       # hidden size
FFN = 14336    # expert FFN width
EXPERTS = 8
TOP_K = 2

CRUCIBLE_FIXED_INPUTS = [1]  # the router logits: a tie-free grid, never redrawn
CRUCIBLE_FLOPS = "lambda c: 3 * 6 * c['T'] * c['TOP_K'] * c['H'] * c['FFN']"  # forward and the backward's 2x


class Model(nn.Module):
    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(experts, ffn, hidden, dtype=torch.bfloat16) * hidden ** -0.5)
        self.w3 = nn.Parameter(torch.randn(experts, ffn, hidden, dtype=torch.bfloat16) * hidden ** -0.5)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, ffn, dtype=torch.bfloat16) * ffn ** -0.5)
        self.top_k = top_k

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor, dy: torch.Tensor):
        """(y, dx, dlogits, dw1, dw3, dw2)."""
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            logits = router_logits.detach().requires_grad_()
            params = [p.detach().requires_grad_() for p in (self.w1, self.w3, self.w2)]
            w1, w3, w2 = params
            probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
            weights, ids = torch.topk(probs, self.top_k, dim=-1)
            weights = weights / weights.sum(dim=-1, keepdim=True)
            out = torch.zeros(x.shape, dtype=weights.dtype, device=x.device)
            for e in range(w1.shape[0]):
                tok, slot = (ids == e).nonzero(as_tuple=True)
                xe = x[tok]
                ye = (F.silu(xe @ w1[e].t()) * (xe @ w3[e].t())) @ w2[e].t()
                out = out.index_add(0, tok, ye.to(weights.dtype) * weights[tok, slot, None])
            y = out.to(x.dtype)
            grads = torch.autograd.grad(y, [x, logits, *params], dy)
        return (y.detach(), *grads)


def router_logits(tokens: int, experts: int) -> torch.Tensor:
    """Each token's logits are a random permutation of the grid (j - E/2) * 4/E, exact in bf16."""
    perm = torch.argsort(torch.rand(tokens, experts), dim=1)
    return ((perm - experts // 2) * (4.0 / experts)).to(torch.bfloat16)


def get_inputs():
    return [torch.randn(T, H, dtype=torch.bfloat16), router_logits(T, EXPERTS),
            torch.randn(T, H, dtype=torch.bfloat16)]


def get_init_inputs():
    return [H, FFN, EXPERTS, TOP_K]
