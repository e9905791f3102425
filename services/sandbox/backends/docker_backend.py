"""The docker backend: one container per sandbox, through the Docker Engine API (the ``docker`` SDK).

- Images: a task's ``docker_image`` as given, or its ``environment/`` folder built once into
  ``runctl-task:<content hash>`` (the same folder never builds twice, concurrent trials wait for one build).
- Limits: CPU, memory (no swap), pids; every capability dropped; no-new-privileges; network off unless the
  task allows it; an init process reaps zombies.
- Exec: every command runs under a wrapper that reports its PID; on timeout the whole process tree is killed
  inside the container, not only the client's connection. Output is capped per stream.
- Files move as tar streams through exec (``tar`` in the image), which works on read-only roots and tmpfs
  mounts, where the archive API does not.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

from runctl.tasks import Task
from services.sandbox.backends.base import (
    OUTPUT_LIMIT,
    OWNER_LABEL,
    SANDBOX_LABEL,
    ExecResult,
    OwnedSandbox,
    Sandbox,
    SandboxError,
    SandboxSpec,
)
from services.sandbox.backends.execio import Capture, quoted
from services.sandbox.backends.files import folder_digest
from services.sandbox.backends.tarexec import TarOverExec

log = logging.getLogger(__name__)
IDLE_COMMAND = ["sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]
_HEADER = struct.Struct(">BxxxL")


class DockerBackend(TarOverExec):
    name = "docker"
    file_exec_options = {"user": "0"}

    def __init__(self, host: str | None = None, api_timeout_s: int = 120) -> None:
        import docker

        from runctl.probe import socket_unreachable
        from services.sandbox.settings import docker_host

        self.host = host or docker_host()
        unreachable = socket_unreachable(self.host)
        if unreachable:
            raise SandboxError(
                f"the Docker daemon at {self.host} does not answer ({unreachable}). Fix: start dockerd, or set "
                "DOCKER_HOST to a daemon that runs, or use BACKEND=local."
            )
        self.client = docker.DockerClient(base_url=self.host, timeout=api_timeout_s)
        self._build_locks: dict[str, threading.Lock] = {}
        self.storage_limits = True
        """False once the daemon refused a storage limit: its storage driver cannot enforce one."""
        self._locks_guard = threading.Lock()

    def close(self) -> None:
        self.client.close()

    # --- images -----------------------------------------------------------------------------------------------

    def has_image(self, name: str) -> bool:
        import docker.errors

        try:
            self.client.images.get(name)
            return True
        except docker.errors.ImageNotFound:
            return False

    def _pull(self, name: str) -> None:
        import docker.errors

        try:
            self.client.images.pull(name)
        except docker.errors.APIError as e:
            raise SandboxError(
                f"image {name} is not on the Docker daemon at {self.host} and pulling it failed: {e.explanation}",
                "image",
            ) from None

    def build_image(self, context: Path, tag: str, timeout_s: float) -> str:
        """Build ``context`` (a folder with a Dockerfile) as ``tag`` unless it exists; one build per tag at once."""
        import docker.errors

        with self._locks_guard:
            lock = self._build_locks.setdefault(tag, threading.Lock())
        with lock:
            if self.has_image(tag):
                return tag
            started = time.monotonic()
            try:
                self.client.images.build(path=str(context), tag=tag, rm=True, forcerm=True, network_mode="none")
            except docker.errors.BuildError as e:
                tail = "".join(str(step.get("stream") or step.get("error") or "") for step in e.build_log)[-2000:]
                raise SandboxError(f"building {context} failed: {e.msg}\n{tail}", "image") from None
            except docker.errors.APIError as e:
                raise SandboxError(f"building {context} failed: {e.explanation}", "image") from None
            if time.monotonic() - started > timeout_s:
                raise SandboxError(f"building {context} took longer than {timeout_s:.0f} s", "image")
            return tag

    def task_image(self, task: Task, registry: str | None = None) -> str:
        """The image a trial of ``task`` runs in: its prebuilt image, else its environment built (once)."""
        name = task.image_name(registry)
        if name:
            if not self.has_image(name):
                self._pull(name)
            return name
        dockerfile = task.environment_file
        if dockerfile is None or dockerfile.name != "Dockerfile":
            raise SandboxError(f"{task.path} has no environment/Dockerfile and no docker_image", "image")
        tag = f"runctl-task:{folder_digest(dockerfile.parent)[:16]}"
        return self.build_image(dockerfile.parent, tag, task.config.environment.build_timeout_sec)

    # --- lifecycle --------------------------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> Sandbox:
        import docker.errors

        if spec.image is None:
            raise SandboxError("the docker backend needs an image for every sandbox", "image")
        if not self.has_image(spec.image):  # never an implicit pull: task_image pulls, on purpose
            raise SandboxError(f"image {spec.image} is not on the Docker daemon at {self.host}", "image")
        if spec.network == "allowlist":
            raise SandboxError(
                "the docker backend cannot enforce an egress allowlist; use no-network, or public for this task",
            )
        options: dict[str, Any] = {
            "name": f"runctl-{spec.sandbox_id}",
            "labels": {SANDBOX_LABEL: spec.sandbox_id, **spec.labels},
            "detach": True,
            "init": True,
            "network_mode": "none" if spec.network == "no-network" else None,
            "mem_limit": f"{spec.memory_mb}m",
            "memswap_limit": f"{spec.memory_mb}m",
            "nano_cpus": int(spec.cpus * 1e9),
            "pids_limit": spec.pids,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "read_only": spec.read_only_root,
            "working_dir": spec.workdir,
            "environment": spec.env,
        }
        if spec.binds:
            options["volumes"] = {
                host: {"bind": inside, "mode": "ro" if ro else "rw"} for host, inside, ro in spec.binds
            }
        if spec.read_only_root:
            options["tmpfs"] = {"/tmp": "mode=1777,size=256m", "/logs": "mode=0777,size=256m"}
        if spec.user:
            options["user"] = spec.user
        if spec.storage_mb and self.storage_limits:
            options["storage_opt"] = {"size": f"{spec.storage_mb}M"}
        try:
            container = self.client.containers.run(spec.image, IDLE_COMMAND, **options)
        except docker.errors.APIError as e:
            if "storage_opt" not in options or "storage-opt" not in str(e.explanation):
                raise SandboxError(f"cannot start a container from {spec.image}: {e.explanation}") from None
            # Only overlay2 on xfs with project quotas (and a few other drivers) can cap a container's disk.
            log.warning(
                "the Docker daemon at %s cannot limit container storage (%s): not enforced", self.host, e.explanation
            )
            self.storage_limits = False
            return self.create(spec)
        sandbox = Sandbox(spec.sandbox_id, self.name, container.id, spec)
        prepare = f"mkdir -p {quoted(spec.workdir)} /logs/agent /logs/verifier /logs/artifacts"
        result = self.exec(sandbox, prepare, 30, user="0")
        if result.exit_code != 0:
            self.destroy(sandbox)
            raise SandboxError(f"the sandbox could not make its folders: {result.stderr.strip()}")
        return sandbox

    def destroy(self, sandbox: Sandbox) -> None:
        self._remove(sandbox.handle)

    def halt_agent(self, sandbox: Sandbox) -> bool:
        """Kill every process of the sandbox but its init and idle loop, from the host, race-free: freeze the
        container (the cgroup freezer: nothing runs, so nothing forks), SIGKILL each process of its cgroup, thaw.
        However loaded the machine, a fork bomb cannot outrun this, where a sweep from inside the sandbox shares
        the bomb's CPU quota. When the freezer gives up (runc: "unable to freeze", seen with a fork bomb on a loaded
        host), the same is done with SIGSTOP from the host, pass after pass (a stopped process forks no more).
        Possible only when the daemon runs on this machine (its PIDs are ours); returns False otherwise, and the
        caller sweeps from inside."""
        import docker.errors

        try:
            init = int(self.client.api.inspect_container(sandbox.handle)["State"].get("Pid") or 0)
        except docker.errors.APIError:
            return False
        procs = _cgroup_procs(init, sandbox.handle)
        if procs is None:
            return False
        idle = _idle_loop(procs, init)
        if not self._freeze(sandbox):
            _stop_then_kill(procs, (init, idle))
            return True
        try:
            for pid in _pids(procs):
                if pid not in (init, idle):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)  # delivered when the container thaws
        finally:
            self.client.api.unpause(sandbox.handle)
        return True

    def _freeze(self, sandbox: Sandbox) -> bool:
        """Pause the container, trying a few times; False when the freezer keeps failing."""
        import docker.errors

        for attempt in range(FREEZE_ATTEMPTS):
            try:
                self.client.api.pause(sandbox.handle)
                return True
            except docker.errors.APIError as e:
                if attempt + 1 == FREEZE_ATTEMPTS:
                    log.warning(
                        "cannot freeze sandbox %s (%s): stopping its agent from the host", sandbox.sandbox_id, e
                    )
                else:
                    time.sleep(0.2)
        with contextlib.suppress(docker.errors.APIError):
            self.client.api.unpause(sandbox.handle)  # a freeze runc gave up on may have left it part-frozen
        return False

    def _remove(self, handle: str) -> None:
        import docker.errors

        try:
            self.client.api.remove_container(handle, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: removal already in progress
                raise SandboxError(f"cannot remove container {handle[:12]}: {e.explanation}") from None

    def list_owned(self, labels: dict[str, str] | None = None) -> list[OwnedSandbox]:
        wanted = [SANDBOX_LABEL] + [f"{key}={value}" for key, value in (labels or {}).items()]
        containers = self.client.api.containers(all=True, filters={"label": wanted})
        return [OwnedSandbox(c["Labels"][SANDBOX_LABEL], c["Id"], dict(c["Labels"])) for c in containers]

    def destroy_owned(self, owned: OwnedSandbox) -> None:
        self._remove(owned.handle)

    def owners(self) -> set[str]:
        """The service instances that own at least one container (the reaper asks which of them are alive)."""
        return {o.labels.get(OWNER_LABEL, "") for o in self.list_owned()}

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
        return self._timed_exec(sandbox.handle, command, timeout_s, user=user, env=env, workdir=workdir)

    def _run(
        self,
        handle: str,
        argv: list[str],
        timeout_s: float,
        *,
        stdin: bytes | None = None,
        user: str | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        limit: int = OUTPUT_LIMIT,
    ) -> tuple[int, Capture, Capture, bool]:
        """Run argv in the container; (exit code, stdout, stderr, timed out). Reads until EOF or the deadline."""
        import docker.errors

        api = self.client.api
        try:
            exec_id = api.exec_create(
                handle, argv, stdin=stdin is not None, user=user or "", environment=env, workdir=workdir
            )["Id"]
            raw = api.exec_start(exec_id, socket=True)
        except docker.errors.NotFound:
            raise SandboxError(f"container {handle[:12]} is gone") from None
        except docker.errors.APIError as e:
            raise SandboxError(f"exec in {handle[:12]} failed: {e.explanation}") from None
        sock: socket.socket = getattr(raw, "_sock", raw)
        out, err = Capture(limit), Capture(limit)
        try:
            if stdin is not None:
                sock.sendall(stdin)
                sock.shutdown(socket.SHUT_WR)
            finished = _demux_until(sock, time.monotonic() + timeout_s, out, err, _read_ahead(raw, sock))
        finally:
            sock.close()
            raw.close()
        if not finished:
            return 124, out, err, True
        code = api.exec_inspect(exec_id).get("ExitCode")
        return (code if isinstance(code, int) else -1), out, err, False


def _cgroup_procs(init: int, container_id: str) -> Path | None:
    """The ``cgroup.procs`` file of the container whose init has host PID ``init``, if that process is on this
    machine and is that container's (a remote daemon's PIDs mean nothing here). cgroup v1 (the pids hierarchy)
    or v2."""
    try:
        lines = Path(f"/proc/{init}/cgroup").read_text().splitlines() if init > 0 else []
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if container_id not in path:
            continue
        if controllers == "":
            candidate = Path("/sys/fs/cgroup") / path.lstrip("/") / "cgroup.procs"
        elif "pids" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/pids") / path.lstrip("/") / "cgroup.procs"
        else:
            continue
        if candidate.is_file():
            return candidate
    return None


FREEZE_ATTEMPTS = 3
STOP_PASSES = 500


def _pids(procs: Path) -> list[int]:
    try:
        return [int(p) for p in procs.read_text().split()]
    except OSError:
        return []


def _idle_loop(procs: Path, init: int) -> int | None:
    """The sandbox's idle loop: the child of its init that started first."""
    stats = {pid: stat for pid in _pids(procs) if (stat := _ppid_and_start(pid)) is not None}
    children = [pid for pid, (ppid, _) in stats.items() if ppid == init]
    return min(children, key=lambda pid: stats[pid][1]) if children else None


def _stop_then_kill(procs: Path, spared: tuple[int | None, ...]) -> None:
    """SIGSTOP every process of the cgroup but ``spared``, pass after pass until a pass finds none new (stopped
    processes do not fork), then SIGKILL them all (a stopped process dies of it)."""
    stopped: set[int] = set()
    for _ in range(STOP_PASSES):
        new = [pid for pid in _pids(procs) if pid not in spared and pid not in stopped]
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            stopped.add(pid)
    for pid in _pids(procs):
        if pid not in spared:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _ppid_and_start(pid: int) -> tuple[int, int] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def _read_ahead(raw: object, sock: socket.socket) -> bytes:
    """What of the exec's stream the HTTP client already read into its own buffer with the upgrade response: a
    command that answers fast (a small ``tar -c``, on a loaded machine) has its first bytes there, not on the socket
    read below, and they would be lost (seen as an empty archive)."""
    response = getattr(raw, "_response", None)
    reader = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    if reader is None or not hasattr(reader, "peek"):
        return b""
    chunks: list[bytes] = []
    sock.setblocking(False)  # peek answers from the buffer, or finds the socket empty without waiting
    try:
        while data := reader.peek(1 << 16):
            chunks.append(reader.read(len(data)))
    except (BlockingIOError, OSError, ValueError):
        pass
    finally:
        sock.setblocking(True)
    return b"".join(chunks)


def _demux_until(sock: socket.socket, deadline: float, out: Capture, err: Capture, buffer: bytes = b"") -> bool:
    """Read Docker's multiplexed exec stream (8-byte frame headers), after what was already read (``buffer``), until
    EOF (True) or the deadline (False)."""
    while True:
        while len(buffer) >= _HEADER.size:
            stream, size = _HEADER.unpack_from(buffer)
            if len(buffer) < _HEADER.size + size:
                break
            payload = buffer[_HEADER.size : _HEADER.size + size]
            buffer = buffer[_HEADER.size + size :]
            (err if stream == 2 else out).add(payload)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        ready, _, _ = select.select([sock], [], [], min(remaining, 1.0))
        if not ready:
            continue
        chunk = sock.recv(1 << 16)
        if not chunk:
            return True
        buffer += chunk
