"""The run state machine: a pure function from (state, event) to the next state.

    submitted → validated | rejected → queued → admitted → starting → running → succeeded | failed | cancelled

It is idempotent (applying an event twice changes nothing more) and never moves a run backwards: a late or
repeated event that would lower the state is ignored, and a terminal state is final.
"""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    SUBMITTED = "submitted"
    VALIDATED = "validated"
    REJECTED = "rejected"
    QUEUED = "queued"
    ADMITTED = "admitted"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({RunState.REJECTED, RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})

_RANK = {
    RunState.SUBMITTED: 0,
    RunState.VALIDATED: 1,
    RunState.QUEUED: 2,
    RunState.ADMITTED: 3,
    RunState.STARTING: 4,
    RunState.RUNNING: 5,
}

_TARGET: dict[str, RunState] = {
    "config.submitted": RunState.SUBMITTED,
    "config.validated": RunState.VALIDATED,
    "config.rejected": RunState.REJECTED,
    "run.queued": RunState.QUEUED,
    "run.admitted": RunState.ADMITTED,
    "cluster.ready": RunState.STARTING,
    "replicas.ready": RunState.STARTING,
    "trial.finished": RunState.RUNNING,
    "step.done": RunState.RUNNING,
    "checkpoint.saved": RunState.RUNNING,
    "run.succeeded": RunState.SUCCEEDED,
    "run.failed": RunState.FAILED,
    "run.cancelled": RunState.CANCELLED,
}
_RUNNING_PHASES = frozenset({"loop", "outputs"})


def target_state(event_name: str, phase: str | None = None) -> RunState | None:
    """The state an event announces, or None for events that do not change the state (cancel.requested …)."""
    if event_name == "phase.started":
        return RunState.RUNNING if phase in _RUNNING_PHASES else RunState.STARTING
    return _TARGET.get(event_name)


def next_state(current: RunState | None, event_name: str, phase: str | None = None) -> RunState | None:
    """Apply one event to a run's state.

    Args:
        current: the state so far; None before any event.
        event_name: the event's short name (``run.admitted``).
        phase: for ``phase.started``, the phase it names.

    Returns:
        The new state: never lower in rank than ``current``, and unchanged once terminal.
    """
    target = target_state(event_name, phase)
    if target is None:
        return current
    if current is None:
        return target
    if current in TERMINAL:
        return current
    if target in TERMINAL:
        return target
    return target if _RANK[target] > _RANK[current] else current
