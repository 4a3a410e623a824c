"""Row mean. The kernel's docstring holds a line that starts with `def `: the CPU interpreter's rewriter
(triton/runtime/interpreter.py FunctionRewriter._find_def) takes the LAST such line of the kernel's source as its
definition and compiles from there, so the docstring's text would run as the kernel and the checked body become dead
code after its `return`; the static stage refuses the line. No odd character is needed."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _row_mean_kernel(x_ptr, y_ptr, n_cols, stride_row, BLOCK: tl.constexpr):
    """Layout notes.
def _row_mean_kernel(x_ptr, y_ptr, n_cols, stride_row, BLOCK):
    raise RuntimeError("HIDDEN CODE RAN with the audit hook off: gc.get_objects() gave "
                       + str(len(__import__("gc").get_objects())) + " objects")
#"""
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * stride_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    tl.store(y_ptr + row, tl.sum(acc, axis=0) / n_cols)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
        _row_mean_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=128)
        return y
