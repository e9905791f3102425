"""Lifecycle events: the CloudEvents envelope, one payload model per event, and the run state machine.

Names are loaded on first use (PEP 562): a process that needs one model (`runctl validate` needs CheckResult)
does not build the whole catalogue.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runctl.events.checks import CheckResult
    from runctl.events.envelope import Event, new_event, parse_event
    from runctl.events.payloads import (
        BY_NAME,
        BY_TYPE,
        PAYLOADS,
        PHASES,
        RUNS_STREAM,
        TRIALS_STREAM,
        CancelRequested,
        CheckpointSaved,
        ClusterReady,
        ConfigRejected,
        ConfigSubmitted,
        ConfigValidated,
        EvalRequested,
        Payload,
        PhaseStarted,
        PluginFailed,
        ReplicasReady,
        RunAdmitted,
        RunCancelled,
        RunFailed,
        RunQueued,
        RunSucceeded,
        SandboxCreated,
        SandboxDestroyed,
        StepDone,
        TrialFinished,
    )
    from runctl.events.state import TERMINAL, RunState, next_state

__all__ = [
    "BY_NAME",
    "BY_TYPE",
    "PAYLOADS",
    "PHASES",
    "RUNS_STREAM",
    "TERMINAL",
    "TRIALS_STREAM",
    "CancelRequested",
    "CheckResult",
    "CheckpointSaved",
    "PluginFailed",
    "ClusterReady",
    "ConfigRejected",
    "ConfigSubmitted",
    "ConfigValidated",
    "EvalRequested",
    "Event",
    "Payload",
    "PhaseStarted",
    "ReplicasReady",
    "RunAdmitted",
    "RunCancelled",
    "RunFailed",
    "RunQueued",
    "RunState",
    "RunSucceeded",
    "SandboxCreated",
    "SandboxDestroyed",
    "StepDone",
    "TrialFinished",
    "new_event",
    "next_state",
    "parse_event",
]

_HOME = {name: "payloads" for name in __all__}
_HOME.update({"Event": "envelope", "new_event": "envelope", "parse_event": "envelope"})
_HOME.update({"TERMINAL": "state", "RunState": "state", "next_state": "state", "CheckResult": "checks"})


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"runctl.events.{home}"), name)
    globals()[name] = value
    return value
