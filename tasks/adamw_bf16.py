"""AdamW step on bf16 params with bf16 moments (what torch.optim.AdamW keeps for a bf16 model: exp_avg and
exp_avg_sq in the parameter's dtype), computed in fp32 and rounded to bf16 once per result, as torch's
AdamW(fused=True) does for bf16 (fp32 "opmath"): decoupled weight decay, bias correction, no amsgrad.

Inputs, flat: the N_TENSORS params, then their grads, exp_avgs and exp_avg_sqs (all bf16), then the step (a 0-d
fp32 tensor: the step number after this update). The forward returns NEW tensors, never updating its inputs (so
the harness can compare them): the params, exp_avgs and exp_avg_sqs after the step, all bf16. The minimum traffic
is 14 B/param: read p, g, m, v and write p, m, v, 2 bytes each. The sizes are a few of a 1B Llama's tensors: an MLP
projection, a key/value projection, a norm weight and an odd size.
"""
import torch
import torch.nn as nn

N0 = 16777216   # a 2048 x 8192 MLP projection
N1 = 1048576    # a 2048 x 512 key/value projection
N2 = 2048       # a norm weight
N3 = 1000       # an odd-sized tensor
N_TENSORS = 4
STEP = 10
LR = 1e-3
BETA1 = 0.9
BETA2 = 0.95
EPS = 1e-8
WEIGHT_DECAY = 0.1

CRUCIBLE_FIXED = ["STEP"]
CRUCIBLE_FIXED_INPUTS = [12, 13, 14, 15, 16]  # exp_avg_sq must stay >= 0; the step is not data
CRUCIBLE_BYTES = "lambda c: 14 * (c['N0'] + c['N1'] + c['N2'] + c['N3'])"  # read p, g, m, v; write p, m, v


class Model(nn.Module):
    def __init__(self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float):
        super().__init__()
        self.lr, self.beta1, self.beta2, self.eps, self.weight_decay = lr, beta1, beta2, eps, weight_decay

    def forward(self, *state):
        n = (len(state) - 1) // 4
        params, grads, exp_avgs, exp_avg_sqs = (state[i * n:(i + 1) * n] for i in range(4))
        step = state[-1]
        bias1 = 1 - self.beta1 ** step
        bias2_sqrt = (1 - self.beta2 ** step).sqrt()
        new_p, new_m, new_v = [], [], []
        for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
            opmath = torch.promote_types(p.dtype, torch.float32)  # fp32 for bf16; float64 for the harness's truth
            p32, g32, m32, v32 = (t.to(opmath) for t in (p, g, m, v))
            p32 = p32 * (1 - self.lr * self.weight_decay)
            m32 = m32.lerp(g32, 1 - self.beta1)
            v32 = v32 * self.beta2 + (1 - self.beta2) * g32 * g32
            p32 = p32 - (self.lr / bias1) * m32 / (v32.sqrt() / bias2_sqrt + self.eps)
            new_p.append(p32.to(p.dtype))
            new_m.append(m32.to(m.dtype))
            new_v.append(v32.to(v.dtype))
        return (*new_p, *new_m, *new_v)


def get_inputs():
    sizes = [N0, N1, N2, N3]
    params = [(torch.randn(s) * 0.02).to(torch.bfloat16) for s in sizes]
    grads = [(torch.randn(s) * 1e-3).to(torch.bfloat16) for s in sizes]
    exp_avgs = [(torch.randn(s) * 1e-4).to(torch.bfloat16) for s in sizes]
    exp_avg_sqs = [(torch.rand(s) * 1e-6).to(torch.bfloat16) for s in sizes]
    return [*params, *grads, *exp_avgs, *exp_avg_sqs, torch.tensor(float(STEP))]


def get_init_inputs():
    return [LR, BETA1, BETA2, EPS, WEIGHT_DECAY]
