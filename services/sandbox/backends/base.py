"""The one interface every sandbox backend implements: create, exec with a hard timeout, upload, download,
destroy, and list what it owns.

A backend is synchronous; the service calls it from worker threads. Every sandbox carries labels (team, run,
trial, and the instance of the service that made it) so that a reaper can find what nobody owns any more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from runctl.tasks import workdir_problem
from services.sandbox.errors import SandboxError

NetworkMode = Literal["no-network", "public", "allowlist"]
__all__ = [
    "Attachable",
    "Backend",
    "ExecResult",
    "ExecStream",
    "OwnedSandbox",
    "Sandbox",
    "SandboxError",
    "SandboxSpec",
]
#: Label keys every sandbox carries (Docker labels, Kubernetes labels, the local backend's metadata).
LABEL_PREFIX = "runctl."
OWNER_LABEL = "runctl.owner"
SANDBOX_LABEL = "runctl.sandbox"
#: Bytes of stdout and stderr an exec keeps (each); the rest is cut and the result says so.
OUTPUT_LIMIT = 1 << 20
#: Bytes of a file transfer per bus message (upload raw; download base64 in JSON), under NATS's 1 MB default.
CHUNK_BYTES = 512 * 1024


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox is made of: an image (or, for the local backend, a root folder), limits and labels."""

    sandbox_id: str
    image: str | None
    cpus: float = 1.0
    memory_mb: int = 2048
    pids: int = 512
    storage_mb: int | None = None
    network: NetworkMode = "no-network"
    allowed_hosts: tuple[str, ...] = ()
    workdir: str = "/app"
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    read_only_root: bool = False
    user: str | None = None
    binds: tuple[tuple[str, str, bool], ...] = ()
    """Host paths made visible inside: (host path, path inside, read-only). The runner binds the proxy's socket
    folder and an agent's bundle for agents inside the sandbox; nothing else does. The kubernetes backend binds
    nothing of the runner's machine: it mounts a bundle from its claim, and carries no socket."""

    def __post_init__(self) -> None:
        problem = workdir_problem(self.workdir)
        if problem is not None:
            raise SandboxError(problem)


@dataclass(frozen=True)
class Sandbox:
    """A live sandbox: its id, the backend's own handle for it, and its labels."""

    sandbox_id: str
    backend: str
    handle: str
    spec: SandboxSpec


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    truncated: bool = False


@dataclass(frozen=True)
class OwnedSandbox:
    """One sandbox a backend holds, as ``list_owned`` reports it."""

    sandbox_id: str
    handle: str
    labels: dict[str, str]


class Backend(Protocol):
    name: str

    def create(self, spec: SandboxSpec) -> Sandbox:
        """Start the sandbox; it idles until commands are run in it."""
        ...

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
        """Run ``command`` with ``sh -c``. On timeout, every process it started is killed inside the sandbox."""
        ...

    def upload(self, sandbox: Sandbox, source: Path, target: str) -> None:
        """Copy a local file or folder to ``target`` (a path inside the sandbox), creating parent folders."""
        ...

    def download(self, sandbox: Sandbox, source: str, target: Path) -> bool:
        """Copy a file or folder out of the sandbox into ``target``; False when ``source`` does not exist."""
        ...

    def destroy(self, sandbox: Sandbox) -> None:
        """Remove the sandbox and everything running in it; a sandbox already gone is not an error."""
        ...

    def list_owned(self, labels: dict[str, str] | None = None) -> list[OwnedSandbox]:
        """Every runctl sandbox this backend holds whose labels include ``labels``."""
        ...

    def destroy_owned(self, owned: OwnedSandbox) -> None:
        """Remove a sandbox found by ``list_owned`` (the reaper's path: no live handle needed)."""
        ...


class ExecStream(Protocol):
    """A command running in a sandbox whose stdin and stdout stay open: bytes both ways until either end closes."""

    def write(self, data: bytes) -> None:
        """Send ``data`` to the command's stdin (from any thread).

        Raises:
            OSError: the stream has ended.
        """
        ...

    def read(self, timeout_s: float) -> bytes | None:
        """What the command wrote to stdout since the last read, waiting up to ``timeout_s`` for some (b"" when
        none came); None once the stream has ended."""
        ...

    def close(self) -> None:
        """End the stream: the command's stdin closes."""
        ...


@runtime_checkable
class Attachable(Protocol):
    """A backend that binds nothing of the runner's machine into its sandboxes, so that what an agent inside must
    reach (its proxy session) is carried over a stream to a command in the sandbox instead."""

    def attach(self, sandbox: Sandbox, argv: list[str]) -> ExecStream:
        """Start ``argv`` in the sandbox with its stdin and stdout as a stream.

        Raises:
            SandboxError: the command could not be started.
        """
        ...
