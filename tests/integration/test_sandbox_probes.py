"""Class 8 live probes against a real dockerd (with a fake registry) and a fake Kubernetes API server.

No registry is reachable from these machines, so a small HTTP server speaks the two registry v2 paths the
daemon asks (``/v2/`` and a manifest) and answers that the image does not exist.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runctl.config import load_config
from runctl.events import CheckResult
from services.validator.library import check_config
from tests.conftest import ROOT, free_port
from tests.infra import docker_daemon
from tests.infra.kube_api import FakeCluster, fake_kube_api
from tests.integration.test_lifecycle import fake_config

pytestmark = pytest.mark.integration
TASKS = ROOT / "tests" / "data" / "tasks"


def probe(config: Path, check_id: str) -> CheckResult:
    model = load_config(config, environ={}).model
    return next(r for r in check_config(model, live=True) if r.id == check_id)


class _EmptyRegistry(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        found = self.path.rstrip("/") == "/v2"
        body = b"{}" if found else b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}'
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = _answer


@pytest.fixture
def empty_registry(docker_host: str) -> Iterator[str]:
    # The daemon asks the registry, so it listens where the daemon is: the run's one dockerd may run in another
    # worker's network namespace.
    with docker_daemon.daemon_network():
        server = ThreadingHTTPServer(("127.0.0.1", 0), _EmptyRegistry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def eval_config(tmp_path: Path, tasks: Path = TASKS, **overrides: str) -> Path:
    """An ENGINE=local eval config on the test tasks (the sandbox probes skip ENGINE=fake: it makes no sandbox)."""
    values = {
        "RUN_TYPE": "eval",
        "TEAM": "nlp",
        "PROJECT_NAME": "p",
        "EXP_NAME": "probe",
        "MODEL_PATH": str(ROOT / "tests" / "data" / "models" / "llama-tiny"),
        "DATASET_PATH": str(tasks),
        "NGPUS_PER_NODE": "0",
        "GEN_TP": "1",
        **overrides,
    }
    path = tmp_path / "eval.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items() if v != ""))
    return path


def docker_config(tmp_path: Path, host: str, tasks: Path = TASKS, **overrides: str) -> Path:
    values = {"BACKEND": "docker", "DOCKER_HOST": host, "IMAGE_BUILD": "1"}
    return eval_config(tmp_path, tasks, **{**values, **overrides})


def test_docker_answers_and_the_task_base_image_exists(docker_host: str, tmp_path: Path) -> None:
    result = probe(docker_config(tmp_path, docker_host), "sandbox.docker")
    assert result.severity == "ok", result
    assert "1 image(s) needed are available" in result.message


def test_an_image_neither_local_nor_in_the_registry_is_fatal(
    docker_host: str, empty_registry: str, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks"
    shutil.copytree(TASKS / "hello", tasks / "hello")
    (tasks / "hello" / "environment" / "Dockerfile").write_text(
        f"FROM {empty_registry}/nothing:1 AS build\nFROM build\n"
    )
    result = probe(docker_config(tmp_path, docker_host, tasks), "sandbox.docker")
    assert result.severity == "fatal", result
    assert f"{empty_registry}/nothing:1 is neither on the daemon nor in its registry" in result.message
    assert "runctl/hello" in result.message

    prebuilt = docker_config(tmp_path, docker_host, TASKS, IMAGE_BUILD="", IMAGE_REGISTRY=f"{empty_registry}/team")
    result = probe(prebuilt, "sandbox.docker")
    assert result.severity == "fatal" and f"{empty_registry}/team/runctl-hello:latest" in result.message


def test_a_registry_that_does_not_answer_warns(docker_host: str, tmp_path: Path) -> None:
    config = docker_config(tmp_path, docker_host, IMAGE_BUILD="", IMAGE_REGISTRY=f"127.0.0.1:{free_port()}/team")
    result = probe(config, "sandbox.docker")
    assert result.severity == "warn", result
    assert "could not be asked" in result.message


def test_an_unreachable_docker_daemon_is_fatal_where_the_run_will_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = f"unix://{tmp_path}/none.sock"
    result = probe(docker_config(tmp_path, gone), "sandbox.docker")
    assert result.severity == "fatal" and f"the Docker daemon at {gone} does not answer" in result.message
    assert "DOCKER_HOST" in result.fix and "BACKEND=local" in result.fix
    # Unset in the config, DOCKER_HOST comes from the environment: the same place the runner takes it from.
    monkeypatch.setenv("DOCKER_HOST", gone)
    result = probe(
        docker_config(
            tmp_path,
            "",
        ),
        "sandbox.docker",
    )
    assert result.severity == "fatal" and gone in result.message
    assert probe(eval_config(tmp_path), "sandbox.docker").severity == "skip"  # BACKEND=local
    assert probe(fake_config(tmp_path, BACKEND="docker"), "sandbox.docker").severity == "skip"  # no sandbox


def test_the_runner_uses_the_docker_host_the_probe_checked(docker_host: str, tmp_path: Path) -> None:
    from services.sandbox.library import BackendSettings, open_backend

    config = load_config(docker_config(tmp_path, docker_host), environ={}).model
    assert probe(docker_config(tmp_path, docker_host), "sandbox.docker").severity == "ok"
    with open_backend("docker", BackendSettings.of(config)) as (backend, _):
        assert backend.host == docker_host  # type: ignore[attr-defined]


def test_without_bubblewrap_the_local_backend_is_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    result = probe(eval_config(tmp_path), "sandbox.local")
    assert result.severity == "fatal" and "bubblewrap (bwrap) is not installed" in result.message
    assert "apt-get install bubblewrap" in result.fix and "BACKEND=docker" in result.fix


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_the_local_backend_refuses_tasks_it_cannot_build_or_that_copy_host_files(tmp_path: Path) -> None:
    assert probe(eval_config(tmp_path), "sandbox.local").severity == "ok"
    tasks = tmp_path / "tasks"
    for name, dockerfile in (
        ("builds", "FROM runctl-base\nRUN echo the local backend builds nothing\n"),
        ("escapes", "FROM runctl-base\nCOPY ../../../../etc/hostname /app/\n"),
    ):
        shutil.copytree(TASKS / "hello", tasks / name)
        (tasks / name / "task.toml").write_text((TASKS / "hello" / "task.toml").read_text().replace("hello", name))
        (tasks / name / "environment" / "Dockerfile").write_text(dockerfile)
    result = probe(eval_config(tmp_path, tasks), "sandbox.local")
    assert result.severity == "fatal" and "2 of 2 task(s) cannot run on the local backend" in result.message
    assert "RUN is a build step" in result.message and "leads outside the build context" in result.message


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_public_network_the_host_cannot_give_a_local_sandbox_is_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A public sandbox gets a network namespace of its own (ip, iptables, nsenter as root): without those tools the
    check says so before a run, for the runs that ask for the network only."""
    path = "/usr/bin:/bin"  # bwrap and nsenter, not ip or iptables (in /usr/sbin)
    if shutil.which("bwrap", path=path) is None or shutil.which("iptables", path=path) is not None:
        pytest.skip(f"this host's {path} does not split the tools that way")
    monkeypatch.setenv("PATH", path)
    result = probe(eval_config(tmp_path, AGENT_NETWORK="public"), "sandbox.local")
    assert result.severity == "fatal" and "get a public network" in result.message, result
    assert "BACKEND=docker" in result.fix
    assert probe(eval_config(tmp_path), "sandbox.local").severity == "ok"  # the test tasks need no network


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_storage_limit_the_host_cannot_hold_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task's storage_mb is a loop-mounted file system on the local backend (mkfs.ext4, as root): without the tool
    the check warns, for the runs whose tasks set it only."""
    path = "/usr/bin:/bin"  # bwrap, not mkfs.ext4 (in /usr/sbin)
    if shutil.which("bwrap", path=path) is None or shutil.which("mkfs.ext4", path=path) is not None:
        pytest.skip(f"this host's {path} does not split the tools that way")
    monkeypatch.setenv("PATH", path)
    assert probe(eval_config(tmp_path), "sandbox.local").severity == "ok"  # the test tasks set no storage_mb
    tasks = tmp_path / "tasks"
    shutil.copytree(TASKS / "hello", tasks / "sized")
    toml = (TASKS / "hello" / "task.toml").read_text().replace("hello", "sized")
    (tasks / "sized" / "task.toml").write_text(toml.replace("[environment]", '[environment]\nstorage = "64M"'))
    result = probe(eval_config(tmp_path, tasks), "sandbox.local")
    assert result.severity == "warn" and "set storage_mb" in result.message and "mkfs.ext4" in result.message, result


def kube_config(tmp_path: Path, kubeconfig: Path, namespace: str = "runctl") -> Path:
    values = {"BACKEND": "k8s", "KUBECONFIG": str(kubeconfig), "K8S_NAMESPACE": namespace, "IMAGE_BUILD": "1"}
    return fake_config(tmp_path, **values)


def test_kubernetes_namespace_exists_and_pods_may_be_created(tmp_path: Path) -> None:
    with fake_kube_api() as api:
        result = probe(kube_config(tmp_path, api.kubeconfig(tmp_path)), "sandbox.kubernetes")
        assert result.severity == "ok", result
        assert ("GET", "/api/v1/namespaces/runctl") in api.cluster.requests


@pytest.mark.parametrize(
    ("cluster", "token", "namespace", "expected"),
    [
        (FakeCluster(), None, "missing", "kubectl create namespace missing"),
        (FakeCluster(), "wrong-token", "runctl", "401"),
        (FakeCluster(allowed=set()), None, "runctl", "may not create pods"),
    ],
    ids=["no-namespace", "bad-token", "no-rights"],
)
def test_kubernetes_problems_are_fatal(
    tmp_path: Path, cluster: FakeCluster, token: str | None, namespace: str, expected: str
) -> None:
    with fake_kube_api(cluster) as api:
        result = probe(kube_config(tmp_path, api.kubeconfig(tmp_path, token), namespace), "sandbox.kubernetes")
    assert result.severity == "fatal", result
    assert expected in result.message + result.fix


@pytest.mark.parametrize(
    ("claim", "access", "severity", "words"),
    [
        ("agent-bundles", ("ReadOnlyMany",), "ok", "the bundle claim agent-bundles exists"),
        ("absent", ("ReadOnlyMany",), "fatal", "the bundle claim absent (K8S_BUNDLE_CLAIM) does not exist"),
        ("agent-bundles", ("ReadWriteOnce",), "warn", "pods on more than one node cannot mount it at once"),
    ],
    ids=["present", "missing", "one-node"],
)
def test_the_claim_a_bundled_agents_pods_mount_is_read(
    tmp_path: Path, claim: str, access: tuple[str, ...], severity: str, words: str
) -> None:
    cluster = FakeCluster(claims={("runctl", "agent-bundles"): tmp_path}, claim_access=access)
    with fake_kube_api(cluster) as api:
        values = {"SCAFFOLD": "mswea", "MAX_MODEL_LEN": "4096", "K8S_BUNDLE_CLAIM": claim}
        config = fake_config(tmp_path, BACKEND="k8s", KUBECONFIG=str(api.kubeconfig(tmp_path)), **values)
        result = probe(config, "sandbox.kubernetes")
    assert result.severity == severity and words in result.message, result


def test_an_unreachable_kubernetes_api_is_skipped(tmp_path: Path) -> None:
    with fake_kube_api() as api:
        kubeconfig = api.kubeconfig(tmp_path)
    result = probe(kube_config(tmp_path, kubeconfig), "sandbox.kubernetes")
    assert result.severity == "skip" and "does not answer" in result.message
