"""Moving a bus from the shared RUNS and TRIALS streams of an earlier runctl to per-team streams.

Until per-team streams, every team's events were kept in one RUNS and one TRIALS stream. Their subjects overlap the
per-team streams', so the shared ones must go before a team's stream can be made. :func:`migrate_shared_streams`
(run by ``runctl up`` before the services start, and by ``runctl bus migrate`` on a bus runctl does not start):

1. retires each shared stream's subjects (its stored events stay), so new events land in the teams' streams;
2. copies every event it holds, in order, into its team's stream, each with the shared sequence it had
   (``Runctl-Legacy-Seq``), so a run that was cut short resumes after the last event copied;
3. makes each durable consumer of the shared stream on every team's stream, from the first copied event it had not
   acknowledged (its ack floor), so no service handles the history again or skips what it had not done;
4. deletes the shared stream.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import api

from runctl.bus.client import LEGACY_STREAMS, Bus
from runctl.errors import BusError
from runctl.subjects import SYSTEM_PREFIX, parse_event_subject, stream_team

log = logging.getLogger(__name__)

LEGACY_SEQ = "Runctl-Legacy-Seq"
_BATCH = 256


@dataclass
class Migration:
    """What a migration moved: events copied per shared stream, and consumers made per team's stream."""

    copied: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.copied)


def retired_subject(family: str) -> str:
    return f"{SYSTEM_PREFIX}.retired.{family}"


async def migrate_shared_streams(bus: Bus) -> Migration:
    """Move the shared streams' events and consumers into per-team streams (see the module's docstring). Nothing
    to do on a bus that has none. Run it with the services stopped.

    Raises:
        BusError: the bus refused a step; what was copied so far stays, and running it again resumes.
    """
    done = Migration()
    shared = [family for family in LEGACY_STREAMS if family in await bus.stream_names()]
    try:
        for family in shared:  # every one retired first: a team's streams of both families are made together
            info = await bus.js.stream_info(family)
            if info.config.subjects != [retired_subject(family)]:
                info.config.subjects = [retired_subject(family)]
                await bus.js.update_stream(info.config)
        for family in shared:
            await _migrate(bus, family, done)
    except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as e:
        raise BusError(
            f"moving the shared {' and '.join(shared)} streams into per-team streams stopped ({type(e).__name__}: "
            f"{e}). What was copied stays. Fix: run `runctl bus migrate` again once the bus answers; it resumes."
        ) from e
    return done


async def _migrate(bus: Bus, family: str, done: Migration) -> None:
    consumers = await bus.js.consumers_info(family)
    resume = await _copied_up_to(bus, family)
    copied = 0
    async for seq, subject, data, headers in _messages(bus, family, resume + 1):
        team, _, _ = parse_event_subject(subject)
        await bus.ensure_team_streams(team)
        await bus.js.publish(subject, data, headers={**headers, LEGACY_SEQ: str(seq)})
        copied += 1
    done.copied[family] = copied
    for consumer in consumers:
        await _carry_consumer(bus, family, consumer, done)
    await bus.js.delete_stream(family)
    log.info("moved %d events of the shared %s stream into per-team streams", copied, family)


async def _team_streams(bus: Bus, family: str) -> list[str]:
    return [name for name in await bus.stream_names() if stream_team(name, family) is not None]


async def _copied_up_to(bus: Bus, family: str) -> int:
    """The last shared sequence copied by an earlier, interrupted run (0 if none): copies go in order."""
    last = 0
    for name in await _team_streams(bus, family):
        info = await bus.js.stream_info(name)
        if info.state.messages:
            msg = await bus.js.get_msg(name, info.state.last_seq)
            last = max(last, int((msg.headers or {}).get(LEGACY_SEQ, 0)))
    return last


async def _messages(bus: Bus, stream: str, start: int) -> Any:
    """(sequence, subject, data, headers) of every message of ``stream`` from ``start``, oldest first."""
    info = await bus.js.stream_info(stream)
    if info.state.messages == 0 or start > info.state.last_seq:
        return
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.NONE,
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=start,
        inactive_threshold=60.0,
    )
    sub = await bus.js.pull_subscribe("", stream=stream, config=config)
    try:
        seq = start - 1
        while seq < info.state.last_seq:
            try:
                msgs = await sub.fetch(_BATCH, timeout=5)
            except (TimeoutError, nats.errors.TimeoutError):
                return  # its tail was removed by its limits while we read
            for msg in msgs:
                seq = int(msg.metadata.sequence.stream)
                headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith("Nats-Expected")}
                yield seq, msg.subject, msg.data, headers
    finally:
        await sub.unsubscribe()


async def _carry_consumer(bus: Bus, family: str, consumer: api.ConsumerInfo, done: Migration) -> None:
    """Make a shared stream's durable consumer on each team's stream, from its first event not yet acknowledged."""
    durable = consumer.config.durable_name or consumer.name
    if not durable:
        return  # an ephemeral reader
    floor = int(consumer.ack_floor.stream_seq or 0) if consumer.ack_floor else 0
    for name in await _team_streams(bus, family):
        try:
            await bus.js.consumer_info(name, durable)
            continue  # made by an earlier, interrupted run
        except nats.js.errors.NotFoundError:
            pass
        start = await _first_after(bus, name, floor)
        config = replace(
            consumer.config,
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start,
            durable_name=durable,
        )
        await bus.js.add_consumer(name, config=config)
        done.consumers.setdefault(name, []).append(durable)


async def _first_after(bus: Bus, stream: str, floor: int) -> int:
    """The sequence in ``stream`` of the first copied event whose shared sequence is past ``floor`` (copies are in
    shared order, so a binary search finds it)."""
    info = await bus.js.stream_info(stream)
    low, high = info.state.first_seq or 1, info.state.last_seq + 1
    while low < high:
        middle = (low + high) // 2
        try:
            headers = (await bus.js.get_msg(stream, middle)).headers or {}
        except nats.js.errors.NotFoundError:
            low = middle + 1  # removed by the stream's limits: older than what is left
            continue
        if LEGACY_SEQ not in headers or int(headers[LEGACY_SEQ]) > floor:
            high = middle
        else:
            low = middle + 1
    return low
