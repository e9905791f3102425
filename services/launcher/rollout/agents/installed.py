"""Installed agents (``SCAFFOLD=installed``): a program inside the sandbox, started with ``AGENT_COMMAND``, that
calls the model through its trial's proxy session like any OpenAI or Anthropic client would.

The sandbox keeps its network off. The runner's proxy also listens on a Unix socket; a small relay (``relay.py``,
standard library only) listens on ``127.0.0.1:RELAY_PORT`` inside the sandbox and carries each connection to that
socket. On a backend that binds the runner's folders (local, Docker) the socket's folder is bound at
``/runctl/proxy`` and the relay starts in the same command as the agent; on one that binds nothing (kubernetes) the
relay runs in an exec of its own whose stdin and stdout carry the connections to the runner (``tunnel.py``), which
dials the socket. So the agent reaches the proxy — its own session, under an unguessable token — and nothing else.

The agent gets, in its environment: ``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL`` (its session), ``OPENAI_API_KEY``
/ ``ANTHROPIC_API_KEY`` (placeholders: the session token is the credential), ``RUNCTL_MODEL`` (the served model's
name), ``RUNCTL_INSTRUCTION_FILE`` (the task's instruction) and ``RUNCTL_PYTHON`` (a Python to run the relay
with). On the local backend the runner's own Python environment is bound read-only at its own path, so
``$RUNCTL_PYTHON`` has the ``openai`` and ``anthropic`` SDKs; on Docker the image must bring its own ``python3``.
Its output goes to ``/logs/agent/installed.txt``.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from runctl.tasks import Task
from services.launcher.rollout.agents.tunnel import Tunnel
from services.sandbox.library import AgentOutcome, Attachable, Backend, Sandbox

RELAY_PORT = 8377
#: The agents that run inside the sandbox and reach the proxy through the relay (the rest call it from the runner).
IN_SANDBOX = ("installed", "mswea", "cc", "oc", "ohsdk")
SOCKET_DIR_INSIDE = "/runctl/proxy"
AGENT_DIR_INSIDE = "/runctl/agent"
SOCKET_NAME = "proxy.sock"


def python_binds() -> tuple[tuple[str, str, bool], ...]:
    """This process's Python environment and its base interpreter, read-only at their own paths."""
    prefixes = dict.fromkeys([sys.prefix, sys.base_prefix])
    return tuple((p, p, True) for p in prefixes)


class InstalledAgent:
    name = "installed"

    def __init__(
        self,
        command: str,
        session_path: str,
        model: str,
        socket_dir: Path,
        python: str,
        local_backend: bool,
        binds: tuple[tuple[str, str, bool], ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.command = command
        self.session_path = session_path  # /sess/<token>
        self.model = model
        self.python = python
        self.socket_dir = socket_dir
        self.own_binds = binds + (python_binds() if local_backend and not binds else ())
        self.env = env or {}

    def binds_for(self, backend: Backend) -> tuple[tuple[str, str, bool], ...]:
        """What the sandbox binds: the proxy socket's folder (read-only), unless the relay's connections travel over
        an exec stream on this backend, and the agent's own (its bundle)."""
        if isinstance(backend, Attachable):
            return self.own_binds
        return ((str(self.socket_dir), SOCKET_DIR_INSIDE, True), *self.own_binds)

    def setup(self, backend: Backend, sandbox: Sandbox, task: Task) -> None:
        here = Path(__file__).parent
        backend.upload(sandbox, here / "relay.py", f"{AGENT_DIR_INSIDE}/relay.py")
        backend.upload(sandbox, task.path / "instruction.md", f"{AGENT_DIR_INSIDE}/instruction.md")

    def python_command(self) -> str:
        """How the relay's Python is started (a bundle's runtime needs its library path)."""
        return shlex.quote(self.python)

    def ended(self, backend: Backend, sandbox: Sandbox, exit_code: int) -> AgentOutcome:
        """How a run of the command that exited with ``exit_code`` (not timed out, its relay up) ended."""
        if exit_code != 0:
            return AgentOutcome("error", ("agent", f"the installed agent exited with code {exit_code}"))
        return AgentOutcome("agent_completed")

    def run(self, backend: Backend, sandbox: Sandbox, task: Task, timeout_s: float) -> AgentOutcome:
        base = f"http://127.0.0.1:{RELAY_PORT}{self.session_path}"
        env = {
            **self.env,
            "OPENAI_BASE_URL": base + "/v1",
            "ANTHROPIC_BASE_URL": base,
            "OPENAI_API_KEY": "runctl-session",
            "ANTHROPIC_API_KEY": "runctl-session",
            "RUNCTL_MODEL": self.model,
            "RUNCTL_INSTRUCTION_FILE": f"{AGENT_DIR_INSIDE}/instruction.md",
            "RUNCTL_PYTHON": self.python,
        }
        ready = "/tmp/.runctl-relay-ready"
        relay = f"{self.python_command()} {AGENT_DIR_INSIDE}/relay.py 127.0.0.1:{RELAY_PORT}"
        wait = (
            f"i=0; while [ ! -e {ready} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done; "
            f"[ -e {ready} ] || {{ echo 'the relay to the proxy did not start' >&2; exit 97; }}; "
        )
        agent = f"( {self.command} ) > /logs/agent/installed.txt 2>&1"
        if isinstance(backend, Attachable):
            # The relay's stdin and stdout are the tunnel: its errors go to its log, as on the other backends.
            stream = backend.attach(sandbox, ["sh", "-c", f"exec {relay} - {ready} 2>/logs/agent/relay.txt"])
            with Tunnel(stream, self.socket_dir / SOCKET_NAME):
                result = backend.exec(sandbox, wait + agent, timeout_s, user=task.config.agent.user, env=env)
        else:
            start = f"{relay} {SOCKET_DIR_INSIDE}/{SOCKET_NAME} {ready} 2>/logs/agent/relay.txt & relay=$!; "
            script = start + wait + f"{agent}; rc=$?; kill $relay 2>/dev/null; exit $rc"
            result = backend.exec(sandbox, script, timeout_s, user=task.config.agent.user, env=env)
        if result.timed_out:
            return AgentOutcome("timeout", ("agent_budget", f"the installed agent ran past {timeout_s:.0f} s"))
        if result.exit_code == 97:
            return AgentOutcome("env_setup_failed", ("sandbox", result.stderr.strip() or "the relay did not start"))
        return self.ended(backend, sandbox, result.exit_code)
