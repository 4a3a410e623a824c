"""The schema of every reply the candidate's process sends, checked before the harness reads a field of it.

The child runs hostile code that can write any bytes to its socket, so a decoded reply (sandbox.wire: JSON values
and tensors only) may still hold a field of the wrong type, an unknown reason, a NaN where a time belongs, or a
megabyte where a message belongs. `validate` checks a reply against the schema of the request it answers, field by
field, and raises MalformedReply (a wire.WireError: the harness rejects the candidate as a sandbox violation)
naming the first field that does not fit. Texts are cut to the lengths the verdict shows; nothing else is changed.

One table per request (`SCHEMAS`), the fields every reply may carry (`COMMON`) written once. A request the table
does not know gets the common fields checked and its own fields passed through as the JSON values they are.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .records import Reason
from .wire import MAX_DIMS, WireError

Check = Callable[[Any, str], Any]  # (value, where it is) -> the value to keep; raises MalformedReply
MAX_ITEMS = 1 << 16  # list lengths: far above any output count, kernel list or sample list


class MalformedReply(WireError):
    pass


def _fail(where: str, what: str) -> MalformedReply:
    return MalformedReply(f"{where} {what}")


def _bool(v: Any, where: str) -> bool:
    if type(v) is not bool:
        raise _fail(where, f"must be true or false, not {_kind(v)}")
    return v


def _int(lo: int = 0, hi: int = 1 << 62) -> Check:
    def check(v: Any, where: str) -> int:
        if type(v) is not int or not lo <= v <= hi:
            raise _fail(where, f"must be an integer in [{lo}, {hi}], not {_kind(v)}")
        return v
    return check


def _float(lo: float = 0.0) -> Check:
    def check(v: Any, where: str) -> float:
        if type(v) not in (int, float) or not math.isfinite(v) or v < lo:
            raise _fail(where, f"must be a finite number of at least {lo}, not {_kind(v)}")
        return float(v)
    return check


def _number(v: Any, where: str) -> float:
    """A time the parent summarises (NaN allowed: the statistics handle it), never a string or a container."""
    if type(v) not in (int, float):
        raise _fail(where, f"must be a number, not {_kind(v)}")
    return float(v)


def _optional(check: Check) -> Check:
    def optional(v: Any, where: str) -> Any:
        return None if v is None else check(v, where)
    return optional


def _str(limit: int) -> Check:
    def check(v: Any, where: str) -> str:
        if type(v) is not str:
            raise _fail(where, f"must be a string, not {_kind(v)}")
        return v if len(v) <= limit else v[:limit] + f"... ({len(v) - limit} more characters)"
    return check


def _one_of(values: set[str]) -> Check:
    def check(v: Any, where: str) -> str:
        if type(v) is not str or v not in values:
            raise _fail(where, f"is not one of the known values: {_kind(v)}")
        return v
    return check


def _list(item: Check, max_len: int = MAX_ITEMS) -> Check:
    def check(v: Any, where: str) -> list[Any]:
        if type(v) is not list or len(v) > max_len:
            raise _fail(where, f"must be a list of at most {max_len} items, not {_kind(v)}")
        return [item(x, f"{where}[{i}]") for i, x in enumerate(v)]
    return check


def _map(value: Check) -> Check:
    """A dict of any string keys (a few hundred at most)."""
    def check(v: Any, where: str) -> dict[str, Any]:
        if type(v) is not dict or len(v) > 1024:
            raise _fail(where, f"must be an object of at most 1024 fields, not {_kind(v)}")
        return {k: value(x, f"{where}.{k[:40]}") for k, x in v.items()}
    return check


def _record(fields: dict[str, Check], required: tuple[str, ...] = (), open_: bool = False,
            extra: Check | None = None) -> Check:
    """A dict of known keys, each checked; `required` must be present. Other keys are refused; with `open_` they
    are kept as the JSON values they are (records whose other fields the parent only reports), with `extra` they are
    checked by it (at most 64 of them)."""
    other = _json if open_ else extra

    def check(v: Any, where: str) -> dict[str, Any]:
        if type(v) is not dict:
            raise _fail(where, f"must be an object, not {_kind(v)}")
        unknown = sorted(set(v) - set(fields))
        if unknown and (other is None or (not open_ and len(unknown) > 64)):
            raise _fail(where, f"has unknown field(s) {[_kind(k) for k in unknown[:5]]}")
        missing = [k for k in required if k not in v]
        if missing:
            raise _fail(where, f"lacks field(s) {missing}")
        return {k: fields.get(k, other)(x, f"{where}.{k[:40]}") for k, x in v.items()}  # type: ignore[misc]
    return check


def _json(v: Any, where: str) -> Any:
    """Any decoded JSON value, tensors included (wire has bounded its size and depth)."""
    return v


def _tensor(v: Any, where: str) -> torch.Tensor:
    if type(v) is not torch.Tensor:
        raise _fail(where, f"must be a tensor, not {_kind(v)}")
    return v


def _output(v: Any, where: str) -> Any:
    """A tensor sent by value, or the marker of one written into the parent's GPU buffer at that position."""
    if type(v) is torch.Tensor:
        return v
    if type(v) is dict and set(v) == {"__gpu_buffer__"} and type(v["__gpu_buffer__"]) is int:
        return v
    raise _fail(where, f"must be a tensor or a GPU buffer marker, not {_kind(v)}")


def _kind(v: Any) -> str:
    if isinstance(v, str):
        return f"a string of {len(v)} characters" if len(v) > 40 else repr(v)
    if isinstance(v, (bool, int, float)) or v is None:
        return repr(v)[:40]
    return type(v).__name__


_NAMES = _list(_str(1000), 4096)
def _flat(v: Any, where: str) -> Any:
    """A trace field added later: a count, a flag, or a list of names."""
    if type(v) in (bool, int) or v is None:
        return v
    return _NAMES(v, where)


TRACE = _record({"launches": _int(), "kernels": _NAMES, "compute_ops": _NAMES, "foreign_kernels": _NAMES,
                 "refused": _NAMES},
                required=("launches", "kernels", "compute_ops", "foreign_kernels"), extra=_flat)
ERROR = _record({"type": _str(200), "message": _str(4000), "traceback": _str(8000)})
LAPS = _map(_float())
COMMON: dict[str, Check] = {
    "ok": _bool,
    "reason": _one_of({r.value for r in Reason if r is not Reason.OK}),
    "message": _str(4000),
    "error": ERROR,
    "violations": _list(_str(1000), 1000),
}
_OUTPUTS = _list(_tensor, 4096)
SAMPLES = _list(_record({"call": _int(), "input_set": _int(),
                          "outputs": lambda v, w: _OUTPUTS(v if type(v) is list else [v], w)},
                         ("call", "input_set", "outputs"), open_=True))
# The samples fetched after the measurement: on a GPU written into buffers the parent lent (markers), else by value.
FETCHED = _list(_record({"call": _int(), "input_set": _int(),
                         "outputs": lambda v, w: _list(_output, 4096)(v if type(v) is list else [v], w)},
                        ("call", "input_set", "outputs"), open_=True))
# The timing stage's measurements (profiler.timing.measure): the fields the parent reads are checked, the rest are
# reported as they are.
MEASURED = _record({
    "fns": _map(_record({"ms": _list(_number), "error": _optional(ERROR), "inconsistent": _bool,
                         "flagged": _list(_record({"call": _int()}, ("call",), open_=True)), "host_bound": _int()},
                        ("ms",), open_=True)),
    "samples": SAMPLES,
    "warnings": _NAMES, "tampered": _NAMES, "fatal": _optional(ERROR),
    "fingerprint_mismatches": _list(_record({"call": _int()}, ("call",), open_=True)),
}, ("fns",), open_=True)
SCHEMAS: dict[str, dict[str, Check]] = {
    "setup": {"network_isolated": _bool, "filesystem_read_only": _bool, "capabilities_dropped": _bool,
              "laps": LAPS, "walls": _map(lambda v, w: v if type(v) in (bool, int) else _bool(v, w))},
    "rebuild": {},
    "call": {"trace": TRACE, "seconds": _float(), "outputs": _list(_output, 4096),
             "strides": _list(_list(_int(-(1 << 62)), MAX_DIMS), 4096), "structure": _one_of({"tuple", "tensor"})},
    "soak": {"trace": TRACE, "seconds": _float(), "outputs": _list(_output, 1 << 16),
             "strides": _list(_list(_int(-(1 << 62)), MAX_DIMS), 1 << 16), "structure": _one_of({"tuple", "tensor"}),
             "calls": _int()},
    "time": {"measured": MEASURED, "n_sets": _int(1), "kernels": _list(_json), "environment": _map(_json),
             "baselines": _map(_map(_json)), "laps": LAPS, "kept_calls": _list(_int(), 1 << 16)},
    "samples": {"samples": FETCHED},
    "prepare_timing": {"laps": LAPS},
    "warm": {"seconds": _float()},
    "plant": {"planted": _int()},
}
# Fields a successful reply must carry (a failed one carries a reason instead).
REQUIRED_WHEN_OK: dict[str, tuple[str, ...]] = {
    "call": ("outputs", "strides", "structure"),
    "soak": ("outputs", "strides", "structure", "seconds"),
    "time": ("measured", "n_sets", "kernels", "environment", "baselines"),
    "samples": ("samples",),
}


def validate(op: str, reply: Any) -> dict[str, Any]:
    """The reply to request `op`, every field checked; MalformedReply otherwise."""
    if type(reply) is not dict:
        raise _fail("the reply", f"must be an object, not {_kind(reply)}")
    if "ok" not in reply:
        raise _fail("the reply", "lacks the field 'ok'")
    own = SCHEMAS.get(op)
    checked: dict[str, Any] = {}
    for key, value in reply.items():
        check = COMMON.get(key) or (own or {}).get(key)
        if check is None:
            if own is not None:
                raise _fail("the reply", f"to {op!r} has an unknown field {_kind(key)}")
            check = _json
        checked[key] = check(value, f"the reply's field {key}")
    if checked["ok"]:
        missing = [k for k in REQUIRED_WHEN_OK.get(op, ()) if k not in checked]
        if missing:
            raise _fail("the reply", f"to {op!r} reports success without {missing}")
    elif "reason" not in checked:
        raise _fail("the reply", "reports a failure without a reason")
    if op in ("call", "soak") and "strides" in checked and len(checked["strides"]) != len(checked.get("outputs", [])):
        raise _fail("the reply", "has not one stride list per output")
    return checked
