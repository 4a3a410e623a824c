"""Linear + cross-entropy (an LM head and its loss), forward and backward: the loss and the gradients of the hidden
states and of the head's weight, from bf16 x [BT, H] and weight [V, H] (Llama-3 8B: H 4096, V 128256). This
reference materialises the [BT, V] logits (and their fp32 copy); a fused kernel should not. About 5% of the targets
are ignore_index."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BT = 8192     # tokens (batch x sequence)
H = 4096      # hidden size
V = 128256    # vocabulary
IGNORE_INDEX = -100

CRUCIBLE_FIXED = ["IGNORE_INDEX"]
CRUCIBLE_FLOPS = "lambda c: 3 * 2 * c['BT'] * c['H'] * c['V']"  # logits, dx and dweight products


class Model(nn.Module):
    def __init__(self, hidden: int, vocab: int, ignore_index: int = -100, label_smoothing: float = 0.0,
                 reduction: str = "mean"):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, hidden, dtype=torch.bfloat16) * 0.02)
        self.ignore_index, self.label_smoothing, self.reduction = ignore_index, label_smoothing, reduction

    def forward(self, x: torch.Tensor, target: torch.Tensor):
        x = x.detach().requires_grad_()
        logits = F.linear(x, self.weight)
        loss = F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), target,
                               ignore_index=self.ignore_index, label_smoothing=self.label_smoothing,
                               reduction=self.reduction)
        dx, dw = torch.autograd.grad(loss, (x, self.weight))
        return loss.detach(), dx, dw


def get_inputs():
    target = torch.randint(0, V, (BT,))
    target[torch.rand(BT) < 0.05] = IGNORE_INDEX
    return [torch.randn(BT, H, dtype=torch.bfloat16), target]


def get_init_inputs():
    return [H, V, IGNORE_INDEX, 0.0, "mean"]


def crucible_liger(model):
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    def run(x, target):
        x = x.detach().requires_grad_()
        loss = LigerFusedLinearCrossEntropyFunction.apply(x, model.weight, target, None, None, model.ignore_index,
                                                          0.0, model.label_smoothing, model.reduction)[0]
        dx, dw = torch.autograd.grad(loss, (x, model.weight))
        return loss.detach(), dx, dw

    return run
