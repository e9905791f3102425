"""A client of the sandbox service's request API on the bus: create, exec, upload, download and destroy a
sandbox, or run a whole trial, by NATS request/reply to the service's instances.

Runs do not use it: their runners open a backend themselves and book its sandboxes in the service's ledger
(``booked.py``). The service's tests and ``bench/sandbox.py`` drive the service through it, as any other worker
could. Errors the service reports come back as :class:`SandboxError` with the service's message and cause.
"""

from __future__ import annotations

import base64
import io
import json
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import nats.errors

from runctl.bus import Bus
from runctl.subjects import sandbox_subject
from services.sandbox.backends.base import CHUNK_BYTES, ExecResult, SandboxError
from services.sandbox.backends.files import extract_tar, tar_of
from services.sandbox.trial import TrialResult

#: Seconds a request may take beyond the work it asks for (transport, scheduling).
SLACK_S = 30.0


@dataclass(frozen=True)
class RemoteSandbox:
    sandbox_id: str
    instance: str
    backend: str


class SandboxBusClient:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def _request(self, subject: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        try:
            msg = await self.bus.nc.request(subject, json.dumps(body).encode(), timeout=timeout_s)
        except nats.errors.NoRespondersError:
            raise SandboxError(f"no sandbox service answers on {subject}: start it (runctl up)") from None
        except nats.errors.TimeoutError:
            raise SandboxError(f"the sandbox service did not answer {subject} within {timeout_s:.0f} s") from None
        reply: dict[str, Any] = json.loads(msg.data)
        if not reply.pop("ok", False):
            raise SandboxError(reply.get("error", "unknown error"), reply.get("cause", "sandbox"))
        return reply

    async def create(
        self,
        team: str,
        task_path: Path,
        backend: str = "local",
        *,
        run_id: str = "",
        trial: str = "",
        wait_s: float = 0,
    ) -> RemoteSandbox:
        body = {"team": team, "task_path": str(task_path), "backend": backend, "run_id": run_id, "trial": trial}
        reply = await self._request(sandbox_subject("create"), {**body, "wait_s": wait_s}, wait_s + 600)
        return RemoteSandbox(reply["sandbox_id"], reply["instance"], reply["backend"])

    async def exec(
        self,
        sandbox: RemoteSandbox,
        command: str,
        timeout_s: float,
        *,
        user: str | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        body: dict[str, Any] = {"sandbox_id": sandbox.sandbox_id, "command": command, "timeout_s": timeout_s}
        body |= {"user": user, "env": env, "workdir": workdir}
        reply = await self._request(sandbox_subject("exec", sandbox.instance), body, timeout_s + SLACK_S)
        return ExecResult(**reply)

    async def upload(self, sandbox: RemoteSandbox, source: Path, target: str) -> None:
        """Copy a local file or folder to ``target`` in the sandbox, as a tar archive sent in chunks."""
        data = tar_of(source, PurePosixPath(target).name)
        transfer = uuid.uuid4().hex
        subject = sandbox_subject("upload", sandbox.instance)
        chunks = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
        for index, chunk in enumerate(chunks):
            headers = {
                "Runctl-Sandbox": sandbox.sandbox_id,
                "Runctl-Target": target,
                "Runctl-Transfer": transfer,
                "Runctl-Last": "1" if index == len(chunks) - 1 else "0",
            }
            try:
                msg = await self.bus.nc.request(subject, chunk, timeout=300, headers=headers)
            except nats.errors.NoRespondersError:
                raise SandboxError(f"no sandbox service answers on {subject}") from None
            reply = json.loads(msg.data)
            if not reply.get("ok"):
                raise SandboxError(reply.get("error", "upload failed"), reply.get("cause", "sandbox"))

    async def download(self, sandbox: RemoteSandbox, source: str, target: Path) -> bool:
        """Copy a file or folder out of the sandbox to ``target``; False when it does not exist there."""
        body = {"sandbox_id": sandbox.sandbox_id, "source": source}
        reply = await self._request(sandbox_subject("download", sandbox.instance), body, 600)
        if not reply["found"]:
            return False
        parts = []
        subject = sandbox_subject("download_chunk", sandbox.instance)
        for index in range(reply["chunks"]):
            last = index == reply["chunks"] - 1
            chunk = await self._request(subject, {"transfer": reply["transfer"], "index": index, "last": last}, 120)
            parts.append(base64.b64decode(chunk["data"]))
        with tempfile.TemporaryDirectory(prefix="runctl-down-") as scratch:
            extract_tar(io.BytesIO(b"".join(parts)), Path(scratch), PurePosixPath(source).name, target)
        return True

    async def destroy(self, sandbox: RemoteSandbox) -> None:
        await self._request(sandbox_subject("destroy", sandbox.instance), {"sandbox_id": sandbox.sandbox_id}, 120)

    async def trial(
        self,
        team: str,
        task_path: Path,
        out_dir: Path,
        *,
        agent: str = "oracle",
        backend: str = "local",
        run_id: str = "",
        trial: str = "",
        wait_s: float = 0,
        timeout_s: float = 3600,
    ) -> TrialResult:
        body: dict[str, Any] = {"team": team, "task_path": str(task_path), "out_dir": str(out_dir), "agent": agent}
        body |= {"backend": backend, "run_id": run_id, "trial": trial, "wait_s": wait_s}
        reply = await self._request(sandbox_subject("trial"), body, wait_s + timeout_s + SLACK_S)
        return TrialResult.model_validate(reply["result"])
