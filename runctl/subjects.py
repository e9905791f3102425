"""Every NATS subject, stream and bucket name runctl uses. Services never format a subject themselves.

Run events:   ``runctl.<team>.<run_id>.<event>``, e.g. ``runctl.nlp.swe-grpo-20261130-1a2b.checkpoint.saved``.
System:       ``_runctl.<…>`` (service health, dead letters, tracker notices) — outside every team's namespace.
"""

from __future__ import annotations

import re

from runctl.errors import EventError

PREFIX = "runctl"
SYSTEM_PREFIX = "_runctl"
DEADLETTER_STREAM = "DEADLETTER"

_TOKEN = re.compile(r"[A-Za-z0-9_-]+")


def _token(value: str, what: str) -> str:
    if not _TOKEN.fullmatch(value):
        raise EventError(
            f"{what} {value!r} cannot be a subject token: use letters, digits, '-' and '_' only "
            "(no dots, spaces or wildcards)."
        )
    return value


def event_subject(team: str, run_id: str, event_name: str) -> str:
    """The subject an event of this run is published on."""
    return f"{PREFIX}.{_token(team, 'team')}.{_token(run_id, 'run id')}.{event_name}"


def parse_event_subject(subject: str) -> tuple[str, str, str]:
    """Split a run event subject into (team, run_id, event_name).

    Raises:
        EventError: the subject is not a run event subject.
    """
    parts = subject.split(".", 3)
    if len(parts) != 4 or parts[0] != PREFIX:
        raise EventError(f"{subject!r} is not a runctl run-event subject (runctl.<team>.<run_id>.<event>).")
    return parts[1], parts[2], parts[3]


def event_filter(event_name: str, team: str = "*", run_id: str = "*") -> str:
    """A subject filter for one kind of event, optionally for one team or run."""
    return f"{PREFIX}.{team}.{run_id}.{event_name}"


def run_filter(run_id: str, team: str = "*") -> str:
    """Every event of one run."""
    return f"{PREFIX}.{team}.{_token(run_id, 'run id')}.>"


def team_filter(team: str) -> str:
    """Everything a team may publish and read (the per-team permission in deploy/nats/)."""
    return f"{PREFIX}.{_token(team, 'team')}.>"


def team_stream(family: str, team: str) -> str:
    """The stream that keeps one team's events of a family (``RUNS`` or ``TRIALS``): ``RUNS_<team>``. Each team's
    events are stored, bounded and de-duplicated in streams of their own, so no team's volume or event ids touch
    another's."""
    return f"{family}_{_token(team, 'team')}"


def stream_team(name: str, family: str) -> str | None:
    """The team whose stream of ``family`` this is, or None for any other stream."""
    head, sep, team = name.partition("_")
    return team if head == family and sep and _TOKEN.fullmatch(team) else None


def health_subject(service: str) -> str:
    """Request/reply subject on which a service answers health probes."""
    return f"{SYSTEM_PREFIX}.health.{_token(service, 'service')}"


def deadletter_subject(consumer: str) -> str:
    """Where a consumer parks messages it could not process after its redeliveries."""
    return f"{SYSTEM_PREFIX}.dlq.{_token(consumer, 'consumer')}"


def deadletter_filter() -> str:
    return f"{SYSTEM_PREFIX}.dlq.>"


def persisted_subject() -> str:
    """Core-NATS notice the tracker sends after each committed batch (ids and commit time)."""
    return f"{SYSTEM_PREFIX}.tracker.persisted"


def kv_bucket(name: str) -> str:
    """Name of a JetStream key-value bucket runctl owns."""
    return f"runctl_{_token(name, 'bucket')}"


def desk_subject(team: str, run_id: str, op: str) -> str:
    """Request/reply subject of the launcher's desk for one run: ``_runctl.desk.<team>.<run_id>.<op>``. A runner asks
    there for what it keeps outside its events (its ledger entry, its checkpoints' evals, its sandboxes' seats); its
    bus login may publish on its own run's desk and events only."""
    return f"{desk_prefix(team, run_id)}.{_token(op, 'operation')}"


def desk_prefix(team: str, run_id: str) -> str:
    return f"{SYSTEM_PREFIX}.desk.{_token(team, 'team')}.{_token(run_id, 'run id')}"


def desk_filter() -> str:
    """Every run's desk subjects (what the launcher answers)."""
    return f"{SYSTEM_PREFIX}.desk.*.*.*"


def sandbox_subject(op: str, instance: str | None = None) -> str:
    """Request/reply subject of the sandbox service: ``_runctl.sandbox.<op>`` (any instance, a queue group) or
    ``_runctl.sandbox.at.<instance>.<op>`` (the instance that holds the sandbox)."""
    if instance is None:
        return f"{SYSTEM_PREFIX}.sandbox.{_token(op, 'operation')}"
    return f"{SYSTEM_PREFIX}.sandbox.at.{_token(instance, 'instance')}.{_token(op, 'operation')}"
