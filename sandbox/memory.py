"""A memory bound per candidate: a control group of its own, made by the zygote before the candidate's process
starts and removed by the zygote once that process is dead. RLIMIT_AS cannot do this job: CUDA reserves virtual
address space of about twice the device's memory and fails to start under it; a control group counts only the pages
the candidate's processes really use (host memory, tmpfs included; not device memory).

Each group gets memory.max (and no swap), pids.max (a bound on processes and threads: no fork bomb), and on cgroup v2
memory.oom.group, so the OOM killer ends all of the candidate's processes together. After the candidate dies, the
zygote reads the group's OOM-kill count: that is how the parent learns that the kernel ended the candidate for
exceeding its bound, and says so in the verdict.

Where the machine allows it: cgroup v2 (the unified hierarchy at /sys/fs/cgroup, or /sys/fs/cgroup/unified) with the
memory controller delegated to a directory the zygote can write; else cgroup v1's memory (and pids) hierarchies.
Neither (an unprivileged user, a container without delegation): no group, the wall is reported absent and the check
goes on without it.

Settings (environment of the process that starts the harness):
  CRUCIBLE_MEMORY_GIB   the bound per candidate, in GiB (default: 16, or half the machine's memory if less; 0 turns
                        the bound off)
  CRUCIBLE_PIDS_MAX     processes and threads per candidate (default 4096)
"""
from __future__ import annotations

import itertools
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
DEFAULT_GIB = 16.0
DEFAULT_PIDS = 4096
_counter = itertools.count()


def default_bound_bytes() -> int:
    """CRUCIBLE_MEMORY_GIB, else 16 GiB or half the machine's memory, whichever is less."""
    setting = os.environ.get("CRUCIBLE_MEMORY_GIB", "").strip()
    if setting:
        try:
            gib = float(setting)
        except ValueError:
            log.warning("CRUCIBLE_MEMORY_GIB=%r is not a number of GiB; using the default", setting)
        else:
            return max(0, int(gib * (1 << 30)))
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(min(DEFAULT_GIB * (1 << 30), total // 2))


def default_pids() -> int:
    setting = os.environ.get("CRUCIBLE_PIDS_MAX", "").strip()
    if setting and not (setting.isdigit() and int(setting) > 0):
        log.warning("CRUCIBLE_PIDS_MAX=%r is not a positive whole number; using %d", setting, DEFAULT_PIDS)
        return DEFAULT_PIDS
    return int(setting) if setting else DEFAULT_PIDS


@dataclass
class Group:
    """One candidate's control group: `paths` are its directories (one on v2; memory and pids on v1)."""
    version: int
    paths: list[Path]
    bound_bytes: int

    def join(self) -> None:
        """Move the calling process in; its children are born inside."""
        for path in self.paths:
            (path / "cgroup.procs").write_text("0")

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this group for exceeding the bound."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            lines = (self.paths[0] / name).read_text().splitlines()
        except OSError:
            return False
        counts = dict(line.split()[:2] for line in lines if len(line.split()) >= 2)
        return int(counts.get("oom_kill", "0")) > 0

    def remove(self, wait_s: float = 2.0) -> bool:
        """Kill whatever is still inside, then remove the directories (they can be removed only once every process
        in them has been reaped, which takes the kernel a moment after a kill)."""
        end = time.monotonic() + wait_s
        for path in self.paths:
            while True:
                _kill_all(path, self.version)
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > end:
                        log.warning("could not remove the control group %s: processes still in it", path)
                        return False
                    time.sleep(0.01)
        return True


def _kill_all(path: Path, version: int) -> None:
    if version == 2 and (path / "cgroup.kill").exists():
        try:
            (path / "cgroup.kill").write_text("1")
            return
        except OSError:
            pass
    try:
        pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class Groups:
    """Makes the per-candidate groups under one parent directory chosen once, at the zygote's start."""

    def __init__(self, bound_bytes: int | None = None, pids_max: int | None = None):
        self.bound_bytes = default_bound_bytes() if bound_bytes is None else bound_bytes
        self.pids_max = default_pids() if pids_max is None else pids_max
        self.version = 0
        self.parents: list[Path] = []
        self.problem = ""
        if self.bound_bytes <= 0:
            self.problem = "turned off by CRUCIBLE_MEMORY_GIB=0"
            return
        try:
            self._find_parents()
        except (OSError, ValueError) as exc:
            self.problem = f"{type(exc).__name__}: {exc}"
        if not self.parents:
            log.info("no memory bound per candidate on this machine: %s", self.problem or "no control group found")
        self._sweep()

    def _sweep(self) -> None:
        """Remove the groups of zygotes that died without cleaning up (killed with SIGKILL)."""
        for parent in self.parents:
            for path in parent.glob("crucible-*-*"):
                owner = path.name.split("-")[1]
                if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                    Group(self.version, [path], 0).remove(wait_s=0.5)

    @property
    def available(self) -> bool:
        return bool(self.parents)

    def _find_parents(self) -> None:
        own = _own_cgroups()
        for root in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
            if (root / "cgroup.controllers").exists() and "memory" in (root / "cgroup.controllers").read_text().split():
                parent = _v2_parent(root, own.get("", "/"))
                if parent is not None:
                    self.version, self.parents = 2, [parent]
                    return
                self.problem = f"cgroup v2 at {root} has no directory with the memory controller delegated"
        memory_root = CGROUP_ROOT / "memory"
        if (memory_root / "memory.limit_in_bytes").exists() and "memory" in own:
            parents = [memory_root / own["memory"].lstrip("/")]
            if "pids" in own and (CGROUP_ROOT / "pids" / "cgroup.procs").exists():
                parents.append(CGROUP_ROOT / "pids" / own["pids"].lstrip("/"))
            if all(os.access(p, os.W_OK) for p in parents):
                self.version, self.parents = 1, parents
                return
            self.problem = f"cgroup v1's {parents[0]} is not writable"

    def create(self) -> Group | None:
        """A fresh group with the bound set, or None (logged) where that fails."""
        if not self.parents:
            return None
        name = f"crucible-{os.getpid()}-{next(_counter)}"
        paths = [parent / name for parent in self.parents]
        group = Group(self.version, paths, self.bound_bytes)
        try:
            for path in paths:
                path.mkdir()
            if self.version == 2:
                _write(paths[0] / "memory.max", self.bound_bytes)
                _write(paths[0] / "memory.swap.max", 0, optional=True)
                _write(paths[0] / "memory.oom.group", 1, optional=True)
                _write(paths[0] / "pids.max", self.pids_max, optional=True)
            else:
                _write(paths[0] / "memory.limit_in_bytes", self.bound_bytes)
                # memory+swap equal to memory: no swap (the file exists only where swap accounting is on)
                _write(paths[0] / "memory.memsw.limit_in_bytes", self.bound_bytes, optional=True)
                if len(paths) > 1:
                    _write(paths[1] / "pids.max", self.pids_max, optional=True)
        except OSError as exc:
            log.warning("could not make a control group for a candidate: %s", exc)
            group.remove(wait_s=0.0)
            return None
        return group


def _write(path: Path, value: int, optional: bool = False) -> None:
    try:
        path.write_text(str(value))
    except OSError:
        if not optional or path.exists():
            raise


def _own_cgroups() -> dict[str, str]:
    """This process's group per hierarchy, from /proc/self/cgroup: {"": v2 path, "memory": v1 path, ...}."""
    groups: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) == 3:
                for controller in parts[1].split(","):
                    groups[controller] = parts[2]
    return groups


def _v2_parent(root: Path, own: str) -> Path | None:
    """The nearest directory at or above our own group where the memory controller reaches new children: already in
    its cgroup.subtree_control, or enabled there now (the kernel refuses that where the directory holds processes)."""
    here = root / own.lstrip("/")
    candidates = [here, *here.parents]
    for directory in candidates:
        if directory != root and root not in directory.parents:
            break
        control = directory / "cgroup.subtree_control"
        try:
            enabled = control.read_text().split()
            if "memory" not in enabled:
                control.write_text("+memory")
            if "pids" not in enabled and "pids" in (directory / "cgroup.controllers").read_text().split():
                try:
                    control.write_text("+pids")
                except OSError:
                    pass
            if os.access(directory, os.W_OK):
                return directory
        except OSError:
            continue
    return None
