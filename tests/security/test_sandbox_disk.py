"""An agent filling the disk of a bubblewrap sandbox whose task sets ``storage_mb``: its writes stop at the limit in
every writable folder (work folder, ``/tmp``, ``/logs``), the host's disk holds at most the limit, and destroying the
sandbox leaves no mount and no loop device behind."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from services.sandbox.backends.base import SandboxSpec
from services.sandbox.backends.disk import disk_limit_problem
from services.sandbox.backends.local_backend import DISK, DISK_IMAGE, LocalBackend

pytestmark = pytest.mark.integration
LIMIT_MB = 32


def test_an_agent_cannot_write_past_its_tasks_storage_limit(tmp_path: Path) -> None:
    problem = disk_limit_problem()
    if problem is not None:
        pytest.skip(problem)
    backend = LocalBackend(root=tmp_path / "sandboxes")
    spec = SandboxSpec(f"disk-{uuid.uuid4().hex[:10]}", None, memory_mb=256, pids=64, storage_mb=LIMIT_MB)
    sandbox = backend.create(spec)
    folder = Path(sandbox.handle)
    try:
        fill = backend.exec(sandbox, "dd if=/dev/zero of=/app/fill bs=1M count=128", 60, user="0")
        assert fill.exit_code != 0 and "No space left on device" in fill.stderr, fill
        for where in ("/tmp/more", "/logs/agent/more"):  # one file system: the others are full too
            more = backend.exec(sandbox, f"dd if=/dev/zero of={where} bs=1M count=4", 30, user="0")
            assert more.exit_code != 0 and "No space left on device" in more.stderr, more
        image = folder / DISK_IMAGE
        assert image.stat().st_blocks * 512 <= (LIMIT_MB + 2) * 1024 * 1024  # what the host's disk holds
        written = sum(p.stat().st_size for p in (folder / DISK).rglob("*") if p.is_file())
        assert LIMIT_MB * 1024 * 1024 // 2 < written <= LIMIT_MB * 1024 * 1024
    finally:
        backend.destroy(sandbox)
    assert not folder.exists() and not os.path.ismount(folder / DISK)
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False).stdout
    assert str(folder) not in loops
