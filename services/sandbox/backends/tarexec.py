"""What backends whose sandboxes are long-lived containers (docker, kubernetes) build on their raw ``_run``:
commands with a hard timeout that kills inside the sandbox, and files as tar streams through exec (``tar -x``
reads the upload from stdin, ``tar -c`` writes the download to stdout), which works on read-only roots and tmpfs
mounts, and needs ``sh`` and ``tar`` in the image."""

from __future__ import annotations

import io
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from services.sandbox.backends.base import ExecResult, Sandbox, SandboxError
from services.sandbox.backends.execio import Capture, exec_result, kill_tree_argv, quoted, split_pid, wrapped
from services.sandbox.backends.files import extract_tar, tar_of

FILE_TIMEOUT_S = 300
KILL_GRACE_S = 10.0
DOWNLOAD_LIMIT = 1 << 30
MISSING = 3


class TarOverExec:
    #: Extra options for the file-moving execs (the docker backend runs them as root).
    file_exec_options: dict[str, Any] = {}

    #: argv in the sandbox: (exit code, stdout, stderr, timed out), reading until EOF or the deadline. Keyword
    #: arguments: ``stdin`` (bytes), ``limit`` (bytes kept per stream), and the backend's own exec options.
    _run: Callable[..., tuple[int, Capture, Capture, bool]]

    def _timed_exec(self, handle: str, command: str, timeout_s: float, **options: Any) -> ExecResult:
        """Run ``command`` under the PID-reporting wrapper; on timeout kill its tree inside the sandbox."""
        started = time.monotonic()
        code, out, err, timed_out = self._run(handle, wrapped(command), timeout_s, **options)
        pid, stderr = split_pid(bytes(err.data))
        if timed_out and pid is not None:
            self._run(handle, kill_tree_argv(pid), KILL_GRACE_S, **self.file_exec_options)
        return exec_result(code, out, err, stderr, timed_out, started)

    def upload(self, sandbox: Sandbox, source: Path, target: str) -> None:
        """Unpack into a fresh folder beside the target, then rename it into place: whatever the agent left at
        the target (a link, files of its own in a folder) is removed first, never unpacked through or merged."""
        parent, name = os.path.split(os.path.normpath(target))
        if not name or name == "..":
            raise SandboxError(f"cannot upload to {target}: name a path below / in the sandbox")
        data = tar_of(source, name)
        parent, where = parent or "/", quoted(os.path.join(parent or "/", name))
        # Each folder on the way: a link or a file there is replaced by a folder, never followed.
        names = PurePosixPath(parent).parts[1:]
        folders = ["/" + "/".join(names[: i + 1]) for i in range(len(names))]
        command = (
            'set -e; d() { if [ -L "$1" ] || { [ -e "$1" ] && [ ! -d "$1" ]; }; then rm -f -- "$1"; fi; '
            '[ -d "$1" ] || mkdir -- "$1"; }; '
            + "".join(f"d {quoted(folder)}; " for folder in folders)
            + f"s=$(mktemp -d {quoted(os.path.join(parent, '.runctl-up.XXXXXX'))}); "
            f'trap \'rm -rf -- "$s"\' EXIT; tar -xf - -C "$s"; rm -rf -- {where}; mv -- "$s"/{quoted(name)} {where}'
        )
        code, _, err, timed_out = self._run(
            sandbox.handle, ["sh", "-c", command], FILE_TIMEOUT_S, stdin=data, **self.file_exec_options
        )
        if code != 0 or timed_out:
            raise SandboxError(f"upload of {source} to {target} failed: {bytes(err.data).decode(errors='replace')}")

    def download(self, sandbox: Sandbox, source: str, target: Path) -> bool:
        parent, name = os.path.split(source.rstrip("/"))
        command = f"[ -e {quoted(source)} ] || exit {MISSING}; tar -cf - -C {quoted(parent or '/')} {quoted(name)}"
        code, out, err, timed_out = self._run(
            sandbox.handle, ["sh", "-c", command], FILE_TIMEOUT_S, limit=DOWNLOAD_LIMIT, **self.file_exec_options
        )
        if code == MISSING:
            return False
        if code != 0 or timed_out:
            raise SandboxError(f"download of {source} failed: {bytes(err.data).decode(errors='replace')}")
        with tempfile.TemporaryDirectory() as scratch:
            extract_tar(io.BytesIO(bytes(out.data)), Path(scratch), name, target)
        return True
