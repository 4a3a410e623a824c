"""The parent's side of outputs the candidate's process writes into GPU buffers the parent lends it (a call's, the
soak's checked calls', the timing stage's sampled ones): the buffers, poisoned so that an unwritten one shows, and
the reply's markers claimed back as copies of them."""
from __future__ import annotations

from typing import Any

import torch


def poisoned(shape: torch.Size, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor | None:
    """A contiguous buffer of this shape and dtype, every byte 0xFF (NaN in every float format, -1 in every integer
    one): where the child writes nothing, the comparison says so. None for bool and complex outputs, which have no
    such pattern (they travel by value)."""
    if dtype == torch.bool or dtype.is_complex:
        return None
    buf = torch.empty(shape, dtype=dtype, device=device)
    if buf.numel():
        buf.reshape(-1).view(torch.uint8).fill_(0xFF)
    return buf


def claim(outs: Any, buffers: list[torch.Tensor | None], start: int = 0) -> Any:
    """The reply's outputs with each {"__gpu_buffer__": start + i} the child put at position i replaced by a copy of
    our buffer start + i (a copy: the child maps the buffer until it is dead). Anything else forged stays as it is
    and fails the output-type check."""
    if not isinstance(outs, list):
        return outs
    claimed = []
    for i, o in enumerate(outs):
        at = start + i
        if isinstance(o, dict) and set(o) == {"__gpu_buffer__"}:
            buf = buffers[at] if o["__gpu_buffer__"] == at and at < len(buffers) else None
            if buf is None:
                return None
            claimed.append(buf.clone())
        else:
            claimed.append(o)
    return claimed
