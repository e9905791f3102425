"""Every way one team could try to read, forge or stop another team's work on the bus, tried for real against a
nats-server: each attempt counts as refused only when the server answers it with a permissions violation."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import nats
from nats.aio.msg import Msg
from nats.js import api

from runctl.events import RunQueued
from runctl.natsauth import inbox_prefix
from runctl.subjects import event_subject
from runctl.teams import BUCKET


@dataclass
class Attacks:
    attempts: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    received: list[bytes] = field(default_factory=list)
    """What the attacker's subscriptions were given (must stay empty)."""

    def not_refused(self) -> list[str]:
        return [a for a in self.attempts if not any(r.startswith(a + ":") for r in self.refused)]


async def until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await asyncio.sleep(0.05)


async def attack(url: str, team: str, password: str, victim: str) -> Attacks:
    """Log in to ``url`` as ``team`` and try every cross-team operation on ``victim``'s work and the services'."""
    violations: list[str] = []

    async def on_error(e: Exception) -> None:
        violations.append(str(e))

    nc = await nats.connect(url, user=team, password=password, inbox_prefix=inbox_prefix(team), error_cb=on_error)
    try:
        return await _attack(nc, team, victim, violations)
    finally:
        await nc.close()


async def _attack(nc: nats.NATS, team: str, victim: str, violations: list[str]) -> Attacks:
    js = nc.jetstream(timeout=1.0)
    done = Attacks()
    theirs = event_subject(victim, "v-run", RunQueued.event_name)

    async def refuses(what: str, attempt: Callable[[], Awaitable[object]]) -> None:
        """Counted as refused when the server answers the attempt with a permissions violation (which reaches the
        client on its own, after the request has timed out or the publish gone)."""
        done.attempts.append(what)
        before = len(violations)
        try:
            await attempt()
            await nc.flush(timeout=2)
        except Exception:  # the request the server dropped times out; the violation says why
            pass
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(until(lambda: len(violations) > before), 5)
        if len(violations) == before + 1 and "permissions violation" in violations[-1].lower():
            done.refused.append(f"{what}: {violations[-1]}")

    async def keep(msg: Msg) -> None:
        done.received.append(msg.data)

    await refuses(f"publish as {victim}", lambda: js.publish(theirs, b"forged"))
    await refuses(f"subscribe to {victim}'s subjects", lambda: nc.subscribe(f"runctl.{victim}.>", cb=keep))
    await refuses("subscribe to every team's subjects", lambda: nc.subscribe("runctl.>", cb=keep))
    await refuses("subscribe to another inbox", lambda: nc.subscribe(f"{inbox_prefix(victim)}.>", cb=keep))
    await refuses(
        f"consumer filtered on {victim}'s subjects",
        lambda: js.add_consumer("RUNS", api.ConsumerConfig(name="peek", filter_subject=f"runctl.{victim}.>")),
    )
    await refuses(
        "consumer filtered on every team",
        lambda: js.add_consumer("RUNS", api.ConsumerConfig(name="all", filter_subject="runctl.>")),
    )
    await refuses("consumer without a filter", lambda: js.add_consumer("TRIALS", api.ConsumerConfig()))
    await refuses("durable consumer (legacy create)", lambda: js.add_consumer("RUNS", durable_name="mine"))
    await refuses("stream get by sequence", lambda: js.get_msg("RUNS", 1))
    await refuses(f"stream get of {victim}'s last", lambda: js.get_last_msg("RUNS", theirs))
    await refuses(f"direct get of {victim}'s last", lambda: js.get_last_msg("RUNS", theirs, direct=True))
    await refuses(
        "pull from the launcher's consumer",
        lambda: nc.request("$JS.API.CONSUMER.MSG.NEXT.RUNS.launcher", b"1", timeout=1),
    )
    await refuses("ack on the launcher's consumer", lambda: nc.publish("$JS.ACK.RUNS.launcher.1.1.1.0.0", b"+ACK"))
    await refuses("launcher consumer info", lambda: js.consumer_info("RUNS", "launcher"))
    await refuses("delete the launcher's consumer", lambda: js.delete_consumer("RUNS", "launcher"))
    await refuses("purge a stream", lambda: js.purge_stream("RUNS"))
    await refuses("delete a stream", lambda: js.delete_stream("TRIALS"))
    await refuses("update a stream", lambda: js.update_stream(api.StreamConfig(name="RUNS", subjects=["x.>"])))
    await refuses(
        "create a stream", lambda: js.add_stream(api.StreamConfig(name="MINE", subjects=[f"runctl.{team}.mine.>"]))
    )
    await refuses("a services subject", lambda: nc.request("_runctl.health.launcher", b"", timeout=1))
    await refuses("read the team registry", lambda: nc.request(f"$JS.API.STREAM.INFO.KV_{BUCKET}", b"", timeout=1))
    return done
