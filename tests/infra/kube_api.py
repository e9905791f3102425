"""A fake Kubernetes API server: no real one can run on these machines.

It serves exactly the paths runctl calls, with the real API's shapes, status codes and bearer-token check:

- ``GET  /api/v1/namespaces/{ns}``                                 (200 Namespace, 404 Status)
- ``POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews``  (allowed per the ``allowed`` verbs)
- ``POST /apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies`` (201, 409 when it exists)
- ``POST /api/v1/namespaces/{ns}/pods``, ``GET …/pods?labelSelector=``, ``GET/DELETE …/pods/{name}``
- ``GET  /api/v1/namespaces/{ns}/persistentvolumeclaims/{name}``   (200 Bound, 404 Status)
- ``GET  /api/v1/namespaces/{ns}/pods/{name}/exec`` upgraded to a websocket speaking the channel protocol
  (``v5.channel.k8s.io``, or v4): 0 stdin, 1 stdout, 2 stderr, 3 the exit Status, 255 close a channel.

A pod is a real Docker container when the fake is given a Docker host: limits as the pod's ``limits``, no
network when the deny-all NetworkPolicy selects the pod, capabilities dropped as its securityContext says, a
volume of a claim as a bind of the folder the cluster's ``claims`` give that claim (``subPath`` below it, read-only
as the mount says). An exec whose client goes closes the command's stdin, as the kubelet does. Without Docker,
pods are records only (enough for the validator's probes).
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

_HEADER = struct.Struct(">BxxxL")


@dataclass
class FakeCluster:
    token: str = "test-token"
    namespaces: set[str] = field(default_factory=lambda: {"default", "runctl"})
    allowed: set[tuple[str, str]] = field(default_factory=lambda: {("create", "pods")})
    """(verb, resource) pairs the token may use, answered by self-subject access reviews."""
    docker_host: str | None = None
    requests: list[tuple[str, str]] = field(default_factory=list)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    policies: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    containers: dict[tuple[str, str], str] = field(default_factory=dict)
    made: list[dict[str, Any]] = field(default_factory=list)
    """Every pod created, as it was asked for (deleted ones too)."""
    claims: dict[tuple[str, str], Path] = field(default_factory=dict)
    """PersistentVolumeClaims, (namespace, name), each bound to a folder of this machine."""
    claim_access: tuple[str, ...] = ("ReadOnlyMany",)
    """The access modes every claim has."""


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


def _selected(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if key not in labels or ("=" in term and labels[key] != value):
            return False
    return True


class FakeApi:
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.docker: Any = None
        if cluster.docker_host:
            import docker

            self.docker = docker.DockerClient(base_url=cluster.docker_host, timeout=60)

    @web.middleware
    async def auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.cluster.requests.append((request.method, request.path))
        if request.headers.get("Authorization") != f"Bearer {self.cluster.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        response: web.StreamResponse = await handler(request)
        return response

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.auth])
        app.router.add_get("/api/v1/namespaces/{ns}", self.namespace)
        app.router.add_post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", self.review)
        app.router.add_post("/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies", self.policy)
        app.router.add_post("/api/v1/namespaces/{ns}/pods", self.create_pod)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self.list_pods)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self.read_pod)
        app.router.add_delete("/api/v1/namespaces/{ns}/pods/{name}", self.delete_pod)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/exec", self.exec)
        app.router.add_get("/api/v1/namespaces/{ns}/persistentvolumeclaims/{name}", self.claim)
        return app

    async def claim(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        if (ns, name) not in self.cluster.claims:
            return _status(404, "NotFound", f'persistentvolumeclaims "{name}" not found')
        body = {
            "kind": "PersistentVolumeClaim",
            "apiVersion": "v1",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"accessModes": list(self.cluster.claim_access), "resources": {"requests": {"storage": "10Gi"}}},
            "status": {"phase": "Bound", "accessModes": list(self.cluster.claim_access)},
        }
        return web.json_response(body)

    def _binds(self, ns: str, pod: dict[str, Any]) -> list[str]:
        """Docker binds for the container's mounts of claim volumes (a claim the cluster lacks: KeyError)."""
        claims = {
            v["name"]: self.cluster.claims[(ns, v["persistentVolumeClaim"]["claimName"])]
            for v in pod["spec"].get("volumes", [])
            if "persistentVolumeClaim" in v
        }
        binds = []
        for mount in pod["spec"]["containers"][0].get("volumeMounts", []):
            host = claims[mount["name"]] / mount.get("subPath", "")
            binds.append(f"{host}:{mount['mountPath']}:{'ro' if mount.get('readOnly') else 'rw'}")
        return binds

    async def namespace(self, request: web.Request) -> web.Response:
        name = request.match_info["ns"]
        if name not in self.cluster.namespaces:
            return _status(404, "NotFound", f'namespaces "{name}" not found')
        body = {
            "kind": "Namespace",
            "apiVersion": "v1",
            "metadata": {"name": name},
            "spec": {},
            "status": {"phase": "Active"},
        }
        return web.json_response(body)

    async def review(self, request: web.Request) -> web.Response:
        review = await request.json()
        attributes = review.get("spec", {}).get("resourceAttributes", {})
        allowed = (attributes.get("verb"), attributes.get("resource")) in self.cluster.allowed
        review.update(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "metadata": {},
                "status": {"allowed": allowed},
            }
        )
        return web.json_response(review, status=201)

    async def policy(self, request: web.Request) -> web.Response:
        ns, body = request.match_info["ns"], await request.json()
        key = (ns, body["metadata"]["name"])
        if key in self.cluster.policies:
            return _status(409, "AlreadyExists", f'networkpolicies "{key[1]}" already exists')
        self.cluster.policies[key] = body
        return web.json_response(body, status=201)

    def _denied_network(self, ns: str, labels: dict[str, str]) -> bool:
        for (policy_ns, _), policy in self.cluster.policies.items():
            match = policy["spec"].get("podSelector", {}).get("matchLabels", {})
            if policy_ns == ns and all(labels.get(k) == v for k, v in match.items()):
                return True
        return False

    async def create_pod(self, request: web.Request) -> web.Response:
        ns, pod = request.match_info["ns"], await request.json()
        if ns not in self.cluster.namespaces:
            return _status(404, "NotFound", f'namespaces "{ns}" not found')
        name = pod["metadata"]["name"]
        if (ns, name) in self.cluster.pods:
            return _status(409, "AlreadyExists", f'pods "{name}" already exists')
        pod["metadata"].update(
            {
                "namespace": ns,
                "uid": f"uid-{name}",
                "creationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
        pod["status"] = {"phase": "Pending"}
        self.cluster.pods[(ns, name)] = pod
        self.cluster.made.append(pod)
        if self.docker is not None:
            await asyncio.to_thread(self._start_container, ns, pod)
        return web.json_response(pod, status=201)

    def _start_container(self, ns: str, pod: dict[str, Any]) -> None:
        spec = pod["spec"]["containers"][0]
        limits = spec.get("resources", {}).get("limits", {})
        security = spec.get("securityContext", {})
        memory = limits.get("memory", "512Mi").removesuffix("Mi")
        container = self.docker.containers.run(
            spec["image"],
            spec.get("command"),
            detach=True,
            labels={"runctl.fake-kube": "1"},
            network_mode="none" if self._denied_network(ns, pod["metadata"]["labels"]) else None,
            mem_limit=f"{memory}m",
            nano_cpus=int(float(limits.get("cpu", "1")) * 1e9),
            cap_drop=security.get("capabilities", {}).get("drop"),
            security_opt=["no-new-privileges"] if security.get("allowPrivilegeEscalation") is False else None,
            read_only=bool(security.get("readOnlyRootFilesystem")),
            working_dir=spec.get("workingDir"),
            volumes=self._binds(ns, pod),
            init=True,
        )
        self.cluster.containers[(ns, pod["metadata"]["name"])] = container.id
        pod["status"] = {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "sandbox",
                    "ready": True,
                    "restartCount": 0,
                    "image": spec["image"],
                    "imageID": "",
                    "state": {"running": {}},
                }
            ],
        }

    async def list_pods(self, request: web.Request) -> web.Response:
        ns, selector = request.match_info["ns"], request.query.get("labelSelector", "")
        items = [
            p
            for (pod_ns, _), p in self.cluster.pods.items()
            if pod_ns == ns and _selected(p["metadata"].get("labels", {}), selector)
        ]
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})

    async def read_pod(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        if key not in self.cluster.pods:
            return _status(404, "NotFound", f'pods "{key[1]}" not found')
        return web.json_response(self.cluster.pods[key])

    async def delete_pod(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        pod = self.cluster.pods.pop(key, None)
        if pod is None:
            return _status(404, "NotFound", f'pods "{key[1]}" not found')
        container = self.cluster.containers.pop(key, None)
        if container is not None:
            await asyncio.to_thread(self.docker.api.remove_container, container, force=True)
        return web.json_response(pod)

    async def exec(self, request: web.Request) -> web.StreamResponse:
        key = (request.match_info["ns"], request.match_info["name"])
        if key not in self.cluster.containers:
            return _status(404, "NotFound", f'pods "{key[1]}" not found or not running')
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"))
        await ws.prepare(request)
        command = request.query.getall("command")
        stdin = request.query.get("stdin") == "true"
        api = self.docker.api
        exec_id = (await asyncio.to_thread(api.exec_create, self.cluster.containers[key], command, stdin=stdin))["Id"]
        raw = await asyncio.to_thread(api.exec_start, exec_id, socket=True)
        sock: socket.socket = getattr(raw, "_sock", raw)
        loop = asyncio.get_running_loop()
        pump = loop.run_in_executor(None, self._pump, sock, ws, loop)

        async def from_client() -> None:
            async for msg in ws:
                if msg.type != WSMsgType.BINARY or not msg.data:
                    continue
                channel, data = msg.data[0], msg.data[1:]
                if channel == 0:
                    await asyncio.to_thread(sock.sendall, data)
                elif channel == 255 and data[:1] == b"\x00":
                    sock.shutdown(socket.SHUT_WR)
            if stdin:  # the client went: the command's stdin ends
                try:
                    sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        reader = asyncio.create_task(from_client())
        try:
            await pump
            reader.cancel()
            code = (await asyncio.to_thread(api.exec_inspect, exec_id)).get("ExitCode")
            status: dict[str, Any] = {"metadata": {}, "status": "Success"}
            if code != 0:
                status = {
                    "metadata": {},
                    "status": "Failure",
                    "message": f"command terminated with exit code {code}",
                    "reason": "NonZeroExitCode",
                    "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
                }
            if not ws.closed:  # a client that timed out has gone: nobody to tell
                await ws.send_bytes(b"\x03" + json.dumps(status).encode())
                await ws.close()
        except ConnectionError:
            pass  # the client left while we were answering
        finally:
            sock.close()
            raw.close()
        return ws

    @staticmethod
    def _pump(sock: socket.socket, ws: web.WebSocketResponse, loop: asyncio.AbstractEventLoop) -> None:
        """Docker's multiplexed exec stream → websocket frames on channels 1 and 2, until the command ends."""
        buffer = b""
        while True:
            select.select([sock], [], [])
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            buffer += chunk
            while len(buffer) >= _HEADER.size:
                stream, size = _HEADER.unpack_from(buffer)
                if len(buffer) < _HEADER.size + size:
                    break
                frame = bytes([1 if stream != 2 else 2]) + buffer[_HEADER.size : _HEADER.size + size]
                buffer = buffer[_HEADER.size + size :]
                asyncio.run_coroutine_threadsafe(ws.send_bytes(frame), loop).result()

    def close(self) -> None:
        if self.docker is not None:
            for container in list(self.cluster.containers.values()):
                self.docker.api.remove_container(container, force=True)
            self.cluster.containers.clear()
            self.docker.close()


@dataclass(frozen=True)
class FakeKubeApi:
    url: str
    cluster: FakeCluster

    def kubeconfig(self, folder: Path, token: str | None = None) -> Path:
        """A kubeconfig file for this server (JSON is valid YAML)."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": token or self.cluster.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
        }
        path = folder / "kubeconfig"
        path.write_text(json.dumps(doc))
        return path


@contextmanager
def fake_kube_api(cluster: FakeCluster | None = None) -> Iterator[FakeKubeApi]:
    state = cluster or FakeCluster()
    api = FakeApi(state)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(api.app())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, name="fake-kube-api", daemon=True)
    thread.start()
    try:
        yield FakeKubeApi(f"http://127.0.0.1:{port}", state)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
        api.close()
