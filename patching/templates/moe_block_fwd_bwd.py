"""A Mixtral-style sparse MoE block, forward and backward: the output y and the gradients of x, the router and the
experts' weights for an upstream gradient dy, bf16. The router is a softmax over x @ gate^T, each token takes its
top-k experts with their weights renormalised, each expert is a SwiGLU MLP down(silu(x W1^T) * x W3^T) on its
tokens. The reference loops over the experts; a fused kernel groups the tokens by expert (crucible's
seeds/moe_layer.py is this block's forward, seeds/moe_bwd.py the grouped GEMM's backward).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

T = 16384      # tokens (batch x sequence)
H = 4096       # hidden size
FFN = 14336    # expert FFN width
EXPERTS = 8
TOP_K = 2

CRUCIBLE_FLOPS = "lambda c: 3 * 6 * c['T'] * c['TOP_K'] * c['H'] * c['FFN']"  # forward and the backward's 2x


class Model(nn.Module):
    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int):
        super().__init__()
        self.gate = nn.Parameter(torch.randn(experts, hidden, dtype=torch.bfloat16) * hidden ** -0.5)
        self.w1 = nn.Parameter(torch.randn(experts, ffn, hidden, dtype=torch.bfloat16) * hidden ** -0.5)
        self.w3 = nn.Parameter(torch.randn(experts, ffn, hidden, dtype=torch.bfloat16) * hidden ** -0.5)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, ffn, dtype=torch.bfloat16) * ffn ** -0.5)
        self.top_k = top_k

    def forward(self, x: torch.Tensor, dy: torch.Tensor):
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            params = [p.detach().requires_grad_() for p in (self.gate, self.w1, self.w3, self.w2)]
            gate, w1, w3, w2 = params
            probs = torch.softmax((x @ gate.t()).float(), dim=-1)
            weights, ids = torch.topk(probs, self.top_k, dim=-1)
            weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
            y = torch.zeros_like(x)
            for e in range(gate.shape[0]):
                tok, slot = (ids == e).nonzero(as_tuple=True)
                xe = x[tok]
                ye = (F.silu(xe @ w1[e].t()) * (xe @ w3[e].t())) @ w2[e].t()
                y = y.index_add(0, tok, ye * weights[tok, slot, None])
            grads = torch.autograd.grad(y, [x, *params], dy)
        return (y.detach(), *grads)


def get_inputs():
    return [torch.randn(T, H, dtype=torch.bfloat16), torch.randn(T, H, dtype=torch.bfloat16)]


def get_init_inputs():
    return [H, FFN, EXPERTS, TOP_K]
