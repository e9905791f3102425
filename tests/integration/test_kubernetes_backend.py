"""The kubernetes backend against the fake API server (tests/infra/kube_api.py), whose pods are real Docker
containers: pod spec, exec over the websocket channel protocol, hard timeouts, files, and whole trials.

No Kubernetes API server can run on these machines; what this cannot show is a real cluster's scheduling,
image pulls and NetworkPolicy enforcement by a CNI (the fake turns the deny-all policy into --network none).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runctl.tasks import load_task
from services.sandbox.agents import make_agent
from services.sandbox.backends.base import SandboxError, SandboxSpec
from services.sandbox.backends.kubernetes_backend import KubernetesBackend
from services.sandbox.trial import TrialRunner
from tests.conftest import ROOT
from tests.infra.docker_daemon import BASE_IMAGE
from tests.infra.kube_api import FakeCluster, FakeKubeApi, fake_kube_api

pytestmark = pytest.mark.integration
TASKS = ROOT / "tests" / "data" / "tasks"


@pytest.fixture(scope="module")
def kube(docker_host: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KubernetesBackend, FakeKubeApi]]:
    with fake_kube_api(FakeCluster(docker_host=docker_host)) as api:
        config = api.kubeconfig(tmp_path_factory.mktemp("kube"))
        backend = KubernetesBackend(kubeconfig=str(config), namespace="runctl", startup_timeout_s=60)
        yield backend, api
        assert backend.list_owned() == []
        backend.close()


def spec(**overrides: object) -> SandboxSpec:
    values: dict[str, object] = {"sandbox_id": f"k-{uuid.uuid4().hex[:8]}", "image": BASE_IMAGE, "memory_mb": 64}
    return SandboxSpec(**{**values, **overrides})  # type: ignore[arg-type]


def test_a_pod_is_locked_down_and_exec_works(kube: tuple[KubernetesBackend, FakeKubeApi]) -> None:
    backend, api = kube
    sandbox = backend.create(spec(labels={"runctl.team": "nlp", "runctl.run": "r-1"}))
    try:
        pod = api.cluster.pods[("runctl", sandbox.handle)]
        container = pod["spec"]["containers"][0]
        assert pod["spec"]["automountServiceAccountToken"] is False and pod["spec"]["activeDeadlineSeconds"] == 6000
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert container["resources"]["limits"] == {"cpu": "1.0", "memory": "64Mi"}
        assert pod["metadata"]["labels"]["runctl.run"] == "r-1"
        assert ("runctl", "runctl-no-network") in api.cluster.policies
        result = backend.exec(sandbox, "echo out; echo err >&2; pwd; exit 4", 30, env={"X": "a b"})
        assert (result.exit_code, result.stdout, result.stderr) == (4, "out\n/app\n", "err\n")
        assert backend.exec(sandbox, 'echo "$X"', 30, env={"X": "a b"}).stdout == "a b\n"
        assert backend.exec(sandbox, "ls /sys/class/net", 30).stdout.split() == ["lo"]
        timed = backend.exec(sandbox, "sleep 1001 & sleep 1002", 1.0)
        assert timed.timed_out and timed.exit_code == 124
        assert "sleep 100" not in backend.exec(sandbox, "ps -o args", 30).stdout
        assert [o.sandbox_id for o in backend.list_owned({"runctl.run": "r-1"})] == [sandbox.sandbox_id]
    finally:
        backend.destroy(sandbox)
    assert ("runctl", sandbox.handle) not in api.cluster.pods
    backend.destroy(sandbox)  # already gone: not an error


def test_files_go_in_and_come_out(kube: tuple[KubernetesBackend, FakeKubeApi], tmp_path: Path) -> None:
    backend, _ = kube
    sandbox = backend.create(spec())
    try:
        (tmp_path / "tests").mkdir()
        (tmp_path / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
        backend.upload(sandbox, tmp_path / "tests", "/tests")
        assert backend.exec(sandbox, "sh /tests/test.sh && cat /logs/verifier/reward.txt", 30).stdout == "1\n"
        assert backend.download(sandbox, "/logs", tmp_path / "logs")
        assert (tmp_path / "logs" / "verifier" / "reward.txt").read_text() == "1\n"
        assert not backend.download(sandbox, "/nothing", tmp_path / "none")
    finally:
        backend.destroy(sandbox)


@pytest.mark.parametrize(("task_name", "oracle", "nop"), [("hello", 1.0, 0.0), ("reward-planting", 0.0, 0.0)])
def test_trials_run_on_pods(
    kube: tuple[KubernetesBackend, FakeKubeApi], tmp_path: Path, task_name: str, oracle: float, nop: float
) -> None:
    backend, _ = kube
    task_dir = tmp_path / task_name
    shutil.copytree(TASKS / task_name, task_dir)
    toml = (task_dir / "task.toml").read_text()
    (task_dir / "task.toml").write_text(toml.replace("[environment]", f'[environment]\ndocker_image = "{BASE_IMAGE}"'))
    runner = TrialRunner(backend, backend.task_image)
    task = load_task(task_dir)
    assert runner.run(task, make_agent("oracle"), tmp_path / "oracle").reward == oracle
    assert runner.run(task, make_agent("nop"), tmp_path / "nop").reward == nop


def test_a_task_without_a_prebuilt_image_is_refused(kube: tuple[KubernetesBackend, FakeKubeApi]) -> None:
    backend, _ = kube
    with pytest.raises(SandboxError, match="prebuilt images only"):
        backend.task_image(load_task(TASKS / "hello"))
    assert (
        backend.task_image(load_task(TASKS / "hello"), "registry.local/team")
        == "registry.local/team/runctl-hello:latest"
    )


def test_folders_of_the_runners_machine_are_refused_not_dropped(kube: tuple[KubernetesBackend, FakeKubeApi]) -> None:
    """A pod binds nothing of the runner's machine: a bind that is not a bundle of the claim is refused."""
    backend, api = kube
    with pytest.raises(SandboxError, match="binds nothing of the runner's machine.*K8S_BUNDLE_CLAIM"):
        backend.create(spec(binds=(("/srv/bundle", "/runctl/bundle", True),)))
    assert backend.list_owned() == []


def test_a_bundle_is_mounted_read_only_from_its_claim(
    kube: tuple[KubernetesBackend, FakeKubeApi], tmp_path: Path
) -> None:
    """A bundle's folder under the runner's bundles folder becomes a read-only mount of the claim that holds that
    folder (its name as the subPath); a claim the namespace lacks is refused before any pod waits for it."""
    _, api = kube
    root = tmp_path / "bundles"
    (root / "mswea-2.4.6").mkdir(parents=True)
    (root / "mswea-2.4.6" / "manifest.json").write_text('{"name": "mswea"}')
    (root / "other-1").mkdir()
    api.cluster.claims[("runctl", "agent-bundles")] = root
    config = str(api.kubeconfig(tmp_path))

    def claimed(claim: str) -> KubernetesBackend:
        return KubernetesBackend(config, "runctl", startup_timeout_s=60, bundle_claim=claim, bundle_root=root)

    backend = claimed("agent-bundles")
    sandbox = backend.create(spec(binds=((str(root / "mswea-2.4.6"), "/runctl/bundle", True),)))
    try:
        pod = api.cluster.pods[("runctl", sandbox.handle)]
        assert pod["spec"]["volumes"] == [
            {"name": "runctl-bundles", "persistentVolumeClaim": {"claimName": "agent-bundles", "readOnly": True}}
        ]
        assert pod["spec"]["containers"][0]["volumeMounts"] == [
            {"name": "runctl-bundles", "mountPath": "/runctl/bundle", "subPath": "mswea-2.4.6", "readOnly": True}
        ]
        assert backend.exec(sandbox, "cat /runctl/bundle/manifest.json; ls /runctl", 30).stdout == (
            '{"name": "mswea"}bundle\n'
        )  # that bundle alone: not the claim's other folders
        planted = backend.exec(sandbox, "touch /runctl/bundle/planted", 30)
        assert planted.exit_code != 0 and "Read-only" in planted.stderr
    finally:
        backend.destroy(sandbox)
        backend.close()
    for claim, bind, refusal in (
        ("no-such-claim", root / "mswea-2.4.6", "no-such-claim .*does not exist in namespace runctl"),
        ("agent-bundles", tmp_path, "binds nothing of the runner's machine"),  # not a bundle of the claim
    ):
        backend = claimed(claim)
        with pytest.raises(SandboxError, match=refusal):
            backend.create(spec(binds=((str(bind), "/runctl/bundle", True),)))
        assert backend.list_owned() == []
        backend.close()


def test_bad_credentials_are_a_clear_error(tmp_path: Path) -> None:
    with fake_kube_api() as api:
        backend = KubernetesBackend(kubeconfig=str(api.kubeconfig(tmp_path, token="wrong")), startup_timeout_s=5)
        with pytest.raises(SandboxError, match="401"):
            backend.create(spec())
        backend.close()
