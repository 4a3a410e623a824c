"""AdamW step (torch.optim.AdamW's update: decoupled weight decay, bias correction), fp32 master weights and
moments, and the bf16 copy of the weights that the next forward uses.

Inputs, flat: the N_TENSORS params, then their grads, exp_avgs and exp_avg_sqs (all fp32), then the step (a 0-d
fp32 tensor: the step number after this update). The forward returns NEW tensors, never updating its inputs (so
the harness can compare them): the params, exp_avgs and exp_avg_sqs after the step, then the params in bf16.
The sizes are a handful of a transformer's tensors; the ANCHORS configuration (1B params in 64 tensors) is
timed by benchmarks/bench_mix.py.
"""
import torch
import torch.nn as nn

N0 = 16777216   # a 4096 x 4096 projection
N1 = 5767168    # a 1408 x 4096 expert projection
N2 = 4096       # a norm weight
N3 = 1000       # an odd-sized tensor
N_TENSORS = 4
STEP = 10

CRUCIBLE_FIXED = ["STEP"]
CRUCIBLE_FIXED_INPUTS = [12, 13, 14, 15, 16]  # exp_avg_sq must stay >= 0; the step is not data
CRUCIBLE_BYTES = "lambda c: 30 * (c['N0'] + c['N1'] + c['N2'] + c['N3'])"  # read p, g, m, v; write p, m, v, p16


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
            p = p * (1 - self.lr * self.weight_decay)
            m = m.lerp(g.to(m.dtype), 1 - self.beta1)
            v = v * self.beta2 + (1 - self.beta2) * g.to(v.dtype) * g.to(v.dtype)
            p = p - (self.lr / bias1) * m / (v.sqrt() / bias2_sqrt + self.eps)
            new_p.append(p)
            new_m.append(m)
            new_v.append(v)
        return (*new_p, *new_m, *new_v, *[p.to(torch.bfloat16) for p in new_p])


def get_inputs():
    sizes = [N0, N1, N2, N3]
    params = [torch.randn(s) * 0.02 for s in sizes]
    grads = [torch.randn(s) * 1e-3 for s in sizes]
    exp_avgs = [torch.randn(s) * 1e-4 for s in sizes]
    exp_avg_sqs = [torch.rand(s) * 1e-6 for s in sizes]
    return [*params, *grads, *exp_avgs, *exp_avg_sqs, torch.tensor(float(STEP))]


def get_init_inputs():
    return [1e-3, 0.9, 0.95, 1e-8, 0.1]
