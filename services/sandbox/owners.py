"""Who owns a sandbox, shared by the service's instances and the runners that book sandboxes in its ledger.

Every owner (a service instance, a runner) heart-beats ``owner.<name>`` every ``HEARTBEAT_S``; the reaper treats an
owner silent for ``STALE_S`` as dead and destroys its sandboxes. Each sandbox carries its team, run, trial and scope
as labels.
"""

from __future__ import annotations

import os
import re
import secrets
import socket

HEARTBEAT_S = 2.0
STALE_S = 10.0
REAP_EVERY_S = 5.0
DEFAULT_TEAM_CAP = 64
TEAM_LABEL, RUN_LABEL, TRIAL_LABEL, SCOPE_LABEL = "runctl.team", "runctl.run", "runctl.trial", "runctl.scope"


def instance_name() -> str:
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:24]
    return f"{host}-{os.getpid()}-{secrets.token_hex(2)}"


def team_caps(text: str) -> dict[str, int]:
    """``nlp=8,vision=4`` → caps per team."""
    caps: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        team, _, cap = item.partition("=")
        caps[team.strip()] = int(cap)
    return caps


def team_cap_from_env(team: str) -> int:
    """The team's cap as the deployment sets it (``RUNCTL_SANDBOX_CAPS``, else ``RUNCTL_SANDBOX_DEFAULT_CAP``): the
    service and the runners read the same settings."""
    caps = team_caps(os.environ.get("RUNCTL_SANDBOX_CAPS", ""))
    return caps.get(team, int(os.environ.get("RUNCTL_SANDBOX_DEFAULT_CAP", DEFAULT_TEAM_CAP)))


def scope_from_env() -> str:
    """The label that tells this deployment's sandboxes from another's (``RUNCTL_SANDBOX_SCOPE``)."""
    return os.environ.get("RUNCTL_SANDBOX_SCOPE", "default")
