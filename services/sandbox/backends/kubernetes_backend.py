"""The kubernetes backend: one pod per sandbox, through the official ``kubernetes`` client.

- Pods: the task's image (prebuilt: ``docker_image`` or ``IMAGE_REGISTRY``; a cluster builds nothing), an idle
  command, CPU and memory as requests and limits, every capability dropped, no privilege escalation, no
  service-account token, no service links, the pod start-up timeout and an active deadline (Kubernetes kills a
  pod past it, even if every runctl process died), and the sandbox's labels.
- Network off: pods of a no-network sandbox carry ``runctl.network=no-network``, which a deny-all NetworkPolicy
  in the namespace (made once, by this backend) selects.
- Exec over the API's websocket channel protocol (v5: stdin can be closed); a timed-out command is killed inside
  the pod with its whole tree. Files move as tar streams through exec.
- Nothing of the runner's machine is bound into a pod. An agent inside the sandbox runs from its bundle, mounted
  read-only from a PersistentVolumeClaim that holds the runner's bundles folder (``K8S_BUNDLE_CLAIM``: the bundle's
  folder as the mount's ``subPath``), and reaches its proxy session through a relay whose connections travel over
  an exec stream (:meth:`KubernetesBackend.attach`), so the pod keeps the deny-all NetworkPolicy.

No Kubernetes API server can run on our test machines: this backend is tested against a fake of exactly the API
paths it calls (``tests/infra/kube_api.py``), whose pods are real Docker containers.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from runctl.tasks import Task
from services.sandbox.backends.base import (
    OUTPUT_LIMIT,
    SANDBOX_LABEL,
    ExecResult,
    ExecStream,
    OwnedSandbox,
    Sandbox,
    SandboxError,
    SandboxSpec,
)
from services.sandbox.backends.docker_backend import IDLE_COMMAND
from services.sandbox.backends.execio import Capture, quoted
from services.sandbox.backends.tarexec import TarOverExec

NETWORK_LABEL = "runctl.network"
DENY_ALL_POLICY = "runctl-no-network"
BUNDLE_VOLUME = "runctl-bundles"
POLL_S = 0.25
_LABEL_VALUE_MAX = 63


def _label_value(value: str) -> str:
    """A Kubernetes label value: at most 63 characters of [A-Za-z0-9._-], starting and ending alphanumeric."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in value)[:_LABEL_VALUE_MAX]
    return cleaned.strip("._-")


class KubernetesBackend(TarOverExec):
    name = "kubernetes"

    def __init__(
        self,
        kubeconfig: str | None = None,
        namespace: str = "runctl",
        startup_timeout_s: float = 1200,
        active_deadline_s: int = 6000,
        bundle_claim: str | None = None,
        bundle_root: Path | None = None,
    ) -> None:
        """``bundle_claim``: the PersistentVolumeClaim that holds, at its root, what ``bundle_root`` (the runner's
        bundles folder) holds; a bind of a folder directly under ``bundle_root`` becomes a read-only mount of it."""
        from kubernetes import client, config

        from services.sandbox.settings import kubeconfig_path

        try:
            kubeconfig = kubeconfig_path(kubeconfig)
            if kubeconfig:
                self.api_client = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
            else:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
                self.api_client = client.ApiClient()
        except (config.ConfigException, OSError) as e:
            raise SandboxError(
                f"the kubernetes backend has no credentials ({e}). Set KUBECONFIG, or run inside the cluster."
            ) from None
        self.core = client.CoreV1Api(self.api_client)
        self.networking = client.NetworkingV1Api(self.api_client)
        self.namespace = namespace
        self.startup_timeout_s = startup_timeout_s
        self.active_deadline_s = active_deadline_s
        self._policy_made = False
        self.bundle_claim = bundle_claim
        self.bundle_root = bundle_root
        self._claim_seen = False

    def close(self) -> None:
        self.api_client.close()

    def task_image(self, task: Task, registry: str | None = None) -> str:
        name = task.image_name(registry)
        if name is None:
            raise SandboxError(
                f"{task.path}: the kubernetes backend runs prebuilt images only; set IMAGE_REGISTRY or the task's "
                "[environment] docker_image",
                "image",
            )
        return name

    # --- lifecycle --------------------------------------------------------------------------------------------

    def _api(self, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call(*args, _request_timeout=60, **kwargs)
        except ApiException as e:
            raise SandboxError(f"{what} failed: {e.status} {e.reason}: {_message(e.body)}") from None
        except HTTPError as e:
            raise SandboxError(f"{what} failed: the Kubernetes API does not answer ({type(e).__name__})") from None

    def _ensure_deny_all(self) -> None:
        from kubernetes.client import ApiException

        if self._policy_made:
            return
        # No ingress or egress rule: everything to and from the selected pods is denied.
        policy: Any = {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": DENY_ALL_POLICY, "labels": {SANDBOX_LABEL: "policy"}},
            "spec": {
                "podSelector": {"matchLabels": {NETWORK_LABEL: "no-network"}},
                "policyTypes": ["Ingress", "Egress"],
            },
        }
        try:
            self.networking.create_namespaced_network_policy(self.namespace, policy, _request_timeout=60)
        except ApiException as e:
            if e.status != 409:  # 409: it exists
                raise SandboxError(f"cannot make the deny-all NetworkPolicy: {e.status} {_message(e.body)}") from None
        self._policy_made = True

    def create(self, spec: SandboxSpec) -> Sandbox:
        if spec.image is None:
            raise SandboxError("the kubernetes backend needs an image for every sandbox", "image")
        if spec.network == "allowlist":
            raise SandboxError(
                "the kubernetes backend cannot enforce an egress allowlist yet; use no-network or public"
            )
        mounts = self._bundle_mounts(spec.binds)
        if spec.network == "no-network":
            self._ensure_deny_all()
        name = f"runctl-{spec.sandbox_id}"[:63].rstrip("-")
        labels = {key: _label_value(value) for key, value in {SANDBOX_LABEL: spec.sandbox_id, **spec.labels}.items()}
        labels[NETWORK_LABEL] = spec.network
        resources = {"cpu": str(spec.cpus), "memory": f"{spec.memory_mb}Mi"}
        container: dict[str, Any] = {
            "name": "sandbox",
            "image": spec.image,
            "command": IDLE_COMMAND,
            "resources": {"requests": resources, "limits": resources},
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "readOnlyRootFilesystem": spec.read_only_root,
            },
            "env": [{"name": k, "value": v} for k, v in spec.env.items()],
        }
        if spec.workdir:
            container["workingDir"] = spec.workdir
        volumes: list[dict[str, Any]] = []
        if mounts:
            container["volumeMounts"] = mounts
            claim = {"claimName": self.bundle_claim, "readOnly": True}
            volumes.append({"name": BUNDLE_VOLUME, "persistentVolumeClaim": claim})
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "containers": [container],
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "activeDeadlineSeconds": self.active_deadline_s,
                "terminationGracePeriodSeconds": 0,
                **({"volumes": volumes} if volumes else {}),
            },
        }
        self._api("creating pod " + name, self.core.create_namespaced_pod, self.namespace, pod)
        sandbox = Sandbox(spec.sandbox_id, self.name, name, spec)
        try:
            self._wait_running(name)
            prepare = f"mkdir -p {quoted(spec.workdir or '/app')} /logs/agent /logs/verifier /logs/artifacts"
            result = self.exec(sandbox, prepare, 60)
            if result.exit_code != 0:
                raise SandboxError(f"the sandbox could not make its folders: {result.stderr.strip()}")
        except BaseException:
            self.destroy(sandbox)
            raise
        return sandbox

    def _bundle_mounts(self, binds: tuple[tuple[str, str, bool], ...]) -> list[dict[str, Any]]:
        """The pod's read-only mounts of the bundle claim for ``binds``, each a bundle's folder (refused otherwise).

        Raises:
            SandboxError: a bind of anything else, no claim set, or a claim the namespace does not have.
        """
        mounts: list[dict[str, Any]] = []
        claim, root = self.bundle_claim, self.bundle_root
        for host, inside, _ in binds:
            folder = Path(host).resolve()
            if claim is None or root is None or folder.parent != root.resolve():
                raise SandboxError(
                    f"the kubernetes backend binds nothing of the runner's machine into a pod ({host} at {inside}). "
                    "An agent's bundle is mounted from the claim K8S_BUNDLE_CLAIM names, which holds the runner's "
                    "bundles folder: set it (docs/security.md, 'Kubernetes sandboxes'), or use BACKEND=local or docker"
                )
            mounts.append({"name": BUNDLE_VOLUME, "mountPath": inside, "subPath": folder.name, "readOnly": True})
        if claim is not None and mounts and not self._claim_seen:
            self._check_claim(claim)
            self._claim_seen = True
        return mounts

    def _check_claim(self, claim: str) -> None:
        """Refuse a claim the namespace lacks, before a pod waits for it for the whole start-up timeout."""
        from kubernetes.client import ApiException

        try:
            self.core.read_namespaced_persistent_volume_claim(claim, self.namespace, _request_timeout=60)
        except ApiException as e:
            if e.status == 404:
                raise SandboxError(
                    f"the bundle claim {claim} (K8S_BUNDLE_CLAIM) does not exist in namespace {self.namespace}: every "
                    "pod would wait for it. Create the PersistentVolumeClaim holding the bundles (ReadOnlyMany), or "
                    "name the one that does"
                ) from None
            if e.status != 403:  # may not read claims: the pod's own start says if it is missing
                raise SandboxError(f"reading claim {claim} failed: {e.status} {_message(e.body)}") from None

    def _wait_running(self, name: str) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            pod = self._api("reading pod " + name, self.core.read_namespaced_pod, name, self.namespace)
            phase = pod.status.phase if pod.status else None
            statuses = (pod.status.container_statuses or []) if pod.status else []
            if phase == "Running" and statuses and all(s.ready for s in statuses):
                return
            if phase in ("Failed", "Succeeded"):
                raise SandboxError(f"pod {name} ended before it started ({phase}: {pod.status.message or ''})")
            if time.monotonic() > deadline:
                raise SandboxError(f"pod {name} did not start within {self.startup_timeout_s:.0f} s (phase {phase})")
            time.sleep(POLL_S)

    def destroy(self, sandbox: Sandbox) -> None:
        self._delete(sandbox.handle)

    def _delete(self, name: str) -> None:
        from kubernetes.client import ApiException

        try:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0, _request_timeout=60)
        except ApiException as e:
            if e.status != 404:
                raise SandboxError(f"cannot delete pod {name}: {e.status} {_message(e.body)}") from None

    def list_owned(self, labels: dict[str, str] | None = None) -> list[OwnedSandbox]:
        selector = ",".join([SANDBOX_LABEL] + [f"{k}={_label_value(v)}" for k, v in (labels or {}).items()])
        pods = self._api("listing pods", self.core.list_namespaced_pod, self.namespace, label_selector=selector)
        return [
            OwnedSandbox(p.metadata.labels[SANDBOX_LABEL], p.metadata.name, dict(p.metadata.labels))
            for p in pods.items
            if p.metadata.labels.get(SANDBOX_LABEL) != "policy"
        ]

    def destroy_owned(self, owned: OwnedSandbox) -> None:
        self._delete(owned.handle)

    # --- exec -------------------------------------------------------------------------------------------------

    def exec(
        self,
        sandbox: Sandbox,
        command: str,
        timeout_s: float,
        *,
        user: str | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        # Kubernetes exec takes no user, environment or folder: the command sets them itself.
        prefix = "".join(f"export {k}={quoted(v)}; " for k, v in (env or {}).items())
        if workdir:
            prefix += f"cd {quoted(workdir)} && "
        if user not in (None, "", "0", "root"):
            raise SandboxError("the kubernetes backend runs commands as the image's user; set it in the image")
        return self._timed_exec(sandbox.handle, prefix + command, timeout_s)

    def attach(self, sandbox: Sandbox, argv: list[str]) -> ExecStream:
        return PodStream(self._exec_socket(sandbox.handle, argv, stdin=True))

    def _exec_socket(self, pod: str, argv: list[str], stdin: bool) -> Any:
        """The websocket of ``argv`` run in the pod (stdout and stderr always; stdin when asked).

        Raises:
            SandboxError: the API would not start it.
        """
        from kubernetes.stream import stream

        try:
            return stream(
                self.core.connect_get_namespaced_pod_exec,
                pod,
                self.namespace,
                command=argv,
                container="sandbox",
                stdin=stdin,
                stdout=True,
                stderr=True,
                tty=False,
                binary=True,
                _preload_content=False,
            )
        except Exception as e:  # the client wraps every connection failure in ApiException(status=0)
            raise SandboxError(f"exec in pod {pod} failed: {e}") from None

    def _run(
        self, pod: str, argv: list[str], timeout_s: float, *, stdin: bytes | None = None, limit: int = OUTPUT_LIMIT
    ) -> tuple[int, Capture, Capture, bool]:
        ws = self._exec_socket(pod, argv, stdin=stdin is not None)
        out, err = Capture(limit), Capture(limit)
        try:
            if stdin is not None:
                ws.write_stdin(stdin)
                ws.close_channel(0)
            deadline = time.monotonic() + timeout_s
            while ws.is_open():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return 124, out, err, True
                ws.update(timeout=min(remaining, 1.0))
                out.add(ws.read_stdout(timeout=0) or b"")
                err.add(ws.read_stderr(timeout=0) or b"")
            out.add(ws.read_stdout(timeout=0) or b"")
            err.add(ws.read_stderr(timeout=0) or b"")
            return _exit_code(ws.read_channel(3)), out, err, False
        finally:
            _close(ws)


def _close(ws: Any) -> None:
    """Close an exec's websocket, and its socket: the client leaves that open when the server closed first."""
    ws.close()
    raw = getattr(ws.sock, "sock", None)
    if raw is not None:
        raw.close()


class PodStream:
    """An exec's websocket as an :class:`ExecStream`: stdin out, stdout in (stderr dropped: the relay writes its own
    to a log in the sandbox)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self._broken = False

    def _open(self) -> bool:
        return not self._broken and bool(self.ws.is_open())

    def write(self, data: bytes) -> None:
        if not self._open():
            raise OSError("the exec stream has ended")
        try:
            self.ws.write_stdin(data)
        except Exception as e:  # websocket-client's own errors, or the socket's
            raise OSError(f"the exec stream has ended ({e})") from None

    def read(self, timeout_s: float) -> bytes | None:
        if self._broken:
            return None
        try:
            if self.ws.is_open():
                self.ws.update(timeout=timeout_s)
            data: bytes = self.ws.read_stdout(timeout=0) or b""
            # The client keeps a copy of all it got (its API call takes no switch) and every other channel's
            # bytes: drop them.
            self.ws.read_all()
        except Exception:  # the connection broke: nothing more will come
            self._broken = True
            return None
        if data:
            return data
        return b"" if self._open() else None

    def close(self) -> None:
        try:
            if self._open():
                self.ws.close_channel(0)
        except Exception:
            pass
        finally:
            _close(self.ws)


def _exit_code(status: bytes | str) -> int:
    """The exit code from the error channel's Status: Success is 0; a NonZeroExitCode names the code."""
    if not status:
        return -1
    doc = json.loads(status)
    if doc.get("status") == "Success":
        return 0
    for cause in (doc.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message", -1))
    return -1


def _message(body: Any) -> str:
    try:
        return str(json.loads(body).get("message", body))
    except (TypeError, ValueError):
        return str(body)
