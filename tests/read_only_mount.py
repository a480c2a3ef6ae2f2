"""A real read-only file system for tests: a folder mounted over itself read-only, in a private mount
namespace (``unshare -m``) that ends with the command, so nothing outlives it. Needs root (or user
namespaces) and util-linux; tests skip where it cannot be made."""

import os
import pathlib
import subprocess

import pytest

SRC = str(pathlib.Path(__file__).resolve().parents[1] / "src")

#: a shell command mounting ``folder`` over itself, read-only: a new mount, so files open for writing
#: on the one below stay open, as when a live system's mount turns read-only
READ_ONLY = 'mount --bind "{folder}" "{folder}" && mount -o remount,bind,ro "{folder}"'


def works(scratch: pathlib.Path) -> bool:
    probe = scratch / "mount-probe"
    probe.mkdir(exist_ok=True)
    script = f'{READ_ONLY.format(folder=probe)} && ! touch "{probe}/x"'
    try:
        return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def runner(scratch: pathlib.Path):
    """run(folder, script): the shell ``script`` with ``folder`` read-only (PYTHONPATH: this src); skips
    the calling test where no such mount can be made."""
    if not works(scratch):
        pytest.skip("cannot make a read-only mount here (needs unshare and mount, as root)")

    def run(folder, script, timeout=300):
        env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
        return subprocess.run(["unshare", "-m", "sh", "-c", f"{READ_ONLY.format(folder=folder)} && {script}"],
                              capture_output=True, text=True, env=env, timeout=timeout)
    return run
