"""A local sandbox's disk limit: its writable folders (work folder, ``/logs``, ``/tmp``, uploaded top-level paths)
live on an ext4 file system of the task's ``storage_mb``, made in a sparse image file beside the sandbox's record
and loop-mounted (``nosuid``, ``nodev``) under its folder. A write past it fails inside the sandbox with "No space
left on device"; the host's disk holds at most the image. Needs root, ``mkfs.ext4`` and a free loop device; where
the host has none of these the sandbox gets no disk limit and ``sandbox.local`` warns (as Docker's backend does
where its storage driver cannot limit a container)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from services.sandbox.errors import SandboxError

TOOLS = ("mkfs.ext4", "mount", "umount")


def disk_limit_problem() -> str | None:
    """Why this host cannot give a local sandbox a disk limit, or None."""
    if os.geteuid() != 0:
        return "the sandbox service does not run as root, so it cannot loop-mount a sandbox's disk"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} is missing (Debian/Ubuntu: apt-get install e2fsprogs mount)"
    if not Path("/dev/loop-control").exists():
        return "the host has no loop devices (/dev/loop-control)"
    return None


def make_disk(image: Path, mount: Path, size_mb: int) -> None:
    """An ext4 file system of ``size_mb`` in ``image`` (sparse: it takes what is written), mounted at ``mount``.

    Raises:
        SandboxError: it could not be made or mounted (no free loop device, say), with what the tool said.
    """
    mount.mkdir(exist_ok=True)
    with image.open("wb") as f:
        f.truncate(size_mb * 1024 * 1024)
    _run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], "make the file system of")
    _run(["mount", "-o", "loop,nosuid,nodev", str(image), str(mount)], "mount the disk of")


def remove_disk(mount: Path) -> bool:
    """Unmount a sandbox's disk (lazily if a process still holds it: the loop device is freed when it lets go);
    True once nothing is mounted there."""
    if not os.path.ismount(mount):
        return True
    for argv in (["umount", str(mount)], ["umount", "-l", str(mount)]):
        subprocess.run(argv, capture_output=True, check=False, timeout=60)
        if not os.path.ismount(mount):
            return True
    return False


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise SandboxError(
            f"could not {what} the sandbox ({' '.join(argv[:1])}: {said[-1] if said else done.returncode}), so "
            "its storage_mb limit cannot hold. Fix: free a loop device (`losetup -a` lists them; fewer sandboxes at "
            "once, N_CONCURRENT) or free space on the disk of $RUNCTL_HOME/sandboxes."
        )
