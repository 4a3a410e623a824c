"""THREATS #3: ModelNew inherits the reference Model."""
import torch
import triton
import triton.language as tl
from reference import Model


@triton.jit
def _noop(x_ptr):
    pass


class ModelNew(Model):
    pass
