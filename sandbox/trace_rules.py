"""The launch trace's rules as data: which aten ops are glue, which allocate, how many scalars and Python floats a
call may take into or out of torch, and what a kernel body on the interpreter must not touch; with the check of the
Python data a tensor is built from.

sandbox/trace.py enforces them; they are kept apart so that the policy can be read (and the LLM told the same) without
the machinery that enforces it. Everything here is immutable.
"""
from __future__ import annotations

from typing import Any

import torch

GLUE_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "scalar_tensor", "arange", "fill_", "zero_",
    "copy_", "clone", "contiguous", "_to_copy", "to", "detach", "alias", "lift_fresh", "lift_fresh_copy", "view",
    "_unsafe_view", "reshape", "_reshape_alias", "view_as", "as_strided", "transpose", "t", "permute", "expand",
    "expand_as", "squeeze", "unsqueeze", "flatten", "unflatten", "select", "slice", "narrow", "split",
    "split_with_sizes", "chunk", "unbind", "cat", "stack", "_local_scalar_dense", "resize_", "sym_size",
    "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "record_stream", "set_",
})
ALLOCATING_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
# Values a forward may read into Python a call (an exponent, a count for a grid): enough for control, too few to
# compute an output from.
SCALAR_READS = 16
# Python data a tensor may be built from: any number of ints (index tables, offsets), at most this many floats.
PY_FLOATS = 16
# Every value read into Python runs the aten op SCALAR_OP once (.item(), float(t), an index or a size taken from a
# tensor); the functions below read values without it (text and lists: each element counts), or with it (one each),
# and are counted where they are called instead.
SCALAR_OP = "_local_scalar_dense"
SCALAR_FUNCS = frozenset({"item", "__float__", "__int__", "__bool__", "__index__", "__complex__"})
TEXT_FUNCS = frozenset({"tolist", "__repr__", "__str__", "__format__"})
BUILDERS = frozenset({"tensor", "as_tensor", "asarray", "new_tensor"})
REFUSED_FUNCS = {"numpy": "Tensor.numpy()", "__array__": "converting a tensor to a numpy array"}
# Names a kernel body must not touch on the interpreter: the raw numpy data behind its tensors and pointers.
BODY_ATTRS = frozenset({"handle", "numpy", "tolist", "item", "data_ptr", "untyped_storage", "storage"})
BODY_BUILTINS_REFUSED = frozenset({"eval", "exec", "open", "__import__", "getattr", "setattr", "delattr", "globals",
                                    "vars", "locals", "compile", "breakpoint", "input", "memoryview", "type", "object"})
PLAIN = (int, float, bool, str, bytes, type(None), torch.dtype)


def py_data_problem(data: Any) -> str | None:
    """Why a tensor must not be built from `data` (Python values or an array), or None."""
    if isinstance(data, torch.Tensor) or isinstance(data, PLAIN):
        return None
    if hasattr(data, "__array_interface__") or hasattr(data, "__array__") or isinstance(data, (bytearray, memoryview)):
        return f"building a tensor from a {type(data).__name__}"
    floats, stack, seen = 0, [data], 0
    while stack:
        x = stack.pop()
        seen += 1
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, (float, complex)):
            floats += 1
        elif isinstance(x, torch.Tensor):
            floats += x.numel() if x.is_floating_point() else 0
        elif not isinstance(x, (int, bool)):
            return f"building a tensor from a {type(x).__name__}"
        if floats > PY_FLOATS:
            return f"building a tensor from more than {PY_FLOATS} Python floats"
    return None
