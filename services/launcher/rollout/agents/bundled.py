"""What the scaffolds whose agent comes in a bundle (``runctl.bundles``) share: the bundle bound read-only at
``/runctl/bundle``, the relay to the proxy session on the bundle's own Python (``installed.py``; the bundle's
library folder on the loader's path for its Python processes only, which clear it before they start the agent's
commands), a home folder in the sandbox's ``/tmp``, and the file the agent leaves saying how it ended, read back
once it exits."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runctl.bundles import MOUNT, Bundle
from services.launcher.rollout.agents.installed import InstalledAgent
from services.sandbox.library import AgentOutcome, Backend, Sandbox


@dataclass(frozen=True)
class Budget:
    """What a run allows each trial's agent, which each scaffold maps onto its own settings."""

    max_turns: int
    """AGENT_MAX_ITERATIONS."""
    temperature: float
    max_tokens: int | None
    """The run's response length (None: the agent's own default)."""
    max_context_tokens: int | None
    """The context the model serves (None: not known to the run)."""


class BundledAgent(InstalledAgent):
    #: Where the agent (or its driver) writes how it ended, inside the sandbox.
    outcome_file = ""

    def __init__(self, bundle: Bundle, session_path: str, model: str, socket_dir: Path, env: dict[str, str]) -> None:
        self.bundle = bundle
        own = {"PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        binds = ((str(bundle.path), MOUNT, True),)
        super().__init__(
            "", session_path, model, socket_dir, bundle.python, False, binds=binds, env={**own, "HOME": "/tmp", **env}
        )

    def python_command(self) -> str:
        """The bundle's Python with its library folder (``libpython`` and the libraries the bundle carries) on the
        loader's path — for it alone: the commands an agent runs keep the image's own libraries."""
        return f"env LD_LIBRARY_PATH={shlex.quote(self.bundle.python_lib)} {shlex.quote(self.bundle.python)}"

    def read_outcome(self, backend: Backend, sandbox: Sandbox) -> dict[str, Any] | None:
        """What the agent left in :attr:`outcome_file` (None: nothing readable)."""
        read = backend.exec(sandbox, f"cat {self.outcome_file} 2>/dev/null", 30)
        try:
            found = json.loads(read.stdout) if read.exit_code == 0 and read.stdout.strip() else None
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    def outcome(self, ended: dict[str, Any] | None, exit_code: int) -> AgentOutcome:
        raise NotImplementedError

    def ended(self, backend: Backend, sandbox: Sandbox, exit_code: int) -> AgentOutcome:
        return self.outcome(self.read_outcome(backend, sandbox), exit_code)
