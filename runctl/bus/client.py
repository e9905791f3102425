"""The JetStream bus: streams, publishing with de-duplication, and durable consumers with a dead-letter path.

Streams (created idempotently by every service at start, from the event catalogue):

    RUNS_<team>    a team's lifecycle events except trials; kept until deleted, refuses more once full
    TRIALS_<team>  a team's ``trial.finished`` (hundreds per step); a ring bounded by age and size
    DEADLETTER     messages a consumer gave up on, with the error in headers

Each team's events live in streams of their own (made when the team is added, or on a privileged login's first
publish for it), so a team's volume is bounded and discarded within its own streams, and its event ids are
de-duplicated among its own events only. A service reads a family (``RUNS``, ``TRIALS``) through one durable
consumer per team's stream (:class:`TeamConsumers`), joining new teams' streams as they appear.

A team's login reads only VIEW, a stream of its own account that keeps a copy of its runs' events
(:mod:`runctl.natsauth`).

Publishing sets ``Nats-Msg-Id`` to the event id, so JetStream drops a repeat inside its duplicate window; every
consumer is idempotent for repeats outside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from runctl.bus.kv import jetstream, through_reload
from runctl.errors import BusError, BusUnreachableError, EventError, PublishError
from runctl.events.envelope import Event, parse_event
from runctl.events.payloads import PAYLOADS, RUNS_STREAM, TRIALS_STREAM
from runctl.natsauth import ADMIN_USER, SERVICES_USER, VIEW_STREAM, run_inbox, run_of_user, team_api, view_subject
from runctl.subjects import (
    DEADLETTER_STREAM,
    deadletter_filter,
    deadletter_subject,
    event_filter,
    parse_event_subject,
    run_filter,
    stream_team,
    team_filter,
    team_stream,
)
from runctl.tokens import team_of_token

log = logging.getLogger(__name__)

DEFAULT_URL = "nats://127.0.0.1:4222"
_DAY_S = 86_400.0


def nats_url(explicit: str | None = None) -> str:
    """The bus URL: an explicit one, else ``$RUNCTL_NATS_URL``, else the embedded stack's, else the default."""
    if explicit:
        return explicit
    if os.environ.get("RUNCTL_NATS_URL"):
        return os.environ["RUNCTL_NATS_URL"]
    from runctl.home import read_stack_state  # local: keeps import light for callers that pass a URL

    state = read_stack_state()
    return state.nats_url if state is not None else DEFAULT_URL


def credentials() -> tuple[str, str] | None:
    """(team, token) from ``$RUNCTL_TOKEN``, else from the credentials file (``$RUNCTL_CREDENTIALS``, else
    ``$RUNCTL_HOME/credentials``; a line ``RUNCTL_TOKEN=...``); None when neither gives one (the admin of the
    embedded stack, or a service's URL with its own user).

    Raises:
        BusError: the token given is not a runctl team token.
    """
    token = os.environ.get("RUNCTL_TOKEN", "").strip()
    if not token:
        from runctl.home import home

        path = Path(os.environ.get("RUNCTL_CREDENTIALS") or home() / "credentials")
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "RUNCTL_TOKEN":
                    token = value.strip().strip("'\"")
    if not token:
        return None
    team = team_of_token(token)
    if team is None:
        raise BusError(
            "RUNCTL_TOKEN is not a runctl team token (rct_<team>.…), so nothing was sent. Fix: use the token "
            "`runctl team add` or `runctl team rotate` printed for your team."
        )
    return team, token


async def close_refused(nc: NATS) -> None:
    """Close the socket of a client whose first connect failed (nats-py leaves it open when it does not retry, e.g.
    on 'Authorization Violation')."""
    with contextlib.suppress(Exception):
        await nc.close()


def masked_url(url: str) -> str:
    """The URL with its password (``nats://user:PASSWORD@host``) replaced by ``***``: safe to print and log."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "<a malformed URL>"
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


@dataclass(frozen=True)
class StreamLimits:
    """Retention of each team's streams and of DEADLETTER.

    A team's RUNS stream is its runs' history: once full it refuses new events (its publisher is told) and drops
    nothing recorded. Its TRIALS stream is a ring of its own. Both are per team, so no team's flood pushes out, or
    stops, another team's events. JetStream reserves each stream's ``max_bytes`` in its store when the stream is
    made (by default 75 % of the disk's free space): the defaults, 1.25 GiB a team, fit 40 teams in 64 GiB."""

    runs_max_bytes: int = 256 * 1024**2
    trials_max_age_s: float = 30 * _DAY_S
    trials_max_bytes: int = 1024**3
    deadletter_max_age_s: float = 30 * _DAY_S
    deadletter_max_bytes: int = 1024**3
    duplicate_window_s: float = 120.0


TEAM_FAMILIES = (RUNS_STREAM, TRIALS_STREAM)
"""The stream families kept per team (:func:`runctl.subjects.team_stream`)."""
LEGACY_STREAMS = TEAM_FAMILIES
"""The one shared stream per family that runctl kept before per-team streams."""
STREAM_CREATED = "$JS.EVENT.ADVISORY.STREAM.CREATED"


def _common(limits: StreamLimits) -> dict[str, Any]:
    return {
        "storage": api.StorageType.FILE,
        "retention": api.RetentionPolicy.LIMITS,
        "duplicate_window": limits.duplicate_window_s,
    }


def team_stream_configs(team: str, limits: StreamLimits = StreamLimits()) -> list[api.StreamConfig]:
    """A team's RUNS and TRIALS streams, with subjects derived from the event catalogue."""
    by_stream: dict[str, list[str]] = {family: [] for family in TEAM_FAMILIES}
    for payload in PAYLOADS:
        by_stream[payload.stream].append(event_filter(payload.event_name, team=team))
    return [
        api.StreamConfig(
            name=team_stream(RUNS_STREAM, team),
            subjects=by_stream[RUNS_STREAM],
            max_bytes=limits.runs_max_bytes,
            discard=api.DiscardPolicy.NEW,
            **_common(limits),
        ),
        api.StreamConfig(
            name=team_stream(TRIALS_STREAM, team),
            subjects=by_stream[TRIALS_STREAM],
            max_age=limits.trials_max_age_s,
            max_bytes=limits.trials_max_bytes,
            discard=api.DiscardPolicy.OLD,
            **_common(limits),
        ),
    ]


def stream_configs(limits: StreamLimits = StreamLimits(), teams: Iterable[str] = ()) -> list[api.StreamConfig]:
    """DEADLETTER, and the streams of each of ``teams``."""
    deadletter = api.StreamConfig(
        name=DEADLETTER_STREAM,
        subjects=[deadletter_filter()],
        max_age=limits.deadletter_max_age_s,
        max_bytes=limits.deadletter_max_bytes,
        discard=api.DiscardPolicy.OLD,
        **_common(limits),
    )
    return [deadletter] + [config for team in teams for config in team_stream_configs(team, limits)]


def _differs(current: api.StreamConfig, wanted: api.StreamConfig) -> bool:
    """True if a stream's subjects or limits differ from ours (the server reports "no limit" as 0 or -1)."""
    return (
        sorted(current.subjects or []) != sorted(wanted.subjects or [])
        or (current.max_age or 0) != (wanted.max_age or 0)
        or (current.max_bytes or -1) != (wanted.max_bytes or -1)
        or (current.discard or api.DiscardPolicy.OLD) != (wanted.discard or api.DiscardPolicy.OLD)
    )


@dataclass(frozen=True)
class Delivery:
    """An event as delivered by a consumer, with the message to acknowledge."""

    event: Event
    msg: Msg

    @property
    def num_delivered(self) -> int:
        return int(self.msg.metadata.num_delivered)

    @property
    def stream_seq(self) -> int:
        return int(self.msg.metadata.sequence.stream)


BatchHandler = Callable[[list[Delivery]], Awaitable[None]]
EventHandler = Callable[[Event], Awaitable[None]]


@dataclass
class ConsumerSpec:
    """A durable pull consumer: explicit ack, bounded redelivery, dead letters after ``max_deliver`` tries."""

    durable: str
    stream: str
    filter_subjects: list[str]
    max_deliver: int = 5
    ack_wait_s: float = 30.0
    batch: int = 64
    retry_delays_s: tuple[float, ...] = (0.5, 2.0, 5.0, 15.0)

    def config(self, start_seq: int = 0) -> api.ConsumerConfig:
        """The consumer's configuration: from the stream's start, or from ``start_seq`` when re-created."""
        return api.ConsumerConfig(
            durable_name=self.durable,
            name=self.durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE if start_seq else api.DeliverPolicy.ALL,
            opt_start_seq=start_seq or None,
            max_deliver=self.max_deliver,
            ack_wait=self.ack_wait_s,
            filter_subjects=self.filter_subjects or None,
            max_ack_pending=10_000,
        )


@dataclass
class ConsumerStats:
    handled: int = 0
    errors: int = 0
    redelivered: int = 0
    dead_lettered: int = 0
    recreated: int = 0
    """Times the durable consumer had vanished (deleted by hand, or lost with the server's state) and was made again."""
    last_error: str = ""
    lag: int = 0
    """Messages in the stream still to deliver after the last batch (0 once a fetch finds nothing new)."""


class _AckBatch:
    """Acks of one pipelined batch, by position; wakes waiters as they arrive."""

    def __init__(self, size: int) -> None:
        self.results: list[api.PubAck | Exception | None] = [None] * size
        self.received = 0
        self._progress = asyncio.Event()

    def resolve(self, index: int, result: api.PubAck | Exception) -> None:
        if self.results[index] is None:
            self.results[index] = result
            self.received += 1
            self._progress.set()

    def outstanding(self, sent: int) -> int:
        return sent - self.received

    async def wait_below(self, sent_target: int, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while self.received < sent_target:
                self._progress.clear()
                await self._progress.wait()

    async def wait_all(self, timeout_s: float) -> None:
        await self.wait_below(len(self.results), timeout_s)


class Bus:
    """A connection to NATS with JetStream, speaking runctl events."""

    def __init__(self, nc: NATS, url: str) -> None:
        self.nc = nc
        self.js: JetStreamContext = jetstream(nc)
        self.url = url
        self._window = 8_000
        self._ack_prefix = ""
        self._ack_seq = 0
        self._ack_batches: dict[int, _AckBatch] = {}
        self.team: str | None = None
        """The team this connection is (from its token), whose subjects alone it may read and write."""
        self.run: tuple[str, str] | None = None
        """(team, run id) when this is a run's login (``runctl.runlogins``): it asks the launcher's desk for what
        lies outside its run's events."""
        self._teams_ready: set[str] = set()
        """Teams whose streams this connection made or found."""
        self.makes_streams = False
        """Whether this is the services' or the stack admin's login (or an open bus's), which makes a team's
        streams before it first publishes for it; a team's or a run's login publishes only where they are."""

    @classmethod
    async def connect(
        cls, url: str | None = None, *, name: str = "runctl", reconnect: bool = False, as_team: bool = True
    ) -> Bus:
        """Connect to the bus.

        Args:
            url: NATS URL; see :func:`nats_url` for the default.
            name: client name shown in the server's connection list.
            reconnect: keep reconnecting forever after a lost connection (services); a CLI fails fast.
            as_team: log in with the team token of :func:`credentials` when there is one and the URL names no user
                (the CLI and SDK); services and runners pass False, as they never act as a team. Without a team
                login or a user in the URL, the embedded stack's bus is logged in to as its admin when this account
                started it (:func:`runctl.stackbus.admin_login`).

        Raises:
            BusUnreachableError: no server answered.
        """
        target = nats_url(url)
        if urlsplit(target).scheme in ("ws", "wss"):
            raise BusUnreachableError(
                masked_url(target),
                "runctl talks to NATS over nats:// or tls://, not WebSocket; give the server's client port "
                "(4222 unless its config says otherwise)",
            )
        errors: list[Exception] = []

        async def remember(error: Exception) -> None:
            errors.append(error)
            if reconnect:
                log.warning("nats: %s", error)

        named = "@" in target.partition("://")[2]
        login = credentials() if as_team and not named else None
        who: dict[str, Any] = {}
        if login is not None:
            who = {"user": login[0], "password": login[1]}
        elif not named:
            from runctl.stackbus import admin_login

            admin = admin_login(target)  # the embedded stack's bus, asked by whoever started it
            if admin is not None:
                who = {"user": admin.user, "password": admin.password}
        run = run_of_user(unquote(urlsplit(target).username or "")) if named else None
        if run is not None:
            who["inbox_prefix"] = run_inbox(*run)  # the only inboxes a run's login may subscribe to
        nc = NATS()
        try:
            await nc.connect(
                target,
                name=name,
                **who,
                # Refused at once when nothing listens; this bounds a bus that is up but slow to answer (a loaded
                # machine's took over 2 s in CI).
                connect_timeout=5,
                allow_reconnect=reconnect,
                # nats-py loops forever on 0; 1 means: try, wait reconnect_time_wait, try once more, give up.
                max_reconnect_attempts=-1 if reconnect else 1,
                reconnect_time_wait=0.5,  # type: ignore[arg-type]  # nats-py annotates int, sleeps on a float
                error_cb=remember,
            )
        except (OSError, TimeoutError, nats.errors.Error) as e:
            await close_refused(nc)
            reason = errors[-1] if errors else e
            raise BusUnreachableError(masked_url(target), str(reason) or type(reason).__name__) from e
        bus = cls(nc, target)
        bus.run = run
        user = str(who.get("user") or unquote(urlsplit(target).username or ""))
        bus.makes_streams = login is None and run is None and user in ("", SERVICES_USER, ADMIN_USER)
        if login is not None:
            bus.team = login[0]
            await bus.ensure_view()
        return bus

    async def ensure_view(self, team: str | None = None) -> None:
        """The stream of a team's account that keeps the copy of its runs' events (:mod:`runctl.natsauth`), as large
        as the account may keep: on a team's login its own (made on its first connection, before it can submit
        anything); on the services' login, ``team``'s, through the import of its account's JetStream API."""
        team = team or self.team
        assert team is not None
        js = self.js if team == self.team else jetstream(self.nc, prefix=team_api(team))
        try:
            await js.stream_info(VIEW_STREAM)
            return
        except nats.js.errors.NotFoundError:
            pass
        except nats.errors.Error as e:
            raise BusError(
                f"the bus did not answer a JetStream request in team {team}'s account ({type(e).__name__}: {e}): "
                "its configuration predates team accounts or has not taken the team yet. Fix: the operator "
                "regenerates it with `runctl team nats-config` and reloads nats-server twice (deploy/nats/README.md)."
            ) from e
        account = await js.account_info()
        config = api.StreamConfig(
            name=VIEW_STREAM,
            subjects=[view_subject(team_filter(team))],
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.LIMITS,
            discard=api.DiscardPolicy.OLD,
            max_bytes=account.limits.max_storage if account.limits.max_storage > 0 else None,
        )
        with contextlib.suppress(nats.js.errors.BadRequestError):  # another client of the team made it first
            await js.add_stream(config)

    async def ensure_streams(self, limits: StreamLimits = StreamLimits(), teams: Iterable[str] = ()) -> None:
        """Create DEADLETTER and the streams of ``teams``, or bring an existing one's subjects and limits up to date.
        Safe to race. On a team's login, its view (the services' streams are not in its account).

        Raises:
            BusError: the bus still keeps the shared streams of an earlier runctl (see :func:`migrate_shared_streams`).
        """
        if self.team is not None:
            await self.ensure_view()
            return
        for config in stream_configs(limits, teams):
            await self._ensure(config, update=True)
        self._teams_ready.update(teams)

    async def ensure_team_streams(self, team: str, limits: StreamLimits = StreamLimits()) -> None:
        """Make a team's streams if they are missing (once per connection); existing ones are left as they are."""
        if team in self._teams_ready:
            return
        for config in team_stream_configs(team, limits):
            await self._ensure(config, update=False)
        self._teams_ready.add(team)

    async def _ensure(self, config: api.StreamConfig, *, update: bool) -> None:
        """Make or update one stream."""
        try:
            info = await self.js.stream_info(config.name)  # type: ignore[arg-type]
        except nats.js.errors.NotFoundError:
            try:
                await self.js.add_stream(config)
                return
            except nats.js.errors.BadRequestError as e:
                if await self._legacy_streams():
                    raise BusError(
                        f"cannot make stream {config.name}: this bus still keeps every team's events in the shared "
                        f"{' and '.join(LEGACY_STREAMS)} streams of an earlier runctl, whose subjects overlap. Fix: "
                        "`runctl bus migrate` with the services stopped (`runctl up` does it for its own bus) moves "
                        "them into per-team streams, consumers' positions included."
                    ) from e
                info = await self.js.stream_info(config.name)  # type: ignore[arg-type]  # lost a race
        if update and _differs(info.config, config):
            await self.js.update_stream(config)

    async def _legacy_streams(self) -> list[str]:
        return [name for name in await self.stream_names() if name in LEGACY_STREAMS]

    async def stream_names(self) -> list[str]:
        """Every stream of this login's account."""
        names: list[str] = []

        async def ask() -> Msg:
            try:
                return await self.nc.request(
                    "$JS.API.STREAM.NAMES", json.dumps({"offset": len(names)}).encode(), timeout=5
                )
            except nats.errors.NoRespondersError:  # as during a configuration reload: asked again
                raise nats.js.errors.ServiceUnavailableError() from None

        while True:
            try:
                reply = await through_reload(ask)
            except (nats.errors.Error, TimeoutError) as e:
                raise BusError(f"the bus did not list its streams ({type(e).__name__}: {e}).") from e
            doc = json.loads(reply.data)
            if "error" in doc:
                raise BusError(f"the bus did not list its streams: {doc['error'].get('description', doc['error'])}")
            page = doc.get("streams") or []
            names += page
            if not page or len(names) >= int(doc.get("total", 0)):
                return names

    async def team_of_run(self, run_id: str) -> str | None:
        """The team whose RUNS stream holds events of this run (a privileged login's lookup), or None."""
        for name in await self.stream_names():
            team = stream_team(name, RUNS_STREAM)
            if team is not None:
                info = await self.js.stream_info(name, subjects_filter=run_filter(run_id, team))
                if info.state.subjects:
                    return team
        return None

    async def _made_for(self, events: Iterable[Event]) -> None:
        """A login that makes streams (:attr:`makes_streams`) makes those of a team it publishes for first."""
        if self.makes_streams:
            for team in {event.team for event in events}:
                await self.ensure_team_streams(team)

    async def publish(self, event: Event, timeout_s: float = 5.0) -> api.PubAck:
        """Publish one event and wait for JetStream's acknowledgement.

        Raises:
            PublishError: no acknowledgement (no stream, timeout, server error).
        """
        await self._made_for([event])
        try:
            ack = await self.js.publish(
                event.nats_subject,
                event.to_json(),
                timeout=timeout_s,
                headers={"Nats-Msg-Id": event.id},
            )
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as e:
            raise PublishError(
                f"{event.name} for run {event.runid} was not acknowledged by JetStream ({type(e).__name__}: {e}). "
                "Fix: check `runctl status`; the event was not recorded.",
                run_id=event.runid,
                team=event.team,
                subject=event.nats_subject,
            ) from e
        if self.team is not None:
            await self._keep_own([event], timeout_s)
        return ack

    async def publish_many(self, events: Iterable[Event], timeout_s: float = 10.0) -> list[api.PubAck]:
        """Publish many events pipelined, then wait for every acknowledgement.

        Acks come back on one reply subscription, keyed by position, so a batch costs no per-message future,
        token or semaphore; at most ``window`` publishes are unacknowledged at once.

        Raises:
            PublishError: any event was not acknowledged; the others may have been recorded.
        """
        batch = list(events)
        await self._made_for(batch)
        acks = await self._publish_batch(batch, timeout_s, lambda e: e.nats_subject)
        if self.team is not None:
            await self._keep_own(batch, timeout_s)
        return acks

    async def _keep_own(self, events: list[Event], timeout_s: float) -> None:
        """A team's copy of the events it published, in its own view: the services' account sends a team account
        the events the services publish, not those that came in from the team (:mod:`runctl.natsauth`). The
        events are recorded either way; a copy that fails leaves a gap in the team's own view only."""
        try:
            await self._publish_batch(events, timeout_s, lambda e: view_subject(e.nats_subject))
        except PublishError as e:
            log.warning("the events are recorded, but team %s's view lacks its copy: %s", self.team, e)

    async def _publish_batch(
        self, batch: list[Event], timeout_s: float, subject: Callable[[Event], str]
    ) -> list[api.PubAck]:
        if not batch:
            return []
        pending = _AckBatch(len(batch))
        batch_id = await self._register(pending)
        prefix = f"{self._ack_prefix}{batch_id}."
        try:
            for index, event in enumerate(batch):
                if pending.outstanding(index) >= self._window:
                    await pending.wait_below(index - self._window // 2, timeout_s)
                await self.nc.publish(
                    subject(event), event.to_json(), reply=prefix + str(index), headers={"Nats-Msg-Id": event.id}
                )
            await pending.wait_all(timeout_s)
        except TimeoutError:
            pass
        finally:
            self._ack_batches.pop(batch_id, None)
        acks: list[api.PubAck] = []
        for event, result in zip(batch, pending.results, strict=True):
            if not isinstance(result, api.PubAck):
                error = result or TimeoutError(f"no ack within {timeout_s}s")
                raise PublishError(
                    f"{event.name} for run {event.runid} was not acknowledged ({type(error).__name__}: {error}).",
                    run_id=event.runid,
                    team=event.team,
                    subject=event.nats_subject,
                ) from error
            acks.append(result)
        return acks

    async def _register(self, pending: _AckBatch) -> int:
        if not self._ack_prefix:
            self._ack_prefix = f"{self.nc._inbox_prefix.decode()}.{self.nc._nuid.next().decode()}."
            await self.nc.subscribe(self._ack_prefix + ">", cb=self._on_ack)
        self._ack_seq += 1
        self._ack_batches[self._ack_seq] = pending
        return self._ack_seq

    async def _on_ack(self, msg: Msg) -> None:
        batch_id, _, index = msg.subject[len(self._ack_prefix) :].partition(".")
        pending = self._ack_batches.get(int(batch_id))
        if pending is None:
            return
        result: api.PubAck | Exception
        if not msg.data:
            status = msg.headers.get("Status") if msg.headers else None
            result = nats.js.errors.NoStreamResponseError() if status == "503" else PublishError(f"status {status}")
        else:
            doc = json.loads(msg.data)
            error = doc.get("error")
            result = nats.js.errors.APIError.from_error(error) if error else api.PubAck.from_response(doc)
        pending.resolve(int(index), result)

    async def consumer(self, spec: ConsumerSpec) -> Consumer | TeamConsumers:
        """Create (or update) a durable consumer and bind to it; on a family (``RUNS``, ``TRIALS``), one on each
        team's stream of it, joining teams' streams as they appear."""
        if spec.stream in TEAM_FAMILIES:
            group = TeamConsumers(self, spec)
            await group.start()
            return group
        return Consumer(self, spec, await self._bind(spec))

    async def _bind(self, spec: ConsumerSpec, start_seq: int = 0) -> JetStreamContext.PullSubscription:
        """Bind to the durable consumer, made or updated to ``spec``; one that exists keeps where it was made to
        start (a consumer made again after it vanished, or carried over by :mod:`runctl.bus.migrate`): JetStream
        refuses to change that, and it matters only when the consumer is made."""
        try:
            with contextlib.suppress(nats.js.errors.NotFoundError):
                existing = (await self.js.consumer_info(spec.stream, spec.durable)).config
                if existing.deliver_policy == api.DeliverPolicy.BY_START_SEQUENCE and not start_seq:
                    start_seq = int(existing.opt_start_seq or 0)
            await self.js.add_consumer(spec.stream, config=spec.config(start_seq))
            return await self.js.pull_subscribe_bind(durable=spec.durable, stream=spec.stream)
        except nats.js.errors.Error as e:
            raise BusError(f"cannot create consumer {spec.durable} on {spec.stream}: {e}") from e

    async def dead_letter(self, consumer: str, msg: Msg, error: BaseException) -> None:
        """Park a message the consumer gave up on, with why, in the DEADLETTER stream."""
        headers = {
            "Runctl-Original-Subject": msg.subject,
            "Runctl-Error-Type": type(error).__name__,
            "Runctl-Error": str(error)[:1000].replace("\r", " ").replace("\n", " "),
        }
        try:
            headers["Runctl-Stream-Seq"] = str(msg.metadata.sequence.stream)
            headers["Runctl-Num-Delivered"] = str(msg.metadata.num_delivered)
        except (ValueError, IndexError, AttributeError):
            pass
        await self.js.publish(deadletter_subject(consumer), msg.data, headers=headers)

    async def drain(self) -> None:
        """Stop subscriptions, deliver what is in flight, flush publishes, then close."""
        if not self.nc.is_closed:
            await self.nc.drain()

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.close()


class Consumer:
    """Runs a handler over a durable pull consumer until stopped.

    A batch is handed to the handler whole; if it raises, each event is retried alone so one poison message
    cannot hold back the others. A failing event is redelivered with growing delays and dead-lettered after
    ``max_deliver`` attempts; a message that is not a valid event is dead-lettered at once.

    A durable consumer that vanished (deleted, or lost with the server's state) is made again, from just after the
    last message the server had recorded as done (its ack floor, read every ``check_every_s``): what was acked
    since that reading is delivered again, as any redelivery is, and nothing is skipped.
    """

    def __init__(
        self, bus: Bus, spec: ConsumerSpec, sub: JetStreamContext.PullSubscription, check_every_s: float = 5.0
    ) -> None:
        self.bus = bus
        self.spec = spec
        self.sub = sub
        self.stats = ConsumerStats()
        self.ack_floor = 0
        """The stream sequence up to which the server last said every message was done."""
        self.check_every_s = check_every_s
        self._checked_at = time.monotonic()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """Finish the batch in hand, then return from :meth:`run`."""
        self._stop.set()

    async def close(self) -> None:
        """Drop the pull subscription once :meth:`run` has returned. Unacked messages are redelivered to the
        durable consumer's next reader. (nats-py's drain of a pull subscription never completes, so services
        close their consumers before draining the connection.)"""
        try:
            await self.sub.unsubscribe()
        except nats.errors.Error as e:
            log.debug("closing %s: %s", self.spec.durable, e)

    async def run(self, handler: BatchHandler, fetch_timeout_s: float = 1.0) -> None:
        while not self._stop.is_set():
            if time.monotonic() - self._checked_at >= self.check_every_s:
                await self._check()
            try:
                msgs = await self.sub.fetch(self.spec.batch, timeout=fetch_timeout_s)
            except (TimeoutError, nats.errors.TimeoutError):
                self.stats.lag = 0
                continue
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
                return
            except nats.errors.Error as e:
                log.warning("fetch on %s failed: %s", self.spec.durable, e)
                await self._check()
                await asyncio.sleep(0.2)
                continue
            if msgs:
                self.stats.lag = int(msgs[-1].metadata.num_pending)
            await self._process(msgs, handler)

    async def _check(self) -> None:
        """Read the consumer's ack floor; make the consumer again if the server no longer has it."""
        self._checked_at = time.monotonic()
        try:
            info = await self.bus.js.consumer_info(self.spec.stream, self.spec.durable)
        except nats.js.errors.NotFoundError:
            await self._recreate()
        except (nats.errors.Error, TimeoutError) as e:
            log.debug("consumer info of %s: %s", self.spec.durable, e)
        else:
            self.ack_floor = max(self.ack_floor, int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0)

    async def _recreate(self) -> None:
        start = self.ack_floor + 1 if self.ack_floor else 0
        log.warning(
            "consumer %s on %s had vanished; made again, from stream sequence %s",
            self.spec.durable,
            self.spec.stream,
            start or "1 (nothing was recorded as done)",
        )
        try:
            sub = await self.bus._bind(self.spec, start)
        except BusError as e:
            self._record_error(e)
            return
        with contextlib.suppress(nats.errors.Error):
            await self.sub.unsubscribe()
        self.sub = sub
        self.stats.recreated += 1

    async def _process(self, msgs: list[Msg], handler: BatchHandler) -> None:
        deliveries: list[Delivery] = []
        for msg in msgs:
            try:
                deliveries.append(Delivery(_checked(parse_event(msg.data), msg.subject), msg))
            except EventError as e:
                self._record_error(e)
                await self.bus.dead_letter(self.spec.durable, msg, e)
                self.stats.dead_lettered += 1
                await msg.term()
        if not deliveries:
            return
        try:
            await handler(deliveries)
        except Exception as batch_error:  # isolate the failing event below
            if len(deliveries) == 1:
                await self._failed(deliveries[0], batch_error)
                return
            for delivery in deliveries:
                try:
                    await handler([delivery])
                except Exception as e:  # recorded, and the message retried
                    await self._failed(delivery, e)
                else:
                    await self._acked(delivery)
            return
        for delivery in deliveries:
            await self._acked(delivery)

    async def _acked(self, delivery: Delivery) -> None:
        await delivery.msg.ack()
        self.stats.handled += 1
        if delivery.num_delivered > 1:
            self.stats.redelivered += 1

    async def _failed(self, delivery: Delivery, error: BaseException) -> None:
        self._record_error(error)
        attempt = delivery.num_delivered
        if attempt >= self.spec.max_deliver:
            log.error("dead-lettering %s after %d attempts: %s", delivery.msg.subject, attempt, error)
            await self.bus.dead_letter(self.spec.durable, delivery.msg, error)
            self.stats.dead_lettered += 1
            await delivery.msg.term()
            return
        delays = self.spec.retry_delays_s
        await delivery.msg.nak(delay=delays[min(attempt - 1, len(delays) - 1)])

    def _record_error(self, error: BaseException) -> None:
        self.stats.errors += 1
        self.stats.last_error = f"{type(error).__name__}: {error}"
        log.warning("%s: %s", self.spec.durable, self.stats.last_error)


class TeamConsumers:
    """One durable consumer of ``spec`` on every team's stream of its family (``spec.stream`` is ``RUNS`` or
    ``TRIALS``), each under the spec's durable name. A team's stream made later is joined at once (JetStream's
    stream-created advisory) or at the next rescan (every ``rescan_s``, for an advisory missed while reconnecting).
    The handler sees one batch at a time, whichever team's, as it did with one consumer; events of one team keep
    their order, events of different teams have none between them."""

    def __init__(self, bus: Bus, spec: ConsumerSpec, rescan_s: float = 10.0) -> None:
        self.bus = bus
        self.spec = spec
        self.rescan_s = rescan_s
        self.members: dict[str, Consumer] = {}
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._advisory: Any = None

    @property
    def stats(self) -> ConsumerStats:
        """The members' stats summed (lag: events still to deliver across teams; the latest error)."""
        total = ConsumerStats()
        for member in self.members.values():
            for field in ("handled", "errors", "redelivered", "dead_lettered", "recreated", "lag"):
                setattr(total, field, getattr(total, field) + getattr(member.stats, field))
            total.last_error = member.stats.last_error or total.last_error
        return total

    async def start(self) -> None:
        """Listen for new streams, then bind to the family's streams that exist."""
        self._advisory = await self.bus.nc.subscribe(f"{STREAM_CREATED}.*", cb=self._created)
        await self._scan()

    async def _created(self, msg: Msg) -> None:
        if stream_team(msg.subject.rpartition(".")[2], self.spec.stream) is not None:
            self._wake.set()

    async def _scan(self) -> None:
        for name in await self.bus.stream_names():
            if name not in self.members and stream_team(name, self.spec.stream) is not None:
                spec = replace(self.spec, stream=name)
                self.members[name] = Consumer(self.bus, spec, await self.bus._bind(spec))

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for member in self.members.values():
            member.stop()

    async def close(self) -> None:
        if self._advisory is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._advisory.unsubscribe()
        for member in self.members.values():
            await member.close()

    async def run(self, handler: BatchHandler, fetch_timeout_s: float = 1.0) -> None:
        async def one_at_a_time(batch: list[Delivery]) -> None:
            async with self._lock:
                await handler(batch)

        running: dict[str, asyncio.Task[None]] = {}
        try:
            while not self._stop.is_set():
                for name, member in self.members.items():
                    if name not in running:
                        running[name] = asyncio.create_task(member.run(one_at_a_time, fetch_timeout_s))
                waker = asyncio.create_task(self._wake.wait())
                await asyncio.wait([waker, *running.values()], timeout=self.rescan_s, return_when="FIRST_COMPLETED")
                waker.cancel()
                for task in running.values():
                    if task.done():  # a member ends only with the connection, or on an error that ends the service
                        task.result()
                        return
                self._wake.clear()
                if self._stop.is_set():
                    break
                try:
                    await self._scan()
                except BusError as e:
                    log.warning("%s: looking for new teams' streams: %s", self.spec.durable, e)
        finally:
            for member in self.members.values():
                member.stop()
            await asyncio.gather(*running.values(), return_exceptions=True)


def checked_event(data: bytes, subject: str) -> Event | str:
    """The event a message carries, or why it is not a valid one (for readers that skip such messages)."""
    try:
        return _checked(parse_event(data), subject)
    except EventError as e:
        return str(e)


def _checked(event: Event, subject: str) -> Event:
    """The event, if its team, run and name are those of the subject it came on.

    NATS permissions decide who may publish on ``runctl.<team>.>``; this makes the envelope unable to claim
    another team or run than its subject does.

    Raises:
        EventError: the envelope and the subject disagree.
    """
    if parse_event_subject(subject) != (event.team, event.runid, event.name):
        raise EventError(
            f"event {event.id} claims team {event.team!r}, run {event.runid!r}, {event.name} but came on {subject}",
            run_id=event.runid,
            team=event.team,
            subject=subject,
        )
    return event


def each_event(handler: EventHandler) -> BatchHandler:
    """Adapt a one-event handler to the batch interface (events handled in order)."""

    async def handle(batch: list[Delivery]) -> None:
        for delivery in batch:
            await handler(delivery.event)

    return handle
