"""The sandbox's runtime layers on their own, behind the static check: a child confined by sandbox.policy cannot
write outside its scratch directory (from Python or from C), open sockets, start processes, load native libraries,
walk the garbage collector, or undo its namespaces — even after resetting the Python-level trusted flag."""
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from sandbox import policy

ROOT = Path(__file__).resolve().parent.parent

PROBE = textwrap.dedent("""
    import ctypes, gc, json, os, socket, subprocess, sys
    import torch
    from sandbox import policy
    p = policy.apply(policy.Policy(scratch=sys.argv[1], write_roots=[sys.argv[1]]))
    results = {"network_isolated": p.network_isolated, "filesystem_read_only": p.filesystem_read_only,
               "capabilities_dropped": p.capabilities_dropped}

    def attempt(name, fn):
        try:
            fn()
            results[name] = "allowed"
        except BaseException as exc:
            results[name] = type(exc).__name__

    attempt("write_scratch", lambda: open(os.path.join(sys.argv[1], "ok.txt"), "w").write("x"))
    attempt("write_outside_python", lambda: open(sys.argv[2], "w").write("x"))
    attempt("write_outside_c", lambda: torch.save(torch.ones(1), sys.argv[2]))
    attempt("socket", lambda: socket.socket())
    attempt("subprocess", lambda: subprocess.run(["true"]))
    attempt("gc_walk", lambda: gc.get_objects())
    attempt("dlopen", lambda: ctypes.CDLL("libm.so.6"))

    def relative_link_out():
        # A link in scratch whose relative target climbs out of it, made from a working directory deeper still
        # (the target read from there would stay inside). A write through such a link is refused at its open
        # (the path resolved); the link is refused as it is made.
        here, deep = os.getcwd(), os.path.join(sys.argv[1], "a", "b", "c", "d")
        os.makedirs(deep, exist_ok=True)
        os.chdir(deep)
        try:
            link = os.path.join(sys.argv[1], "a", "out")
            os.symlink(os.path.relpath(os.path.dirname(sys.argv[2]), os.path.dirname(link)), link)
        finally:
            os.chdir(here)
    attempt("relative_link_out", relative_link_out)
    # Subvert the Python layer the way a candidate could through sys.modules, then try the OS layers directly.
    policy._POLICY.trusted_depth = 10
    libc = ctypes.CDLL(None, use_errno=True)
    results["remount_rw"] = "allowed" if libc.mount(None, b"/", None, 32, None) == 0 else "refused"
    attempt("write_outside_after_subversion", lambda: open(sys.argv[2], "w").write("x"))
    print(json.dumps(results))
""")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("scratch")
    outside = tmp_path_factory.mktemp("outside") / "stolen.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", PROBE, str(scratch), str(outside)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), outside


def test_scratch_is_writable(probe):
    assert probe[0]["write_scratch"] == "allowed"


@pytest.mark.parametrize("what", ["write_outside_python", "relative_link_out", "socket", "subprocess", "gc_walk",
                                  "dlopen"])
def test_the_audit_hook_refuses(probe, what):
    assert probe[0][what] == "SandboxViolation"


def test_writes_from_c_hit_a_read_only_file_system(probe):
    results, outside = probe
    if not results["filesystem_read_only"]:
        pytest.skip("this kernel refused a private mount namespace (needs root / CAP_SYS_ADMIN)")
    assert results["write_outside_c"] == "RuntimeError" and not outside.exists()


def test_the_os_layers_hold_after_the_python_layer_is_subverted(probe):
    results, outside = probe
    if not (results["filesystem_read_only"] and results["capabilities_dropped"]):
        pytest.skip("namespaces or capability dropping unavailable on this kernel")
    assert results["remount_rw"] == "refused"
    assert results["write_outside_after_subversion"] in ("OSError", "PermissionError") and not outside.exists()
    assert results["network_isolated"]


def test_library_dirs_take_the_import_path_but_nothing_the_candidate_can_write(tmp_path):
    """A library reached through PYTHONPATH (say, `pip install --target DIR`) may read frames as it defines
    things; the scratch directory, a directory inside it, or one holding it must not count."""
    site = tmp_path / "site"
    scratch = tmp_path / "scratch"
    inner = scratch / "pkgs"
    for d in (site, inner):
        d.mkdir(parents=True)
    dirs = policy.library_dirs([scratch], [str(site), str(inner), str(tmp_path), "", "relative/dir",
                                           str(tmp_path / "missing"), "/dev/shm"])
    assert "/dev/shm" + os.sep not in dirs
    assert str(site) + os.sep in dirs
    for refused in (inner, scratch, tmp_path, tmp_path / "missing"):
        assert str(refused) + os.sep not in dirs
    assert not any(d.startswith(str(scratch)) for d in dirs)
    assert os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep in dirs
