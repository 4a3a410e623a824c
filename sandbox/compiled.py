"""A verified candidate's compiled kernels, kept for its own later checks.

A duel's legs and the final re-check run the same source again in fresh processes, and each would compile every
kernel anew (on the H200, 1.2-3.1 s a check for the memory-bound tasks, 6.0-7.0 s for attention: the compile column
of docs/BENCHMARKS.md's search throughput). What the Triton cache of a verified check held is kept here, in the
parent's memory, under the hash of the candidate's source; a later check of the very same source gets the files in
its setup message, and its process writes them into its own cache (the scratch tmpfs, sandbox/policy.py) before the
candidate is imported. Another source never sees them: nothing is kept on the host's disk, where every candidate's
process can read (the host's files are only made read-only for it). The files give a process nothing the same source
could not make itself: whatever the first process wrote into its cache, the same source may write again.

The parent reads the cache through the child's own view of its files (/proc/PID/root: the tmpfs exists only in the
child's mount namespace) while the child is alive, after its last stage. The candidate wrote those files, so they
are read as untrusted data: only Triton's layout (a directory per kernel, files in it), names of a safe alphabet,
regular files opened relative to their directory with O_NOFOLLOW (no link followed, no device or pipe opened),
within caps on files and bytes; the store's least recently used entries go first.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import threading
from collections import OrderedDict

Files = tuple[tuple[str, bytes], ...]  # ("<kernel directory>/<file>", contents), sorted

MAX_FILES = 4096  # files one kept cache may hold (autotuned kernels: a directory per configuration)
MAX_ENTRIES = 4 * MAX_FILES  # directory entries looked at, kept or not (links, odd names, empty directories)
MAX_BYTES = 128 << 20  # bytes one kept cache may hold (a seed's kernels: a few MB)
TOTAL_BYTES = 1 << 30  # bytes of all kept caches in the parent's memory
_DIR = re.compile(r"[A-Za-z0-9_\-]{1,128}")
_FILE = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,254}")
GROUP_PREFIX = "__grp__"  # Triton's file listing a compiled kernel's files (runtime/cache.py put_group)
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def check_key(source: bytes, task: str, overrides: dict[str, int], device: str) -> str:
    """What a cache is kept under: the candidate's source, as the parent read it and the child runs it, checked
    against one task at one size on one kind of device."""
    scope = f"{task}\0{sorted(overrides.items())}\0{device}\0".encode()
    return hashlib.sha256(scope + source).hexdigest()


def valid_name(rel: object) -> bool:
    """Whether `rel` is a path of Triton's cache layout: '<kernel directory>/<file>', a safe alphabet, no '..'."""
    if not isinstance(rel, str) or rel.count("/") != 1:
        return False
    d, f = rel.split("/")
    return bool(_DIR.fullmatch(d)) and bool(_FILE.fullmatch(f)) and ".." not in f


def read_cache(root: str) -> Files | None:
    """The regular files of a Triton cache at `root`, in its layout (anything else is left out: links, special
    files, deeper directories, odd names); None where the root cannot be opened as a directory, or past MAX_ENTRIES
    entries looked at (kept or not), MAX_FILES files or MAX_BYTES."""
    try:
        top = os.open(root, _FLAGS | os.O_DIRECTORY)
    except OSError:
        return None
    files: list[tuple[str, bytes]] = []
    seen = [0, 0]  # entries looked at, bytes kept
    try:
        for d in _names(top, seen):
            if not _DIR.fullmatch(d):
                continue
            try:
                sub = os.open(d, _FLAGS | os.O_DIRECTORY, dir_fd=top)
            except OSError:
                continue  # a link, a file, gone
            try:
                for f in _names(sub, seen):
                    if not valid_name(f"{d}/{f}"):
                        continue
                    data = _read_regular(sub, f, MAX_BYTES - seen[1])
                    if data is None:
                        continue
                    if len(files) >= MAX_FILES:
                        return None
                    files.append((f"{d}/{f}", data))
                    seen[1] += len(data)
            finally:
                os.close(sub)
    except (OSError, _TooMany):
        return None
    finally:
        os.close(top)
    return tuple(sorted(files))


class _TooMany(Exception):
    pass


def _names(dir_fd: int, seen: list[int]) -> list[str]:
    """The names in a directory, counted into seen[0] as they are read; _TooMany past MAX_ENTRIES in all (so a
    candidate's millions of entries are never all listed)."""
    names = []
    with os.scandir(dir_fd) as entries:
        for e in entries:
            seen[0] += 1
            if seen[0] > MAX_ENTRIES:
                raise _TooMany()
            names.append(e.name)
    return names


def _read_regular(dir_fd: int, name: str, room: int) -> bytes | None:
    """A regular file's bytes (None for anything else); _TooMany past `room` bytes (its size, or what it grew to)."""
    try:
        fd = os.open(name, _FLAGS | os.O_NONBLOCK, dir_fd=dir_fd)  # O_NONBLOCK: a FIFO does not wait for a writer
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > room:
            raise _TooMany()
        chunks, got = [], 0
        while chunk := os.read(fd, 1 << 20):
            got += len(chunk)
            if got > room:
                raise _TooMany()
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def plant(cache_dir: str, files: Files) -> int:
    """Write kept files into a process's own cache (the worker: before the candidate is imported, or a warmer's
    files where the robustness stage begins); the files written. Names are checked again; an existing file is left as
    it is; no link is followed (the candidate may have made its cache's directories links: each is opened relative
    to the one above with O_NOFOLLOW); a file that cannot be written is skipped. A kernel's group file names its other
    files by absolute path, in the earlier process's cache (Triton compiles again where one is missing), so those
    are moved to this cache; a group file that is not Triton's is left out."""
    try:
        top = os.open(cache_dir, _FLAGS | os.O_DIRECTORY)
    except OSError:
        return 0
    written = 0
    try:
        for rel, data in files:
            if not valid_name(rel) or not isinstance(data, bytes):
                continue
            d, f = rel.split("/")
            if f.startswith(GROUP_PREFIX):
                data = _relocated(data, cache_dir, d)
                if data is None:
                    continue
            written += _write_new(top, d, f, data)
    finally:
        os.close(top)
    return written


def _write_new(top: int, d: str, f: str, data: bytes) -> int:
    """1 where `d`/`f` under the directory `top` was created and written; 0 where it exists or cannot be made (a
    link in its place, a full disk)."""
    try:
        os.mkdir(d, 0o700, dir_fd=top)
    except FileExistsError:
        pass
    except OSError:
        return 0
    try:
        sub = os.open(d, _FLAGS | os.O_DIRECTORY, dir_fd=top)
    except OSError:
        return 0
    try:
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600,
                     dir_fd=sub)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        except OSError:  # a part of a file would be read as a kernel: none is left
            os.unlink(f, dir_fd=sub)
            return 0
        return 1
    except OSError:
        return 0
    finally:
        os.close(sub)


def _relocated(group: bytes, cache_dir: str, d: str) -> bytes | None:
    """A Triton group file ({"child_paths": {name: absolute path}}) naming the same files in `cache_dir`/`d`; None
    where it is not one, or names a file outside Triton's layout."""
    try:
        paths = json.loads(group).get("child_paths")
    except (ValueError, AttributeError, RecursionError):
        return None
    if not isinstance(paths, dict):
        return None
    moved = {}
    for key, path in paths.items():
        name = os.path.basename(path) if isinstance(path, str) else ""
        if not valid_name(f"{d}/{name}"):
            return None
        moved[key] = os.path.join(cache_dir, d, name)
    return json.dumps({"child_paths": moved}).encode()


class Store:
    """Kept caches by source key, least recently used first, within TOTAL_BYTES; safe across the check slots'
    threads (a duel's leg on another slot finds what a check kept)."""

    def __init__(self, total_bytes: int = TOTAL_BYTES) -> None:
        self.total_bytes = total_bytes
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, Files] = OrderedDict()
        self._bytes = 0

    def files(self, key: str) -> Files:
        with self._lock:
            if key not in self._kept:
                return ()
            self._kept.move_to_end(key)
            return self._kept[key]

    def keep(self, key: str, files: Files | None) -> int:
        """Keep `files` under `key` (replacing what was kept: the later check's cache holds the earlier one's and
        what it compiled since); the files kept (0: nothing to keep, or a name outside the layout)."""
        if not files or not all(valid_name(rel) and isinstance(data, bytes) for rel, data in files):
            return 0
        size = sum(len(data) for _, data in files)
        if len(files) > MAX_FILES or size > min(MAX_BYTES, self.total_bytes):
            return 0
        with self._lock:
            old = self._kept.pop(key, None)
            self._bytes -= sum(len(data) for _, data in old) if old else 0
            self._kept[key] = files
            self._bytes += size
            while self._bytes > self.total_bytes:
                _, gone = self._kept.popitem(last=False)
                self._bytes -= sum(len(data) for _, data in gone)
        return len(files)

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)


STORE = Store()  # the parent's: every harness of the process, every GPU's check slots
