"""The kernels a candidate compiled, kept for its own later checks: a duel's legs and the final re-check run the same
source again in fresh processes, and each would compile every kernel anew (on the H200 1.5-3 s a check for the
memory-bound seeds, 6-7 s for attention).

Each candidate's process has a Triton cache of its own (sandbox/harness.py `_scratch`): a shared one would let one
candidate plant compiled kernels for the next. Keyed by the hash of the candidate's source, what a check's cache
held when its process had ended is kept, and a later check of the very same source starts with a copy of it. The
copy gives that process nothing it could not make itself: whatever the first process wrote there, the same source
may write again. Another source never sees it.

The candidate wrote those files, so they are copied as untrusted data: regular files only (no link is followed or
copied, no device or pipe opened), by descriptors relative to their directory, within a cap on files and bytes.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import stat
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

MAX_FILES = 4096  # entries (files and directories) a kept cache may hold
MAX_DEPTH = 4  # directory levels below its root (Triton's cache uses one)
MAX_BYTES = 256 << 20  # bytes a kept cache may hold (a seed's kernels: a few MB)
TOTAL_BYTES = 2 << 30  # bytes of all kept caches; the oldest go first
_CHUNK = 1 << 20


def source_key(source: bytes) -> str:
    return hashlib.sha256(source).hexdigest()


class CompiledStore:
    """Triton caches by candidate source hash, in a directory of this process's own (removed at exit)."""

    def __init__(self, root: Path | None = None) -> None:
        self._root = root
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, int] = OrderedDict()  # key -> bytes, oldest first

    def _dir(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="crucible-compiled-"))
            atexit.register(shutil.rmtree, self._root, True)
        return self._root

    def keep(self, key: str, cache: Path) -> bool:
        """Keep a copy of `cache` (a check's Triton cache, its process ended) under `key`, unless one is kept
        already or it holds nothing; False where it was not kept (empty, over the caps, unreadable)."""
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return False
            dest = self._dir() / key
        tmp = dest.with_name(f".{key}.{threading.get_ident()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            copied = copy_regular_files(cache, tmp)
        except (OSError, ValueError):  # unreadable, or a name the filesystem refuses here
            copied = None
        if copied is None or copied[0] == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        with self._lock:
            if key in self._kept:  # another slot kept it meanwhile
                shutil.rmtree(tmp, ignore_errors=True)
                return False
            os.replace(tmp, dest)
            self._kept[key] = copied[1]
            while sum(self._kept.values()) > TOTAL_BYTES and len(self._kept) > 1:
                old, _ = self._kept.popitem(last=False)
                shutil.rmtree(self._dir() / old, ignore_errors=True)
        return True

    def seed(self, key: str, cache: Path) -> int:
        """Copy what is kept under `key` into `cache` (a fresh check's empty Triton cache); the files copied."""
        with self._lock:
            if key not in self._kept:
                return 0
            self._kept.move_to_end(key)
            src = self._dir() / key
            try:  # under the lock: an eviction cannot remove it mid-copy
                copied = copy_regular_files(src, cache)
            except OSError:
                return 0
        return 0 if copied is None else copied[0]


def copy_regular_files(src: Path, dest: Path) -> tuple[int, int] | None:
    """Copy the regular files under `src` to `dest` (made), directories recreated, nothing else: no symbolic link
    followed or copied, no special file opened. (files, bytes) copied; None past MAX_FILES entries, MAX_BYTES or
    MAX_DEPTH levels (what was copied stays: the caller removes `dest`)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    root = os.open(src, flags | os.O_DIRECTORY)
    counts = [0, 0, 0]  # files, bytes, entries
    try:
        return (counts[0], counts[1]) if _copy_dir(root, dest, flags, counts, 0) else None
    finally:
        os.close(root)


def _copy_dir(dir_fd: int, dest: Path, flags: int, counts: list[int], depth: int) -> bool:
    dest.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(dir_fd):
        counts[2] += 1
        if counts[2] > MAX_FILES:
            return False
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            if depth >= MAX_DEPTH:
                return False
            try:
                sub = os.open(name, flags | os.O_DIRECTORY, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                if not _copy_dir(sub, dest / name, flags, counts, depth + 1):
                    return False
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            counts[0] += 1
            if counts[1] + st.st_size > MAX_BYTES:
                return False
            try:
                fd = os.open(name, flags | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between the stat and the open
                    continue
                with os.fdopen(os.dup(fd), "rb") as f, open(dest / name, "wb") as out:
                    while chunk := f.read(_CHUNK):
                        counts[1] += len(chunk)
                        if counts[1] > MAX_BYTES:
                            return False
                        out.write(chunk)
            finally:
                os.close(fd)
    return True


STORE = CompiledStore()  # the process's: the GPU's check slots (threads) share it, so a duel's leg on another slot finds it
