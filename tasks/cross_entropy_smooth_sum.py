"""Cross-entropy forward and backward over a large vocabulary (Llama-3's 128256), with label smoothing 0.1 and reduction='sum': the loss and dlogits, the
gradient for an upstream gradient of 1, from bf16 logits (the loss is computed in fp32, as training code does).
About 5% of the targets are ignore_index."""
import torch
import torch.nn as nn
import torch.nn.functional as F

N = 8192      # tokens (batch x sequence)
V = 128256    # vocabulary
IGNORE_INDEX = -100

CRUCIBLE_FIXED = ["IGNORE_INDEX"]
CRUCIBLE_BYTES = "lambda c: 2 * 2 * c['N'] * c['V'] + 8 * c['N']"  # bf16: read logits, write dlogits; targets


class Model(nn.Module):
    def __init__(self, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean"):
        super().__init__()
        self.ignore_index, self.label_smoothing, self.reduction = ignore_index, label_smoothing, reduction

    def forward(self, logits: torch.Tensor, target: torch.Tensor):
        x = logits.detach().requires_grad_()
        loss = F.cross_entropy(x.to(torch.promote_types(x.dtype, torch.float32)), target,
                               ignore_index=self.ignore_index, label_smoothing=self.label_smoothing,
                               reduction=self.reduction)
        (dx,) = torch.autograd.grad(loss, x)
        return loss.detach(), dx


def get_inputs():
    target = torch.randint(0, V, (N,))
    target[torch.rand(N) < 0.05] = IGNORE_INDEX
    return [torch.randn(N, V, dtype=torch.bfloat16), target]


def get_init_inputs():
    return [IGNORE_INDEX, 0.1, "sum"]


def crucible_liger(model):
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

    # Liger writes the gradient over its input logits (what it does in training too).
    def run(logits, target):
        x = logits.detach().requires_grad_()
        loss = LigerCrossEntropyFunction.apply(x, target, None, model.ignore_index, 0.0, model.label_smoothing,
                                               model.reduction)[0]  # (loss, z_loss, accuracy, tokens)
        (dx,) = torch.autograd.grad(loss, x)
        return loss.detach(), dx

    return run
