"""Files in and out of a sandbox as tar streams through exec, for backends whose exec takes stdin (docker,
kubernetes): ``tar -x`` reads the upload from stdin, ``tar -c`` writes the download to stdout. It works on
read-only roots and tmpfs mounts, and needs ``sh`` and ``tar`` in the image."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any

from services.sandbox.backends.base import OUTPUT_LIMIT, Sandbox, SandboxError
from services.sandbox.backends.execio import Capture, quoted
from services.sandbox.backends.files import extract_tar, tar_of

FILE_TIMEOUT_S = 300
DOWNLOAD_LIMIT = 1 << 30
MISSING = 3


class TarOverExec:
    #: Extra options for the file-moving execs (the docker backend runs them as root).
    file_exec_options: dict[str, Any] = {}

    def _run(
        self, handle: str, argv: list[str], timeout_s: float, *, stdin: bytes | None = None, limit: int = OUTPUT_LIMIT
    ) -> tuple[int, Capture, Capture, bool]:
        raise NotImplementedError

    def upload(self, sandbox: Sandbox, source: Path, target: str) -> None:
        parent, name = os.path.split(target.rstrip("/"))
        data = tar_of(source, name)
        command = f"mkdir -p {quoted(parent or '/')} && tar -xf - -C {quoted(parent or '/')}"
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
