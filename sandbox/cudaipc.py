"""Lending CUDA memory to a candidate's process by raw IPC memory handles, so that nothing of it lives in /dev/shm.

torch's own CUDA IPC (`reduce_tensor`) puts a reference-counter file and an interprocess event in /dev/shm, which the
child must open by name: a child with a private /dev/shm cannot open the tensors at all (`mapping of buffer object
failed`), and a child sharing the host's /dev/shm can delete or rewrite the parent's files and leave its own behind.
A raw handle (`cudaIpcGetMemHandle`) goes through the driver alone. What torch's files did is done here instead:
- lifetime: the parent holds every lent tensor until the child is dead (`Lending`), since it cannot know when the
  child unmapped it; the child opens each handle once and keeps it mapped;
- ordering: the parent synchronizes the stream its staging copies ran on before a request that lends memory, and
  the child synchronizes before its reply, so neither reads what the other has not finished writing.

A lent tensor travels as a `Lent` record (plain values: the request is pickled, the reply never carries one)."""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, replace
from functools import lru_cache

import torch

from .records import GPU_FULL_HARNESS, GPU_FULL_SHARED

HANDLE_BYTES = 64
LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess


class _Handle(ctypes.Structure):  # cudaIpcMemHandle_t, passed by value to cudaIpcOpenMemHandle
    _fields_ = [("reserved", ctypes.c_ubyte * HANDLE_BYTES)]


class LendError(RuntimeError):
    """This tensor cannot be lent by a raw handle (e.g. the allocator's expandable segments): send it by value."""


@dataclass(frozen=True)
class Lent:
    """One CUDA tensor as the child sees it: its allocation's handle, where its storage starts in that allocation,
    and the view (dtype, shape, strides, offset in elements) over that storage."""
    handle: bytes
    offset: int  # bytes from the allocation's base to the storage's first byte
    nbytes: int  # the storage's size
    dtype: str  # torch dtype name, e.g. "bfloat16"
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    device: int


@lru_cache(maxsize=1)
def _runtime() -> ctypes.CDLL:
    """The CUDA runtime torch itself loaded (its path from this process's mappings), so the handles belong to the
    primary context torch uses."""
    torch.cuda.init()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "/libcudart.so" in path:
                return ctypes.CDLL(path)
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise LendError("the CUDA runtime library torch uses was not found in this process")


@lru_cache(maxsize=1)
def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def load() -> None:
    """Resolve the libraries now (the child does this before its confinement, which refuses loading libraries)."""
    _runtime()
    _driver()


def lend(x: torch.Tensor) -> Lent:
    """A handle to the allocation holding `x`'s storage. The caller keeps `x` alive until the child is dead."""
    storage = x.untyped_storage()
    ptr = storage.data_ptr()
    handle = _Handle()
    with torch.cuda.device(x.device):
        err = _runtime().cudaIpcGetMemHandle(ctypes.byref(handle), ctypes.c_void_p(ptr))
        if err:
            raise LendError(f"cudaIpcGetMemHandle failed with CUDA error {err}")
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        err = _driver().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
        if err:
            raise LendError(f"cuMemGetAddressRange failed with CUDA error {err}")
    return Lent(bytes(handle), ptr - base.value, storage.nbytes(),
                str(x.dtype).removeprefix("torch."), tuple(x.shape), tuple(x.stride()), x.storage_offset(),
                x.device.index if x.device.index is not None else torch.cuda.current_device())


class _Bytes:
    """`nbytes` of device memory at `ptr`, as torch.as_tensor takes it (bytes: the interface has no bfloat16)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


_OPENED: dict[bytes, int] = {}  # handle -> base pointer in this process; mapped until the process ends


def open_lent(lent: Lent) -> torch.Tensor:
    """The parent's tensor, mapped into this process (no copy): reads see the parent's data, writes land in it."""
    base = _OPENED.get(lent.handle)
    if base is None:
        ptr = ctypes.c_void_p()
        with torch.cuda.device(lent.device):
            err = _runtime().cudaIpcOpenMemHandle(ctypes.byref(ptr), _Handle.from_buffer_copy(lent.handle),
                                                  LAZY_ENABLE_PEER_ACCESS)
        if err or not ptr.value:
            raise LendError(f"cudaIpcOpenMemHandle failed with CUDA error {err}")
        base = _OPENED[lent.handle] = ptr.value
    dtype = getattr(torch, lent.dtype)
    raw = torch.as_tensor(_Bytes(base + lent.offset, lent.nbytes), device=f"cuda:{lent.device}")
    return raw.view(dtype).as_strided(lent.shape, lent.stride, lent.storage_offset)


def _dense(x: torch.Tensor) -> bool:
    """Its elements fill a block of memory once each (any order of dimensions): a copy can keep its strides."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(x.shape, x.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _lendable(x: torch.Tensor) -> bool:
    return x.is_cuda and x.numel() > 0


class Lending:
    """What one child is lent: staging blocks of raw device memory reused call after call (each call's CUDA tensors
    are copied into views over them), held until the child is dead, up to `cap` bytes in all; a tensor that would pass
    the cap goes by value. A block serves any tensor that fits in it, whatever its shape or dtype, so a check that
    moves through several shapes (the robustness stage's, the soak's) holds one request's worth of blocks, not one
    set per shape."""

    def __init__(self, cap: int):
        self.cap = cap
        self.held = 0
        self._blocks: list[torch.Tensor] = []  # uint8, each lent as a whole; smallest first
        self._handles: dict[int, Lent] = {}  # id(block) -> its handle (the view's fields are filled in per use)

    def ship(self, tensors: list[object], used: set[int]) -> tuple[list[object], list[torch.Tensor | None]]:
        """Each item as the child receives it: CUDA tensors as ("cuda-ipc", Lent) over a staging copy, else by value;
        and, by position, the staging tensor the child maps (None where nothing was lent). `used` holds the blocks the
        same request already carries (one set per request: none is handed out twice in it)."""
        wire: list[object] = []
        staged: list[torch.Tensor | None] = []
        for x in tensors:
            found = self._stage(x, used) if isinstance(x, torch.Tensor) and _lendable(x) else None
            if found is not None:
                stage, lent = found
                stage.copy_(x)
                wire.append(("cuda-ipc", lent))
                staged.append(stage)
                continue
            if isinstance(x, torch.Tensor):
                wire.append(x.detach().cpu())  # by value (the child moves it to its device)
            else:
                wire.append(x)
            staged.append(None)
        # The child reads the staging copies as soon as the request arrives: the stream they ran on is waited for.
        for device in {t.device for t in staged if t is not None and t.is_cuda}:
            torch.cuda.current_stream(device).synchronize()
        return wire, staged

    def _stage(self, x: torch.Tensor, used: set[int]) -> tuple[torch.Tensor, Lent] | None:
        """A view shaped like `x` over the smallest free block that holds it (a new block where none does and the
        cap allows), and the Lent that maps that view in the child."""
        stride = tuple(x.stride()) if _dense(x) else _contiguous_strides(tuple(x.shape))
        nbytes = x.numel() * x.element_size()
        block = next((b for b in self._blocks if id(b) not in used and b.numel() >= nbytes
                      and b.device == x.device), None)
        if block is None:
            if self.held + nbytes > self.cap:
                return None
            block = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
            try:
                self._handles[id(block)] = lend(block)
            except LendError:
                return None
            self._blocks.append(block)
            self._blocks.sort(key=lambda b: b.numel())
            self.held += nbytes
        used.add(id(block))
        view = block[:nbytes].view(x.dtype).as_strided(x.shape, stride)
        lent = replace(self._handles[id(block)], nbytes=nbytes, dtype=str(x.dtype).removeprefix("torch."),
                       shape=tuple(x.shape), stride=stride, storage_offset=0)
        return view, lent

    def release(self) -> None:
        """Only once the child is dead: it may map any of these until then."""
        self._blocks.clear()
        self._handles.clear()
        self.held = 0


# A child's out-of-memory error is put down to the GPU's other users when the harness and the other processes on
# the GPU (the other checks' candidates, a timing's input sets) hold at least this share of it.
SHARED_BLAMED = 0.25
# PyTorch's out-of-memory message: "... this process has 20.57 GiB memory in use ..."
_OWN_USE = re.compile(r"this process has ([0-9.]+) (GiB|MiB|KiB|B) memory in use")
_UNITS = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "B": 1}


def others_share(device: str, child_message: str) -> tuple[str, bool] | None:
    """Where a candidate's process ran out of GPU memory: ('X GiB held by the harness and Y GiB by other processes,
    of the GPU's Z GiB', whether the harness's share alone reaches SHARED_BLAMED) when those two hold at least
    SHARED_BLAMED of it (the candidate may well have fitted on the GPU alone), else None (the candidate's own
    allocations are the likelier cause). The child's own use is read from PyTorch's message, which the candidate
    could forge: a forged one only turns its rejection into the harness's failure, checked once more and never
    accepted. Without that figure everything not the harness's counts as the child's."""
    free, total = torch.cuda.mem_get_info(device)
    harness = torch.cuda.memory_reserved(device)
    used = max(0, total - free - harness)
    match = _OWN_USE.search(child_message)
    own = min(used, int(float(match.group(1)) * _UNITS[match.group(2)])) if match else used
    others = used - own
    if total <= 0 or harness + others < SHARED_BLAMED * total:
        return None
    return (f"{harness / 2**30:.1f} GiB held by the harness and {others / 2**30:.1f} GiB by other processes (the "
            f"other checks' candidates among them), of the GPU's {total / 2**30:.1f} GiB",
            harness >= SHARED_BLAMED * total)


def blame_full_gpu(device: str, child_message: str) -> tuple[str, str] | None:
    """A candidate's out-of-memory error where the harness and the GPU's other processes hold SHARED_BLAMED of it
    (`others_share`): (the verdict's message, records.GPU_FULL_HARNESS where the harness's share alone reaches it,
    else GPU_FULL_SHARED), for a harness_error; None where the candidate's own allocations are the likelier cause."""
    shared = others_share(device, child_message)
    if shared is None:
        return None
    held, by_harness = shared
    return ((f"the candidate's process ran out of GPU memory with {held}; at this task's size that says nothing "
             f"certain about the candidate. {child_message}")[:4000], GPU_FULL_HARNESS if by_harness else GPU_FULL_SHARED)


def full_gpu_message(stage: str, device: str) -> str:
    """The verdict's message where the parent ran out of GPU memory during a check, with the GPU's memory as it
    stands: free, this process's, and the rest (other processes, the candidates' among them)."""
    held = ""
    if device.startswith("cuda"):
        try:
            free, total = torch.cuda.mem_get_info(device)
            mine = torch.cuda.memory_reserved(device)
            held = (f": {free / 2**30:.1f} GiB of {total / 2**30:.1f} free, the harness holding {mine / 2**30:.1f}, "
                    f"other processes (the candidates' among them) {max(0, total - free - mine) / 2**30:.1f}")
        except Exception:  # noqa: BLE001 - the message goes without the numbers
            held = ""
    return (f"the harness ran out of GPU memory at the {stage} stage (the task's inputs, outputs and their float64 "
            f"references did not fit beside what else runs on the GPU{held}); this says nothing about the candidate: "
            "free the GPU or check the task at a smaller shape")


def lending_cap(device: str) -> int:
    """Bytes of GPU memory one child may be lent (staging copies of its inputs and output buffers, reused call after
    call): a quarter of the device, at least 8 GiB. Past it, tensors travel by value through host memory."""
    if device != "cuda":
        return 0
    return max(8 << 30, torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory // 4)
