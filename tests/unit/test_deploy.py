"""deploy/kubernetes, offline: each overlay rendered by kustomize (`kubectl kustomize`) and every object it holds
checked against Kubernetes's own schemas of the version the manifests state (`kubernetes-validate`, strict: an
unknown field is an error), and the sandbox backend's rights held against the API calls the backend makes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

KUBE = ROOT / "deploy" / "kubernetes"
#: The Kubernetes version the manifests are written for (deploy/kubernetes/README.md).
KUBERNETES_VERSION = "1.32.0"
OVERLAYS = sorted(p.name for p in (KUBE / "overlays").iterdir())

# kubectl comes with the machines CI runs on (1.32, with kustomize 5.5); elsewhere these tests are skipped, in CI
# (.ci/run) they fail without it.
pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None and not os.environ.get("RUNCTL_CI_BEGAN"),
    reason="kubectl (with its kustomize) is not installed",
)


def render(overlay: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        ["kubectl", "kustomize", str(KUBE / "overlays" / overlay)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def test_there_are_the_two_overlays() -> None:
    assert OVERLAYS == ["embedded-like", "production"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_of_an_overlay_is_valid_against_the_kubernetes_schemas(overlay: str) -> None:
    import kubernetes_validate

    objects = render(overlay)
    assert objects
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{overlay}: {obj['kind']} {obj['metadata']['name']}: {e.message} at {list(e.path)}")
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "runctl"


def test_the_validator_refuses_what_the_schemas_refuse() -> None:
    """The check above can fail: a field a Role does not have, and a policy type that does not exist."""
    import kubernetes_validate

    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "r"}, "rulez": []}
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "p"},
        "spec": {"podSelector": {}, "policyTypes": 7},
    }
    for obj in (role, policy):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def by_kind(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_sandbox_backend_may_do_what_it_calls_there_and_nothing_else(overlay: str) -> None:
    """Every API call services/sandbox/backends/kubernetes_backend.py makes is allowed in the sandbox namespace, and
    the Role allows nothing beyond them; pods of a no-network sandbox are denied every way in and out; the bundle
    claim can be mounted by pods on many nodes."""
    objects = render(overlay)
    role = by_kind(objects, "Role", "runctl-sandbox-backend")
    namespace = role["metadata"]["namespace"]
    allowed = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    calls = {
        ("pods", "create"), ("pods", "get"), ("pods", "list"), ("pods", "delete"),  # create, wait, list_owned, destroy
        ("pods/exec", "create"), ("pods/exec", "get"),  # exec and attach (a websocket upgrade)
        ("persistentvolumeclaims", "get"),  # the bundle claim, before the first pod that mounts it
        ("networkpolicies", "create"), ("networkpolicies", "get"),  # the deny-all policy when it is missing
    }  # fmt: skip
    assert allowed == calls
    binding = by_kind(objects, "RoleBinding", "runctl-sandbox-backend")
    assert binding["metadata"]["namespace"] == namespace
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "runctl-sandbox-backend", "namespace": "runctl"}]
    reader = by_kind(objects, "ClusterRole", "runctl-sandbox-namespace-reader")
    assert reader["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "resourceNames": [namespace], "verbs": ["get"]}
    ]
    policy = by_kind(objects, "NetworkPolicy", "runctl-no-network")
    assert policy["metadata"]["namespace"] == namespace
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {"runctl.network": "no-network"}},
        "policyTypes": ["Ingress", "Egress"],
    }  # no rule: nothing allowed either way
    claim = by_kind(objects, "PersistentVolumeClaim", "runctl-agent-bundles")
    assert claim["metadata"]["namespace"] == namespace and claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_the_manifests_name_what_the_backend_names() -> None:
    """The policy's name and label are the backend's own (it makes the same policy when one is missing)."""
    from services.sandbox.backends.kubernetes_backend import DENY_ALL_POLICY, NETWORK_LABEL

    text = (KUBE / "base" / "sandboxes.yaml").read_text()
    assert f"name: {DENY_ALL_POLICY}\n" in text and f"{NETWORK_LABEL}: no-network" in text


def test_the_readme_names_every_overlay() -> None:
    readme = (KUBE / "README.md").read_text()
    for overlay in OVERLAYS:
        assert f"overlays/{overlay}" in readme
    assert Path(KUBE / "README.md").is_file()
