"""Kills its parent, the zygote (kill(getppid(), SIGKILL) through libc), then returns as if nothing happened. The
check in flight must still end with a verdict that blames the candidate, and the next check must get a fresh
zygote.

It raises the sandbox's trusted flag first, as a candidate past the static stage might try; where a runtime layer
still refuses (the audit hook, a PID namespace in which its parent is a trusted init), the attack fails and the
candidate is rejected for that instead. Either way the check must end with a rejection within its timeout."""
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
        ctypes.CDLL(None).kill(os.getppid(), signal.SIGKILL)
        return torch.empty(x.shape[0], dtype=x.dtype)
