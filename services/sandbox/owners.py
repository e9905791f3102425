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
TEAM_LABEL, RUN_LABEL, TRIAL_LABEL, SCOPE_LABEL = "runctl.team", "runctl.run", "runctl.trial", "runctl.scope"


def instance_name() -> str:
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:24]
    return f"{host}-{os.getpid()}-{secrets.token_hex(2)}"
