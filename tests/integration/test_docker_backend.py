"""The docker backend against a real dockerd: exec, hard timeouts, files both ways, limits, labels."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.sandbox.backends.base import Sandbox, SandboxError, SandboxSpec
from services.sandbox.backends.docker_backend import DockerBackend
from tests.conftest import wait_until
from tests.infra.docker_daemon import BASE_IMAGE

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def backend(docker_host: str) -> Iterator[DockerBackend]:
    backend = DockerBackend(docker_host)
    yield backend
    for owned in backend.list_owned({"runctl.test": "docker-backend"}):
        backend.destroy_owned(owned)
    backend.close()


def spec(**overrides: object) -> SandboxSpec:
    values: dict[str, object] = {
        "sandbox_id": f"t-{uuid.uuid4().hex[:10]}",
        "image": BASE_IMAGE,
        "memory_mb": 64,
        "pids": 64,
        "labels": {"runctl.test": "docker-backend", "runctl.owner": "tests"},
    }
    values.update(overrides)
    return SandboxSpec(**values)  # type: ignore[arg-type]


@pytest.fixture
def sandbox(backend: DockerBackend) -> Iterator[Sandbox]:
    made = backend.create(spec())
    yield made
    backend.destroy(made)


def test_exec_returns_output_and_exit_code(backend: DockerBackend, sandbox: Sandbox) -> None:
    result = backend.exec(sandbox, "echo out; echo err >&2; pwd; exit 7", 30)
    assert (result.exit_code, result.timed_out) == (7, False)
    assert result.stdout == "out\n/app\n" and result.stderr == "err\n"


def test_a_timed_out_command_is_killed_inside_the_container(backend: DockerBackend, sandbox: Sandbox) -> None:
    result = backend.exec(sandbox, "sleep 1001 & (sleep 1002 &) ; sleep 1003", 1.0)
    assert result.timed_out and result.exit_code == 124
    assert result.duration_s < 10
    left = backend.exec(sandbox, "ps -o args", 10).stdout
    assert "sleep 100" not in left, left


def test_output_is_capped(backend: DockerBackend, sandbox: Sandbox) -> None:
    result = backend.exec(sandbox, "yes | head -c 3000000", 30)
    assert result.truncated and len(result.stdout) == 1 << 20


def test_files_and_folders_go_in_and_come_out(backend: DockerBackend, sandbox: Sandbox, tmp_path: Path) -> None:
    folder = tmp_path / "tests"
    (folder / "sub").mkdir(parents=True)
    (folder / "test.sh").write_text("echo hi\n")
    (folder / "sub" / "data.txt").write_text("x" * 1000)
    backend.upload(sandbox, folder, "/tests")
    assert backend.exec(sandbox, "cat /tests/test.sh; wc -c < /tests/sub/data.txt", 10).stdout.split() == [
        "echo",
        "hi",
        "1000",
    ]
    backend.exec(sandbox, "echo 0.5 > /logs/verifier/reward.txt; ln -s /etc/passwd /logs/verifier/link", 10)
    assert backend.download(sandbox, "/logs", tmp_path / "logs")
    assert (tmp_path / "logs" / "verifier" / "reward.txt").read_text() == "0.5\n"
    assert not (tmp_path / "logs" / "verifier" / "link").exists()  # a link out of the sandbox is not brought back
    assert not backend.download(sandbox, "/nothing/here", tmp_path / "none")


def test_limits_hold(backend: DockerBackend, tmp_path: Path) -> None:
    made = backend.create(spec(read_only_root=True))
    try:
        network = backend.exec(made, "ls /sys/class/net", 10).stdout.split()
        assert network == ["lo"]
        assert backend.exec(made, "touch /root-file", 10).exit_code != 0
        assert backend.exec(made, "touch /tmp/ok && touch /logs/ok", 10).exit_code == 0
        # What a command runs is the OOM killer's first choice; the container's init and idle loop are not.
        assert backend.exec(made, "cat /proc/self/oom_score_adj /proc/1/oom_score_adj", 10).stdout.split() == [
            "1000",
            "0",
        ]
        memory = backend.exec(made, "head -c 200m /dev/zero | tail > /dev/null", 30)
        assert memory.exit_code != 0  # killed by the 64 MiB limit
        assert backend.client.api.inspect_container(made.handle)["State"]["Running"]  # the sandbox outlives it
        forks = backend.exec(made, "for i in $(seq 200); do sleep 30 & done; wait", 10)
        assert "can't fork" in forks.stderr or "Resource temporarily unavailable" in forks.stderr
    finally:
        backend.destroy(made)


def test_a_storage_limit_the_daemon_cannot_enforce_does_not_stop_the_sandbox(backend: DockerBackend) -> None:
    made = backend.create(spec(storage_mb=512))
    try:
        assert backend.exec(made, "true", 10).exit_code == 0
        host_config = backend.client.api.inspect_container(made.handle)["HostConfig"]
        if backend.storage_limits:  # a daemon whose storage driver has quotas enforces it
            assert host_config["StorageOpt"] == {"size": "512M"}
        else:  # this one refused it once (logged); later sandboxes do not ask again
            assert not host_config.get("StorageOpt")
    finally:
        backend.destroy(made)


def test_labels_list_and_destroy_owned(backend: DockerBackend) -> None:
    made = backend.create(spec(labels={"runctl.test": "docker-backend", "runctl.owner": "svc-x", "runctl.run": "r1"}))
    owned = backend.list_owned({"runctl.run": "r1"})
    assert [o.sandbox_id for o in owned] == [made.sandbox_id]
    assert owned[0].labels["runctl.owner"] == "svc-x"
    backend.destroy_owned(owned[0])
    assert backend.list_owned({"runctl.run": "r1"}) == []
    backend.destroy(made)  # already gone: not an error


def test_a_missing_image_is_a_clear_error(backend: DockerBackend) -> None:
    with pytest.raises(SandboxError, match="not on the Docker daemon") as caught:
        backend.create(spec(image="runctl-no-such-image:1"))
    assert caught.value.cause == "image"


def test_build_is_content_addressed_and_reused(backend: DockerBackend, tmp_path: Path) -> None:
    context = tmp_path / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo built > /built.txt\nWORKDIR /app\n")
    tag = f"runctl-test-build:{uuid.uuid4().hex[:8]}"
    try:
        assert backend.build_image(context, tag, 120) == tag
        made = backend.create(spec(image=tag))
        try:
            assert backend.exec(made, "cat /built.txt", 10).stdout == "built\n"
        finally:
            backend.destroy(made)
        (context / "Dockerfile").write_text("FROM runctl-no-such-base:1\n")
        assert backend.build_image(context, tag, 120) == tag  # the tag exists: no rebuild
        with pytest.raises(SandboxError, match="failed") as caught:
            backend.build_image(context, tag + "x", 120)
        assert caught.value.cause == "image"
    finally:
        backend.client.images.remove(tag, force=True)


@pytest.mark.parametrize("freezer", ["works", "gives up"])
def test_halting_the_agent_freezes_and_kills_a_fork_bomb_from_the_host(
    backend: DockerBackend, freezer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if freezer == "gives up":  # as runc's freeze did once on a loaded host: then SIGSTOP from the host, pass by pass
        monkeypatch.setattr(backend, "_freeze", lambda sandbox: False)
    sandbox = backend.create(spec(cpus=0.5, pids=64))
    try:
        # Forty processes spinning on the sandbox's half CPU and one forking without pause: what a fork bomb
        # leaves (busybox's sh exits when a fork fails, so a textbook bomb dies out at the pids limit by itself).
        bomb = (
            "i=0; while [ $i -lt 40 ]; do (while :; do :; done) & i=$((i + 1)); done;"
            " (while :; do sleep 1 & done) & exit 0"
        )
        backend.exec(sandbox, bomb, 10, user="0")
        count = "set -- /proc/[0-9]*; echo $#"

        def processes() -> int | None:
            try:
                result = backend.exec(sandbox, count, 10, user="0")
            except SandboxError:
                return None  # no pid left to start even this
            return int(result.stdout) if result.exit_code == 0 and result.stdout.strip().isdigit() else None

        def crowded() -> bool:
            found = processes()
            return found is None or found > 30

        wait_until(crowded, 30, "the spinning processes to start")
        assert backend.halt_agent(sandbox) is True

        def calm() -> bool:
            found = processes()
            return found is not None and found <= 4  # init, the idle loop, its sleep, this shell

        wait_until(calm, 30, "every spinning and forking process to be gone")
        assert backend.exec(sandbox, "echo alive", 10).stdout.strip() == "alive"  # the sandbox itself still runs
    finally:
        backend.destroy(sandbox)
