"""Stops its own process (SIGSTOP through libc) in the middle of forward: it would never answer, and a parent that
waits on it for the whole timeout (or forever, in a wait without a deadline) is what this attack is after.

It raises the sandbox's trusted flag first, as a candidate past the static stage might try; where a runtime layer
still refuses (the audit hook, a PID namespace in which its parent is a trusted init), the attack fails and the
candidate is rejected for that instead. Either way the check must end with a rejection within its timeout."""
import ctypes
import os
import signal

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        from sandbox import policy
        if policy._POLICY is not None:
            policy._POLICY.trusted_depth += 1000  # the audit hook then lets dlopen through
        ctypes.CDLL(None).kill(os.getpid(), signal.SIGSTOP)
        return x.mean(dim=-1)
