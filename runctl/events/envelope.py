"""The CloudEvents 1.0 envelope (JSON format) around every runctl payload, and the one parser for them all."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SerializeAsAny, ValidationError

from runctl.errors import EventError
from runctl.events.payloads import BY_TYPE, Payload
from runctl.subjects import event_subject


class Event(BaseModel):
    """A CloudEvent carrying a typed runctl payload; ``team`` and ``runid`` are extension attributes."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")
    specversion: Literal["1.0"] = "1.0"
    id: str
    source: str
    type: str
    time: datetime
    subject: str
    datacontenttype: Literal["application/json"] = "application/json"
    team: str
    runid: str
    data: SerializeAsAny[Payload]

    @property
    def name(self) -> str:
        """The event's short name, e.g. ``checkpoint.saved``."""
        return self.data.event_name

    @property
    def nats_subject(self) -> str:
        return event_subject(self.team, self.runid, self.name)

    @property
    def stream(self) -> str:
        return self.data.stream

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


def new_event(
    payload: Payload,
    *,
    team: str,
    run_id: str,
    source: str,
    event_id: str | None = None,
    time: datetime | None = None,
) -> Event:
    """Wrap a payload in its envelope.

    Args:
        payload: the typed payload.
        team: owning team.
        run_id: the run the event is about (also the CloudEvents ``subject``).
        source: who publishes, as a URI reference (``/runctl/launcher``).
        event_id: a deterministic id when the publisher may repeat itself (after a restart), so that
            JetStream's duplicate window and every consumer drop the repeat; a random id otherwise.
        time: when it happened; now by default.
    """
    return Event(
        id=event_id or uuid.uuid4().hex,
        source=source,
        type=payload.type_string(),
        time=time or datetime.now(UTC),
        subject=run_id,
        team=team,
        runid=run_id,
        data=payload,
    )


def parse_event(raw: bytes | str | dict[str, Any]) -> Event:
    """Parse any runctl event from its JSON form.

    Raises:
        EventError: not JSON, an unknown ``type``, or a payload that does not match its model.
    """
    try:
        doc = json.loads(raw) if isinstance(raw, bytes | str) else dict(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EventError(f"event is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise EventError("event is not a JSON object")
    kind = doc.get("type")
    payload_model = BY_TYPE.get(kind) if isinstance(kind, str) else None
    if payload_model is None:
        raise EventError(f"unknown event type {kind!r}; known: {', '.join(sorted(BY_TYPE))}")
    try:
        payload = payload_model.model_validate(doc.get("data"))
        return Event.model_validate({**doc, "data": payload})
    except ValidationError as e:
        raise EventError(f"{kind} does not match its schema: {e}", run_id=doc.get("runid")) from e
