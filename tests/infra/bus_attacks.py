"""Every way one team could try to read, forge or stop another team's or the services' work on the bus, tried for
real against a nats-server configured by ``runctl.natsauth``.

An attack is refused when, after it, nothing of the victim team's or the services' changed and nothing of theirs
reached the attacker: the services' streams hold exactly the events they published, the launcher's durable consumer
has its own configuration and every event still to deliver, the victim's view holds exactly the copies of its own
events, and no message, reply or answer the attacker got carries the victim's secret marker or names the victim.
Between the attack and the check the victim publishes once more, so a subscription the attack made would have
received it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nats
from nats.aio.msg import Msg
from nats.js import api

from runctl.bus.client import stream_configs
from runctl.bus.kv import open_bucket
from runctl.callout import LoginCallout
from runctl.events import CancelRequested, new_event
from runctl.events.payloads import RUNS_STREAM, TRIALS_STREAM
from runctl.natsauth import (
    ADMIN_USER,
    SERVICES_USER,
    SYSTEM_USER,
    VIEW_STREAM,
    NatsUser,
    nats_hash,
    server_config,
    team_api,
    view_subject,
)
from runctl.natsjwt import NKey
from runctl.stack import nats_server_binary
from runctl.subjects import team_stream
from runctl.teams import BUCKET, Team
from tests.conftest import free_port, wait_until

ATTACKER, VICTIM = "nlp", "vision"
PASSWORDS = {SERVICES_USER: "services-secret", ADMIN_USER: "admin-secret", ATTACKER: "nlp-secret", VICTIM: "v-secret"}
SYSTEM_PASSWORD = "system-secret"
MARKER = b"vision-secret"
VICTIM_EVENT = f"runctl.{VICTIM}.v-run.cancel.requested"
OWN_EVENT = f"runctl.{ATTACKER}.n-run.cancel.requested"
LAUNCHER = "launcher"
VICTIM_RUNS, VICTIM_TRIALS = team_stream(RUNS_STREAM, VICTIM), team_stream(TRIALS_STREAM, VICTIM)


@dataclass
class Bus:
    port: int
    log: Path

    def url(self, user: str | None = None) -> str:
        login = f"{user}:{PASSWORDS[user]}@" if user else ""
        return f"nats://{login}127.0.0.1:{self.port}"


def default_config(port: int, store: Path, callout_issuer: str | None = None) -> dict[str, object]:
    users = {name: NatsUser(name, nats_hash(PASSWORDS[name])) for name in PASSWORDS}
    text = server_config(
        f"127.0.0.1:{port}",
        str(store),
        users[SERVICES_USER],
        users[ADMIN_USER],
        [users[ATTACKER], users[VICTIM]],
        callout_issuer=callout_issuer,
        system=NatsUser(SYSTEM_USER, nats_hash(SYSTEM_PASSWORD)) if callout_issuer else None,
    )
    return dict(json.loads(text[text.index("{") :]))


@contextlib.contextmanager
def nats_bus(
    folder: Path, edit: Callable[[dict[str, object]], None] = lambda _: None, issuer: NKey | None = None
) -> Iterator[Bus]:
    """A nats-server with runctl's configuration for two teams (after ``edit``; with ``issuer``, the teams' and the
    runs' logins asked of the launcher's auth callout, and the teams in the registry it reads), its streams made,
    the launcher's durable consumer on RUNS, and one event of each team in it."""
    port = free_port()
    config = default_config(port, folder / "js", issuer.public if issuer else None)
    edit(config)
    (folder / "nats.conf").write_text(json.dumps(config))
    bus = Bus(port, folder / "nats.log")
    with bus.log.open("wb") as log:
        proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(folder / "nats.conf")], stdout=log, stderr=subprocess.STDOUT
        )
    try:

        def listening() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait_until(listening, 10, "nats-server")
        asyncio.run(_prepare(bus, issuer))
        yield bus
    finally:
        proc.terminate()
        proc.wait(10)


async def _prepare(bus: Bus, issuer: NKey | None) -> None:
    services = await nats.connect(bus.url(SERVICES_USER))
    js = services.jetstream()
    for config in stream_configs(teams=(VICTIM, ATTACKER)):
        await js.add_stream(config)
    await js.add_consumer(VICTIM_RUNS, api.ConsumerConfig(durable_name=LAUNCHER, ack_policy=api.AckPolicy.EXPLICIT))
    from runctl.bus import Bus as RunctlBus

    maker = await RunctlBus.connect(bus.url(SERVICES_USER))
    for team in (VICTIM, ATTACKER):  # the services make each team's view, as the stack does
        await maker.ensure_view(team)
    callout = None
    if issuer is not None:  # the teams as `runctl team add` records them, their tokens the passwords here
        registry = await open_bucket(maker.js, BUCKET)
        for team in (VICTIM, ATTACKER):
            await registry.put(team, json.dumps(asdict(Team(team).with_token(PASSWORDS[team]))).encode())
        callout = LoginCallout(maker, issuer)
        await callout.start()
    attacker = await RunctlBus.connect(bus.url(ATTACKER))
    attacker.team = ATTACKER  # as a token's login is: its own events are copied into its view
    await attacker.publish(
        new_event(CancelRequested(requested_by=ATTACKER), team=ATTACKER, run_id="n-run", source="/nlp")
    )
    await attacker.close()
    if callout is not None:
        await callout.stop()
    await maker.close()
    await js.publish(VICTIM_EVENT, b'{"secret": "' + MARKER + b'"}')
    await services.close()


@dataclass
class State:
    runs: dict[str, int]
    trials: dict[str, int]
    launcher: dict[str, object]
    pending: int
    victim_view: dict[str, int]


async def state(bus: Bus) -> State:
    services = await nats.connect(bus.url(SERVICES_USER))
    victim = await nats.connect(bus.url(VICTIM))
    try:
        js = services.jetstream()
        runs = await js.stream_info(VICTIM_RUNS, subjects_filter=">")
        trials = await js.stream_info(VICTIM_TRIALS, subjects_filter=">")
        launcher = await js.consumer_info(VICTIM_RUNS, LAUNCHER)
        view = await victim.jetstream().stream_info(VIEW_STREAM, subjects_filter=">")
        return State(
            dict(runs.state.subjects or {}),
            dict(trials.state.subjects or {}),
            launcher.config.as_dict(),
            launcher.num_pending,
            dict(view.state.subjects or {}),
        )
    finally:
        await services.close()
        await victim.close()


@dataclass
class Attacker:
    nc: nats.NATS
    got: list[bytes] = field(default_factory=list)

    @property
    def js(self) -> nats.js.JetStreamContext:
        return self.nc.jetstream(timeout=1.0)

    async def keep(self, msg: Msg) -> None:
        self.got.append(msg.subject.encode() + b" " + (msg.data or b""))

    async def subscribe(self, subject: str) -> object:
        return await self.nc.subscribe(subject, cb=self.keep)

    async def deliver_onto(self, subject: str) -> object:
        """A push consumer on its own view delivering every message there onto ``subject``; returns once the
        server has pushed them all."""
        name = f"push-{abs(hash(subject)) % 10**8}"
        await self.js.add_consumer(
            VIEW_STREAM, api.ConsumerConfig(name=name, deliver_subject=subject, ack_policy=api.AckPolicy.NONE)
        )

        async def pushed() -> bool:
            """Delivered everything, or never will: nothing in its account listens on ``subject``."""
            info = await self.js.consumer_info(VIEW_STREAM, name)
            return not info.push_bound or (info.num_pending == 0 and info.delivered.stream_seq >= 1)

        for _ in range(200):
            if await pushed():
                return name
            await asyncio.sleep(0.025)
        raise AssertionError(f"the attacker's consumer never pushed onto {subject}")


Attempt = Callable[[Attacker], Awaitable[object]]

ATTACKS: dict[str, Attempt] = {
    "publish as the victim": lambda a: a.js.publish(VICTIM_EVENT, b"forged"),
    "publish a services-only event of its own run": lambda a: a.js.publish(
        f"runctl.{ATTACKER}.n-run.run.admitted", b"forged"
    ),
    "subscribe to the victim's subjects": lambda a: a.subscribe(f"runctl.{VICTIM}.>"),
    "subscribe to the victim's view": lambda a: a.subscribe(view_subject(f"runctl.{VICTIM}.>")),
    "subscribe to everything": lambda a: a.subscribe(">"),
    "consumer on RUNS filtered on the victim": lambda a: a.js.add_consumer(
        VICTIM_RUNS, api.ConsumerConfig(name="peek", filter_subject=f"runctl.{VICTIM}.>")
    ),
    "update the launcher's consumer to its own filter": lambda a: a.nc.request(
        f"$JS.API.CONSUMER.CREATE.{VICTIM_RUNS}.{LAUNCHER}.runctl.{ATTACKER}.>",
        json.dumps(
            {"stream_name": VICTIM_RUNS, "config": {"durable_name": LAUNCHER, "filter_subject": f"runctl.{ATTACKER}.>"}}
        ).encode(),
        timeout=1,
    ),
    "list the subjects of RUNS": lambda a: a.js.stream_info(VICTIM_RUNS, subjects_filter=">"),
    "list the subjects of its own view": lambda a: a.js.stream_info(VIEW_STREAM, subjects_filter=">"),
    "stream get by sequence": lambda a: a.js.get_msg(VICTIM_RUNS, 1),
    "direct get of the victim's last event": lambda a: a.js.get_last_msg(VICTIM_RUNS, VICTIM_EVENT, direct=True),
    "pull from the launcher's consumer": lambda a: a.nc.request(
        f"$JS.API.CONSUMER.MSG.NEXT.{VICTIM_RUNS}.{LAUNCHER}", b"1", timeout=1
    ),
    "ack on the launcher's consumer": lambda a: a.nc.publish(f"$JS.ACK.{VICTIM_RUNS}.{LAUNCHER}.1.1.1.0.0", b"+ACK"),
    "launcher consumer info": lambda a: a.js.consumer_info(VICTIM_RUNS, LAUNCHER),
    "delete the launcher's consumer": lambda a: a.js.delete_consumer(VICTIM_RUNS, LAUNCHER),
    "purge RUNS": lambda a: a.js.purge_stream(VICTIM_RUNS),
    "delete TRIALS": lambda a: a.js.delete_stream(VICTIM_TRIALS),
    "update RUNS": lambda a: a.js.update_stream(api.StreamConfig(name=VICTIM_RUNS, subjects=["x.>"])),
    "a stream of its own capturing its subjects": lambda a: a.js.add_stream(
        api.StreamConfig(name="MINE", subjects=[f"runctl.{ATTACKER}.>"])
    ),
    "a services subject": lambda a: a.nc.request("_runctl.health.launcher", b"", timeout=1),
    "read the team registry": lambda a: a.js.stream_info(f"KV_{BUCKET}"),
    "the victim's JetStream API": lambda a: a.nc.request(
        f"{team_api(VICTIM)}.STREAM.INFO.{VIEW_STREAM}", b"", timeout=1
    ),
    "the victim's JetStream API, deleting its view": lambda a: a.nc.request(
        f"{team_api(VICTIM)}.STREAM.DELETE.{VIEW_STREAM}", b"", timeout=1
    ),
    "push its events onto the victim's subject": lambda a: a.deliver_onto(VICTIM_EVENT),
    "push its events onto a services-only subject of its own run": lambda a: a.deliver_onto(
        f"runctl.{ATTACKER}.n-run.run.admitted"
    ),
    "push its events onto the victim's view": lambda a: a.deliver_onto(view_subject(VICTIM_EVENT)),
    "push its events onto the launcher's consumer API": lambda a: a.deliver_onto(
        f"$JS.API.CONSUMER.CREATE.{VICTIM_RUNS}.{LAUNCHER}"
    ),
}


def was_refused(answer: object) -> bool:
    """An answer of :func:`answers` that refused the attack: an exception, or a JetStream API error reply."""
    if isinstance(answer, Exception):
        return True
    if isinstance(answer, Msg):
        with contextlib.suppress(ValueError):
            return "error" in json.loads(answer.data or b"{}")
    return False


async def answers(url: str, names: list[str]) -> dict[str, object]:
    """What each attack got on a live bus (the embedded stack's, where runs change the streams all along): the
    exception that refused it, or what it returned."""
    got: dict[str, object] = {}
    attacker = Attacker(await nats.connect(url, error_cb=_ignore))
    try:
        for name in names:
            try:
                got[name] = await ATTACKS[name](attacker)
            except Exception as e:
                got[name] = e
    finally:
        await attacker.nc.close()
    return got


async def attack(bus: Bus, name: str) -> list[str]:
    """Perform one attack as the attacking team; what it changed or got of the victim's and services' (empty when
    it was refused)."""
    before = await state(bus)
    attacker = Attacker(await nats.connect(bus.url(ATTACKER), error_cb=_ignore))
    try:
        try:
            answer = await ATTACKS[name](attacker)
        except AssertionError:
            raise
        except Exception:  # refused by the server, or no such stream, subject or responder in its account
            answer = None
        if answer is not None:
            attacker.got.append(repr(answer).encode())
        # The victim publishes once more (what a subscription of the attacker's would receive) ...
        services = await nats.connect(bus.url(SERVICES_USER))
        await services.jetstream().publish(VICTIM_EVENT, b'{"secret": "' + MARKER + b'"}')
        await services.close()
        # ... and once its copy is in the victim's view, the server has fanned it out to every interest.
        deadline = asyncio.get_running_loop().time() + 10
        while (await state(bus)).victim_view.get(view_subject(VICTIM_EVENT), 0) <= before.victim_view.get(
            view_subject(VICTIM_EVENT), 0
        ):
            if asyncio.get_running_loop().time() > deadline:
                return ["the victim's own event never reached its view"]
            await asyncio.sleep(0.02)
        with contextlib.suppress(Exception):
            await attacker.nc.flush(timeout=2)
    finally:
        await attacker.nc.close()
    return _changes(before, await state(bus), attacker.got)


def _changes(before: State, after: State, got: list[bytes]) -> list[str]:
    wanted_runs = {**before.runs, VICTIM_EVENT: before.runs.get(VICTIM_EVENT, 0) + 1}
    viewed = view_subject(VICTIM_EVENT)
    wanted_view = {**before.victim_view, viewed: before.victim_view.get(viewed, 0) + 1}
    problems = []
    if after.runs != wanted_runs:
        problems.append(f"RUNS holds {after.runs}, not {wanted_runs}")
    if after.trials != before.trials:
        problems.append(f"TRIALS holds {after.trials}, not {before.trials}")
    if after.launcher != before.launcher:
        problems.append(f"the launcher's consumer is now {after.launcher}")
    if after.pending != before.pending + 1:
        problems.append(f"the launcher has {after.pending} events to deliver, not {before.pending + 1}")
    if after.victim_view != wanted_view:
        problems.append(f"the victim's view holds {after.victim_view}, not {wanted_view}")
    problems += [f"the attacker got {m[:200]!r}" for m in got if MARKER in m or VICTIM.encode() in m]
    return problems


async def _ignore(error: Exception) -> None:
    """Permission violations reach the attacker as errors; the verdict is the state, not the error."""
