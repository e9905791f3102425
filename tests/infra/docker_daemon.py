"""A real Docker Engine for the tests: the one at $DOCKER_HOST, or a dockerd this module starts and stops.

The daemon runs with no bridge and no iptables rules (containers use ``--network none``), with its data and
exec roots in a temp folder. Images cannot be pulled here, so :func:`ensure_base_image` makes ``runctl-base``
from the host's static busybox with ``docker import``.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import requests

from runctl.probe import socket_unreachable
from tests.conftest import wait_until
from tests.infra.shared import ENV as SHARED_ENV
from tests.infra.shared import locked

BASE_IMAGE = "runctl-base:latest"
BUSYBOX = Path("/bin/busybox")
START_TIMEOUT_S = 60
#: The dockerd processes this process started for the run (shared_daemon), by PID.
_STARTED: dict[int, subprocess.Popen[bytes]] = {}
CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class DockerDaemon:
    host: str
    """DOCKER_HOST for clients: unix:///…/docker.sock."""
    started_here: bool


def answers(host: str) -> bool:
    if socket_unreachable(host):
        return False
    try:
        client = docker.DockerClient(base_url=host, timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (docker.errors.DockerException, requests.RequestException):
        return False


def why_unavailable() -> str | None:
    """None when a daemon can be had here; else the reason (a test skip message)."""
    host = os.environ.get("DOCKER_HOST")
    if host and answers(host):
        return None
    if shutil.which("dockerd") is None:
        return "no Docker daemon: install docker.io (apt) or set DOCKER_HOST"
    if os.geteuid() != 0:
        return "dockerd needs root to start here; set DOCKER_HOST to a running daemon"
    return None


@contextmanager
def docker_daemon() -> Iterator[DockerDaemon]:
    """The daemon at $DOCKER_HOST when it answers; else start one, and stop it (by its PID) on exit."""
    host = os.environ.get("DOCKER_HOST")
    if host and answers(host):
        yield DockerDaemon(host, started_here=False)
        return
    root = Path(tempfile.mkdtemp(prefix="rdk-", dir="/tmp"))
    proc, host = _start_dockerd(root)
    try:
        _wait_for(proc, host, root)
        yield DockerDaemon(host, started_here=True)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def _start_dockerd(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """dockerd with its socket, data, exec root and log in ``root``, in a session of its own; and its DOCKER_HOST."""
    host = f"unix://{root}/docker.sock"
    args = ["dockerd", "-H", host, "--data-root", f"{root}/data", "--exec-root", f"{root}/exec"]
    args += ["--pidfile", f"{root}/docker.pid", "--iptables=false", "--ip-masq=false", "--bridge=none"]
    with (root / "dockerd.log").open("wb") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), host


def _wait_for(proc: subprocess.Popen[bytes], host: str, root: Path) -> None:
    wait_until(lambda: proc.poll() is not None or answers(host), START_TIMEOUT_S, "dockerd to answer")
    if proc.poll() is not None:
        raise RuntimeError(f"dockerd exited with {proc.returncode}: {(root / 'dockerd.log').read_text()[-2000:]}")


def shared_daemon(shared: Path) -> str:
    """DOCKER_HOST of the one daemon every worker of this pytest run shares, with ``runctl-base`` on it: $DOCKER_HOST
    when it answers, else a dockerd the first worker to ask starts (under a lock in ``shared``, the run's folder) and
    :func:`stop_shared` stops when the run ends. One daemon, one data root and one image for the whole run: two
    daemons on one machine would each import the image and each keep a containerd."""
    host = os.environ.get("DOCKER_HOST")
    if host and answers(host):
        ensure_base_image(host)
        return host
    with locked(shared / "dockerd.lock"):
        recorded = shared / "dockerd.host"
        if recorded.exists() and answers(host := recorded.read_text()):
            return host
        root = shared / "dockerd"
        root.mkdir(exist_ok=True)
        proc, host = _start_dockerd(root)  # in a session of its own: it outlives its worker, until stop_shared
        _STARTED[proc.pid] = proc  # kept: a Popen collected while its process runs is an error under -W error
        (shared / "dockerd.pid").write_text(str(proc.pid))
        _wait_for(proc, host, root)
        ensure_base_image(host)
        recorded.write_text(host)
        return host


@contextmanager
def daemon_network() -> Iterator[None]:
    """Sockets made in the block are made in the shared dockerd's network namespace, for a server the daemon itself
    must reach (a registry): the daemon was started by whichever worker asked first, in that worker's loopback-only
    namespace (tests/infra/worker-python), whose 127.0.0.1 is not this worker's. The calling thread joins that
    namespace for the block and returns to its own; a no-op without a shared daemon of this run."""
    folder = os.environ.get(SHARED_ENV)
    try:
        pid = int((Path(folder) / "dockerd.pid").read_text()) if folder else 0
    except (OSError, ValueError):
        pid = 0
    if not pid:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/thread-self/ns/net") as own, open(f"/proc/{pid}/ns/net") as theirs:
        if libc.setns(theirs.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"cannot join the network namespace of dockerd (PID {pid})")
        try:
            yield
        finally:
            if libc.setns(own.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "cannot return to this thread's network namespace")


def stop_shared(shared: Path) -> None:
    """Stop the run's shared dockerd (by the PID :func:`shared_daemon` recorded), if one was started."""
    try:
        pid = int((shared / "dockerd.pid").read_text())
    except (OSError, ValueError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    ours = _STARTED.pop(pid, None)
    if ours is not None:  # started by this process (no xdist): reap it; a worker's child is reaped by init
        ours.wait(10)
    shutil.rmtree(shared / "dockerd", ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


#: glibc's own files, as an image of a glibc distribution has them (and no other library): what an agent bundle needs.
GLIBC_FILES = ("ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
               "libresolv.so.2", "libutil.so.1")  # fmt: skip
GLIBC_IMAGE = "runctl-glibc:latest"


def busybox_rootfs_tar(glibc: bool = False) -> bytes:
    """A root filesystem: static busybox, a symlink per applet, a ``bash`` that runs busybox's ash, and /tmp; with
    ``glibc``, this machine's glibc too (its loader at /lib64, its libraries in /lib/x86_64-linux-gnu)."""
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for folder, mode in (("bin", 0o755), ("tmp", 0o1777), ("app", 0o755), ("logs", 0o755), ("etc", 0o755)):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        tar.add(BUSYBOX, "bin/busybox")
        for applet in applets:
            if applet != "busybox" and "/" not in applet:
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(link)
        files = {
            "bin/bash": (b'#!/bin/sh\nexec /bin/ash "$@"\n', 0o755),
            "etc/passwd": (b"root:x:0:0::/root:/bin/sh\n", 0o644),
        }
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        if glibc:
            for name in GLIBC_FILES:
                tar.add(Path("/lib/x86_64-linux-gnu") / name, f"lib/x86_64-linux-gnu/{name}")
            loader = tarfile.TarInfo("lib64/ld-linux-x86-64.so.2")
            loader.type, loader.linkname = tarfile.SYMTYPE, "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
            tar.addfile(loader)
    return buffer.getvalue()


def ensure_base_image(host: str, image: str = BASE_IMAGE) -> str:
    """``runctl-base:latest`` (or ``runctl-glibc:latest``, with glibc) on the daemon, imported from busybox when
    missing; returns its name."""
    client = docker.DockerClient(base_url=host, timeout=60)
    try:
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            repository, tag = image.split(":")
            rootfs = busybox_rootfs_tar(glibc=image == GLIBC_IMAGE)
            client.api.import_image_from_data(rootfs, repository=repository, tag=tag)
        return image
    finally:
        client.close()
