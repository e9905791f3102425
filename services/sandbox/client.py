"""The sandbox service's client: what a runner (or any worker) uses to get sandboxes and run trials over the bus.

Errors the service reports come back as :class:`SandboxError` with the service's message and cause.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats.errors

from runctl.bus import Bus
from runctl.subjects import sandbox_subject
from services.sandbox.backends.base import ExecResult, SandboxError
from services.sandbox.trial import TrialResult

#: Seconds a request may take beyond the work it asks for (transport, scheduling).
SLACK_S = 30.0


@dataclass(frozen=True)
class RemoteSandbox:
    sandbox_id: str
    instance: str
    backend: str


class SandboxClient:
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
