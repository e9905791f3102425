"""A fake Kubernetes API server: no real one can run on these machines.

It serves exactly the paths runctl calls, with the real API's shapes, status codes and bearer-token check:

- ``GET  /api/v1/namespaces/{name}``                               (200 Namespace, 404 Status)
- ``POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews``  (allowed per the ``allowed`` verbs)

The sandbox backend's pod paths are added here when that backend is built. Tests point a kubeconfig at it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class FakeCluster:
    token: str = "test-token"
    namespaces: set[str] = field(default_factory=lambda: {"default", "runctl"})
    allowed: set[tuple[str, str]] = field(default_factory=lambda: {("create", "pods")})
    """(verb, resource) pairs the token may use, answered by self-subject access reviews."""
    requests: list[tuple[str, str]] = field(default_factory=list)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _Handler(BaseHTTPRequestHandler):
    cluster: FakeCluster

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        self.cluster.requests.append((self.command, self.path))
        if self.headers.get("Authorization") != f"Bearer {self.cluster.token}":
            self._send(401, _status(401, "Unauthorized", "Unauthorized"))
            return False
        return True

    def do_GET(self) -> None:
        if not self._authorised():
            return
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) == 4 and parts[:3] == ["api", "v1", "namespaces"]:
            name = parts[3]
            if name in self.cluster.namespaces:
                body = {
                    "kind": "Namespace",
                    "apiVersion": "v1",
                    "metadata": {"name": name},
                    "spec": {},
                    "status": {"phase": "Active"},
                }
                self._send(200, body)
            else:
                self._send(404, _status(404, "NotFound", f'namespaces "{name}" not found'))
            return
        self._send(404, _status(404, "NotFound", "the server could not find the requested resource"))

    def do_POST(self) -> None:
        if not self._authorised():
            return
        review = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path.split("?")[0] == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
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
            self._send(201, review)
            return
        self._send(404, _status(404, "NotFound", "the server could not find the requested resource"))


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
    handler = type("Handler", (_Handler,), {"cluster": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="fake-kube-api", daemon=True)
    thread.start()
    try:
        yield FakeKubeApi(f"http://127.0.0.1:{server.server_address[1]}", state)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
