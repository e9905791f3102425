"""The validator service: every ``config.submitted`` gets a ``config.validated`` or ``config.rejected``."""

from __future__ import annotations

import asyncio
import logging

from runctl.bus import Bus, ConsumerSpec, each_event
from runctl.events import ConfigRejected, ConfigSubmitted, ConfigValidated, Event, new_event
from runctl.events.checks import CheckResult
from runctl.events.payloads import RUNS_STREAM, Payload
from runctl.service import ServiceRuntime
from runctl.subjects import event_filter
from services.validator.library import check_submission
from services.validator.registry import CHECK_TIMEOUT_S
from services.validator.settings import ValidatorSettings

log = logging.getLogger(__name__)

CONSUMER = ConsumerSpec(
    durable="validator", stream=RUNS_STREAM, filter_subjects=[event_filter(ConfigSubmitted.event_name)]
)


def verdict(
    submitted: ConfigSubmitted, run_id: str, timeout_s: float = CHECK_TIMEOUT_S, team: str | None = None
) -> Payload:
    """The validation event for a submission (sent by ``team``, its subject's): rejected if any check is fatal."""
    claimed = (submitted.resolved.get("TEAM") or {}).get("value")
    if team is not None and claimed is not None and claimed != team:
        wrong = CheckResult(
            id="schema.team",
            check_class=1,
            severity="fatal",
            message=f"the config says TEAM={claimed} but team {team} submitted it: it would use another team's quota "
            "and folders.",
            fix=f"set TEAM={team}, or submit it as team {claimed}.",
        )
        return ConfigRejected(checks=[wrong], num_fatal=1)
    checks = check_submission(submitted, run_id, timeout_s)
    num_fatal = sum(1 for c in checks if c.severity == "fatal")
    if num_fatal:
        return ConfigRejected(checks=checks, num_fatal=num_fatal)
    return ConfigValidated(checks=checks)


class Validator:
    def __init__(self, bus: Bus, source: str, check_timeout_s: float = CHECK_TIMEOUT_S) -> None:
        self.bus = bus
        self.source = source
        self.check_timeout_s = check_timeout_s

    async def handle(self, event: Event) -> None:
        assert isinstance(event.data, ConfigSubmitted)
        if event.data.via == "foreground":
            return  # `runctl run` validated it where it runs and published its own verdict
        # In a thread: the checks read files the team named, each with its time limit, and the loop keeps serving.
        payload = await asyncio.to_thread(verdict, event.data, event.runid, self.check_timeout_s, event.team)
        # One id for the verdict, whichever it is: a redelivered submission cannot produce a second one.
        await self.bus.publish(
            new_event(
                payload, team=event.team, run_id=event.runid, source=self.source, event_id=f"{event.runid}.verdict"
            )
        )
        log.info("%s %s", event.runid, payload.event_name)


async def main(runtime: ServiceRuntime, settings: ValidatorSettings) -> None:
    assert runtime.bus is not None
    validator = Validator(runtime.bus, runtime.source, settings.check_timeout_s)
    await runtime.consume(CONSUMER, each_event(validator.handle))
