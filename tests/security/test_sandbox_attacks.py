"""Attacks by agent code on what runctl puts into and takes out of its sandbox, on every backend here (bubblewrap and
Docker): links, special files and planted files where the verifier's files go, a work folder over the tests, and
the proxy's socket."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runctl.errors import TaskError
from runctl.tasks import load_task
from services.launcher.rollout.agents.installed import InstalledAgent
from services.sandbox.backends.base import Backend, Sandbox, SandboxError, SandboxSpec
from services.sandbox.backends.docker_backend import DockerBackend
from services.sandbox.backends.local_backend import LocalBackend
from tests.infra.docker_daemon import BASE_IMAGE

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("tests/security/test_sandbox_attacks.py")]
LABELS = {"runctl.owner": "security-tests"}


@pytest.fixture(scope="module")
def docker(request: pytest.FixtureRequest) -> Iterator[DockerBackend]:
    backend = DockerBackend(request.getfixturevalue("docker_host"))
    yield backend
    for owned in backend.list_owned(LABELS):
        backend.destroy_owned(owned)
    backend.close()


@pytest.fixture(params=["local", "docker"])
def made(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Backend, Sandbox]]:
    backend: Backend
    if request.param == "local":
        backend = LocalBackend(root=tmp_path_factory.mktemp("sandboxes"))
        image = None
    else:
        backend = request.getfixturevalue("docker")
        image = BASE_IMAGE
    sandbox = backend.create(
        SandboxSpec(f"sec-{uuid.uuid4().hex[:10]}", image, memory_mb=256, pids=64, labels=dict(LABELS))
    )
    yield backend, sandbox
    backend.destroy(sandbox)


def sh(backend: Backend, sandbox: Sandbox, command: str) -> str:
    done = backend.exec(sandbox, command, 30, user="0")
    assert done.exit_code == 0 and not done.timed_out, done
    return done.stdout


def test_a_link_planted_where_files_go_in_is_replaced_never_written_through(
    made: tuple[Backend, Sandbox], tmp_path: Path
) -> None:
    """The agent plants links where the verifier's files will land: to a file and to a folder of this machine (for
    bubblewrap, whose sandboxes live in this machine's folders) and of the sandbox's own root (for Docker)."""
    backend, sandbox = made
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    victim = victim_dir / "secret.txt"
    victim.write_text("untouched\n")
    inner = "/etc/hostname" if isinstance(backend, DockerBackend) else str(victim)
    inner_dir = "/etc" if isinstance(backend, DockerBackend) else str(victim_dir)
    before = sh(backend, sandbox, f"cat {inner}") if isinstance(backend, DockerBackend) else None
    sh(backend, sandbox, f"mkdir -p /app/out && ln -s {inner} /app/out/payload && ln -s {inner_dir} /app/dirlink")
    source = tmp_path / "out"
    source.mkdir()
    (source / "payload").write_text("from the upload\n")
    one = tmp_path / "one.txt"
    one.write_text("one\n")
    backend.upload(sandbox, source, "/app/out")
    backend.upload(sandbox, one, "/app/dirlink/planted.txt")
    assert victim.read_text() == "untouched\n" and sorted(p.name for p in victim_dir.iterdir()) == ["secret.txt"]
    if before is not None:
        assert sh(backend, sandbox, f"cat {inner}") == before and "planted.txt" not in sh(backend, sandbox, "ls /etc")
    assert sh(backend, sandbox, "cat /app/out/payload") == "from the upload\n"
    assert sh(backend, sandbox, "test -L /app/dirlink || echo real; cat /app/dirlink/planted.txt") == "real\none\n"


def test_files_the_agent_left_where_the_tests_go_are_gone_when_they_arrive(
    made: tuple[Backend, Sandbox], tmp_path: Path
) -> None:
    """A planted ``conftest.py`` beside the tests would make every test pass: the tests arrive alone."""
    backend, sandbox = made
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test.sh").write_text("#!/bin/sh\necho 0 > /logs/verifier/reward.txt\n")
    planted = backend.exec(
        sandbox, "mkdir -p /tests && echo 'pass everything' > /tests/conftest.py && ln -s /app /tests/test.sh", 30
    )
    if isinstance(backend, LocalBackend):
        assert planted.exit_code != 0  # the root is read-only: the agent cannot even make /tests
    backend.upload(sandbox, tests, "/tests")
    assert sh(backend, sandbox, "ls -A /tests").split() == ["test.sh"]
    assert "reward.txt" in sh(backend, sandbox, "cat /tests/test.sh")


def test_a_special_file_in_what_goes_in_is_skipped_not_read(made: tuple[Backend, Sandbox], tmp_path: Path) -> None:
    backend, sandbox = made
    source = tmp_path / "tests"
    source.mkdir()
    (source / "test.sh").write_text("true\n")
    os.mkfifo(source / "pipe")  # copying its content would wait for a writer for ever
    done = threading.Event()
    errors: list[BaseException] = []

    def upload() -> None:
        try:
            backend.upload(sandbox, source, "/tests")
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            done.set()

    threading.Thread(target=upload, daemon=True).start()
    assert done.wait(60), "the upload blocked on a FIFO"
    assert not errors, errors
    listed = sh(backend, sandbox, "ls -A /tests; test -p /tests/pipe && echo fifo-inside || true").split()
    assert "test.sh" in listed


def test_a_task_copy_cannot_write_through_a_link_an_earlier_copy_made(tmp_path: Path) -> None:
    """Task files are hostile too: one COPY brings a link to a folder of this machine, the next a file into it."""
    victim = tmp_path / "victim"
    victim.mkdir()
    task = tmp_path / "task"
    (task / "environment" / "a").mkdir(parents=True)
    (task / "environment" / "b" / "evil").mkdir(parents=True)
    (task / "environment" / "a" / "evil").symlink_to(victim)
    (task / "environment" / "b" / "evil" / "pwned.txt").write_text("pwned\n")
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\nCOPY a/ /app/\nCOPY b/ /app/\n")
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text("true\n")
    (task / "instruction.md").write_text("nothing\n")
    (task / "task.toml").write_text('version = "1.0"\n')
    backend = LocalBackend(root=tmp_path / "sandboxes")
    sandbox = backend.create(
        SandboxSpec(f"sec-{uuid.uuid4().hex[:10]}", backend.task_root(load_task(task)), labels=dict(LABELS))
    )
    try:
        assert list(victim.iterdir()) == []
        assert sh(backend, sandbox, "cat /app/evil/pwned.txt") == "pwned\n"
    finally:
        backend.destroy(sandbox)


@pytest.mark.parametrize("workdir", ["/tests", "/logs", "/logs/agent", "/", "/solution/x", "/runctl"])
def test_a_work_folder_over_the_tests_logs_or_solution_is_refused(tmp_path: Path, workdir: str) -> None:
    task = tmp_path / "task"
    (task / "tests").mkdir(parents=True)
    (task / "tests" / "test.sh").write_text("true\n")
    (task / "instruction.md").write_text("nothing\n")
    (task / "task.toml").write_text(f'version = "1.0"\n[environment]\nworkdir = "{workdir}"\n')
    with pytest.raises(TaskError) as info:
        load_task(task)
    assert "workdir" in str(info.value) and "reserved" in str(info.value)
    with pytest.raises(SandboxError):
        SandboxSpec("sec-x", None, workdir=workdir)


def test_the_proxy_socket_is_reachable_but_read_only_inside_the_sandbox(tmp_path: Path) -> None:
    folder = tmp_path / "proxy"
    folder.mkdir()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(folder / "proxy.sock"))
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        conn.sendall(b"proxy\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    backend = LocalBackend(root=tmp_path / "sandboxes")
    # The binds the runner gives an installed agent's sandbox.
    binds = InstalledAgent("true", "/sess/x", "tiny", folder, "python3", local_backend=False).binds_for(backend)
    sandbox = backend.create(SandboxSpec(f"sec-{uuid.uuid4().hex[:10]}", None, labels=dict(LABELS), binds=binds))
    try:
        swap = backend.exec(sandbox, "rm -f /runctl/proxy/proxy.sock; touch /runctl/proxy/other", 30)
        assert swap.exit_code != 0 and "Read-only" in swap.stderr
        assert sorted(p.name for p in folder.iterdir()) == ["proxy.sock"]
        connect = (
            "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/runctl/proxy/proxy.sock'); "
            "print(s.recv(16).decode().strip())"
        )
        started = time.monotonic()
        assert sh(backend, sandbox, f'python3 -c "{connect}"') == "proxy\n"
        assert time.monotonic() - started < 30
    finally:
        backend.destroy(sandbox)
        server.close()


def test_an_agent_cannot_change_its_bundle(tmp_path: Path) -> None:
    """The agent's bundle is bound read-only: agent code inside the sandbox (running as root there) can neither
    replace its interpreter, plant a file, nor remove one, and the bundle still hashes to its manifest after."""
    from runctl import bundles
    from tests.infra.bundles import fake_bundle

    fake_bundle(tmp_path / "bundles", interpreter="#!/bin/sh\necho real\n")
    bundle = bundles.load("mswea", root=tmp_path / "bundles", verify=True)
    proxy = tmp_path / "proxy"
    proxy.mkdir()
    from services.launcher.rollout.agents.bundled import BundledAgent

    backend = LocalBackend(root=tmp_path / "sandboxes")
    binds = BundledAgent(bundle, "/sess/x", "tiny", proxy, {}).binds_for(backend)
    sandbox = backend.create(SandboxSpec(f"sec-{uuid.uuid4().hex[:10]}", None, labels=dict(LABELS), binds=binds))
    try:
        for attack in (
            "echo 'echo hijacked' > /runctl/bundle/runtime/bin/python3.11",
            "touch /runctl/bundle/runtime/bin/planted",
            "rm -f /runctl/bundle/manifest.json",
            "chmod 777 /runctl/bundle/runtime/bin/python3.11",
        ):
            done = backend.exec(sandbox, attack, 30, user="0")
            assert done.exit_code != 0 and "Read-only" in done.stderr, (attack, done)
    finally:
        backend.destroy(sandbox)
    assert bundles.load("mswea", root=tmp_path / "bundles", verify=True).sha256 == bundle.sha256
