"""Local sandboxes' cgroup limits on a cgroup v2 host. This machine mounts cgroup v1, so the v2 hierarchy is a faithful
fake of the files runctl reads and writes (``cgroup.controllers``, ``cgroup.subtree_control``, ``memory.max``,
``memory.swap.max``, ``pids.max``, ``cpu.max``, ``cgroup.procs``) in a temporary folder; the sandbox and its
commands are real bubblewrap processes."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from services.sandbox.backends import local_backend
from services.sandbox.backends.base import SandboxSpec
from services.sandbox.backends.local_backend import LocalBackend

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]


@pytest.fixture
def v2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (root / "cgroup.subtree_control").write_text("\n")
    monkeypatch.setattr(local_backend, "CGROUP_ROOT", root)

    def rmdir(group: Path, timeout_s: float = 5.0) -> bool:  # the kernel removes a cgroup with its files
        shutil.rmtree(group, ignore_errors=True)
        return True

    monkeypatch.setattr(local_backend, "remove_cgroup", rmdir)
    return root


def test_a_sandbox_on_cgroup_v2_gets_its_limits_in_one_folder_and_its_commands_join_it(
    v2: Path, tmp_path: Path
) -> None:
    assert local_backend.unified_cgroups() and local_backend.cgroup_limits_problem() is None
    backend = LocalBackend(root=tmp_path / "sandboxes", cgroup_parent="runctl-v2")
    spec = SandboxSpec(f"v2-{uuid.uuid4().hex[:8]}", None, cpus=0.5, memory_mb=256, pids=64)
    sandbox = backend.create(spec)
    group = v2 / "runctl-v2" / spec.sandbox_id
    try:
        assert (group / "memory.max").read_text() == str(256 * 1024 * 1024)
        assert (group / "pids.max").read_text() == "64"
        assert (group / "cpu.max").read_text() == "50000 100000"
        for level in (v2, v2 / "runctl-v2"):  # each folder above hands the controllers down
            assert set((level / "cgroup.subtree_control").read_text().split()) == {"+memory", "+pids", "+cpu"}
        assert not (group / "cgroup.subtree_control").exists()  # the sandbox's own folder holds its processes
        done = backend.exec(sandbox, "echo in", 30)
        assert done.exit_code == 0 and done.stdout.strip() == "in", done
        assert (group / "cgroup.procs").read_text().strip().isdigit()  # the command moved itself in first
    finally:
        backend.destroy(sandbox)
    assert not group.exists()
    (v2 / "runctl-v2" / "cgroup.subtree_control").unlink()  # the kernel's files do not keep rmdir from working
    backend.remove_cgroup_parents()
    assert not (v2 / "runctl-v2").exists()


def test_a_v2_hierarchy_without_a_controller_gives_no_cgroup_and_says_which(v2: Path, tmp_path: Path) -> None:
    (v2 / "cgroup.controllers").write_text("cpuset cpu io\n")
    assert "memory, pids" in str(local_backend.cgroup_limits_problem())
    backend = LocalBackend(root=tmp_path / "sandboxes", cgroup_parent="runctl-v2")
    sandbox = backend.create(SandboxSpec(f"v2-{uuid.uuid4().hex[:8]}", None, memory_mb=256))
    try:
        assert backend.exec(sandbox, "true", 30).exit_code == 0  # resource limits of the process instead
        assert not (v2 / "runctl-v2").exists()
    finally:
        backend.destroy(sandbox)
