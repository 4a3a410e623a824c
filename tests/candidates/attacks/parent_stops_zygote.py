"""Stops its parent, the zygote (kill(getppid(), SIGSTOP) through libc): the zygote would then never answer the
harness's spawn or wait request. The check must end with a verdict that blames the candidate, within its timeout,
and the next check must get a fresh zygote."""
import ctypes
import os
import signal

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        from sandbox import policy
        if policy._POLICY is not None:
            policy._POLICY.trusted_depth += 1000
        ctypes.CDLL(None).kill(os.getppid(), signal.SIGSTOP)
        return torch.empty(x.shape[0], dtype=x.dtype)
