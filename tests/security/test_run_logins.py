"""Attacks by a runner on its run's own bus login (runctl.runlogins, runctl.natsauth.RunUser), and through the
launcher's desk it asks (services/launcher/desk.py), against a real nats-server with the generated configuration and
a real desk: the runner of team nlp's run r1 tries to write another run's events, read the services' streams and
buckets, ask another run's desk, and book or free another run's sandboxes through its own. Each is refused and
nothing of the other runs, the services' streams or their buckets changes. On the embedded stack, a run's login
is accepted once issued and cut off when revoked."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import nats
import pytest

from runctl import runlogins
from runctl.bus import Bus
from runctl.bus.kv import bucket_keys, open_bucket
from runctl.callout import CALLOUT_SUBJECT, LoginCallout
from runctl.events.payloads import RUNS_STREAM, TRIALS_STREAM
from runctl.home import read_stack_state
from runctl.natsauth import SERVICES_USER, SYSTEM_USER, RunUser, nats_hash, run_inbox, run_user
from runctl.natsjwt import NKey
from runctl.stackbus import Login, stack_logins
from runctl.subjects import desk_subject, team_stream
from services.launcher.carry.books import Books
from services.launcher.desk import Desk, desk_owner_prefix
from services.launcher.evalstore import BUCKET as EVALS
from services.launcher.ledger import BUCKET as LEDGER
from services.launcher.ledger import Ledger, LedgerEntry
from services.sandbox.ledger import BUCKET as SANDBOXES
from services.sandbox.ledger import LedgerEntry as SandboxEntry
from services.sandbox.ledger import SandboxLedger
from tests.conftest import async_wait_until, login_refused, wait_until
from tests.e2e.conftest import Cli, cli, stack  # noqa: F401  (fixtures: a real embedded stack)
from tests.infra.bus_attacks import MARKER, SYSTEM_PASSWORD, VICTIM, VICTIM_EVENT, nats_bus
from tests.infra.bus_attacks import Bus as NatsBus

pytestmark = pytest.mark.integration

TEAM, RUN, SIBLING = "nlp", "r1", "r2"
PASSWORD = "r1-secret"
VICTIM_RUN = "v-run"
VICTIM_SANDBOX = "sb-vision-1"
VICTIM_RUNS = team_stream(RUNS_STREAM, VICTIM)


def with_run_users(config: dict[str, Any]) -> None:
    users = config["accounts"]["RUNCTL"]["users"]  # type: ignore[index]
    users.append(RunUser(TEAM, RUN, nats_hash(PASSWORD)).entry())
    users.append(RunUser(TEAM, SIBLING, nats_hash("r2-secret")).entry())


#: The auth callout's issuer on the bus that asks the launcher for run logins (runctl.callout).
ISSUER = NKey.create()
CALLOUT_BUSES: set[int] = set()


async def record_run_logins(bus: NatsBus) -> None:
    """The launcher's records of r1's and r2's logins, as it makes them when it starts their runners."""
    services = await Bus.connect(bus.url(SERVICES_USER), as_team=False)
    try:
        for run, password in ((RUN, PASSWORD), (SIBLING, "r2-secret")):
            await runlogins.record(services, TEAM, run, Login(run_user(TEAM, run), password, nats_hash(password)))
    finally:
        await services.close()


@pytest.fixture(scope="module", params=["configured", "callout"])
def bus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsBus]:
    """The bus in either way it takes run logins: written into its configuration (the embedded stack), or asked of
    the launcher's auth callout (a bus runctl does not configure)."""
    if request.param == "configured":
        with nats_bus(tmp_path_factory.mktemp("bus"), with_run_users) as server:
            yield server
        return
    with nats_bus(tmp_path_factory.mktemp("bus"), issuer=ISSUER) as server:
        CALLOUT_BUSES.add(server.port)
        asyncio.run(record_run_logins(server))
        yield server


@contextlib.asynccontextmanager
async def answering(bus: NatsBus) -> AsyncIterator[LoginCallout | None]:
    """The launcher's auth callout on the services' login, where the bus asks one."""
    if bus.port not in CALLOUT_BUSES:
        yield None
        return
    services = await Bus.connect(bus.url(SERVICES_USER), as_team=False)
    system = await nats.connect(f"nats://{SYSTEM_USER}:{SYSTEM_PASSWORD}@127.0.0.1:{bus.port}")
    callout = LoginCallout(services, ISSUER, system)
    await callout.start()
    try:
        yield callout
    finally:
        await callout.stop()
        await system.close()
        await services.close()


def run_url(bus: NatsBus) -> str:
    return f"nats://{run_user(TEAM, RUN)}:{PASSWORD}@127.0.0.1:{bus.port}"


@pytest.fixture
async def desk(bus: NatsBus) -> AsyncIterator[Desk]:
    """The launcher's desk on the services' login, carrying nlp's r1 and r2 and vision's v-run (which holds a
    sandbox and a pinned checkpoint)."""
    services = await Bus.connect(bus.url(SERVICES_USER), as_team=False)
    ledger = await Ledger.open(services)
    for team, run in ((TEAM, RUN), (TEAM, SIBLING), (VICTIM, VICTIM_RUN)):
        await ledger.put(run, LedgerEntry(team=team, state="active", progress={"secret": MARKER.decode()}))
    sandboxes = await SandboxLedger.open(services)
    owner = desk_owner_prefix(VICTIM, VICTIM_RUN) + "host-1"
    await sandboxes.put(SandboxEntry(VICTIM_SANDBOX, "local", "/h", owner, VICTIM, VICTIM_RUN, "t", 1.0, "seat1"))
    await sandboxes.take_seat(VICTIM, "seat1", owner)
    await sandboxes.heartbeat(owner)
    desk = await Desk.open(services, Books(services, ledger, "/runctl/launcher"))
    await desk.start()
    async with answering(bus):
        yield desk
    await desk.stop()
    await services.close()


async def everything(bus: NatsBus) -> dict[str, Any]:
    """The services' streams (subjects and counts) and the values of every key of their buckets."""
    nc = await nats.connect(bus.url(SERVICES_USER))
    js = nc.jetstream()
    found: dict[str, Any] = {}
    try:
        for stream in [team_stream(family, team) for family in (RUNS_STREAM, TRIALS_STREAM) for team in (TEAM, VICTIM)]:
            found[stream] = dict((await js.stream_info(stream, subjects_filter=">")).state.subjects or {})
        for bucket in (LEDGER, SANDBOXES, EVALS):
            kv = await open_bucket(js, bucket)
            values = {}
            for key in await bucket_keys(js, bucket):
                try:
                    values[key] = (await kv.get(key)).value
                except nats.js.errors.KeyNotFoundError:
                    values[key] = None
            found[bucket] = values
    finally:
        await nc.close()
    return found


async def _ignore(error: Exception) -> None:
    """Permission violations reach the runner as errors; the verdict is the state, not the error."""


class Runner:
    def __init__(self, nc: nats.NATS) -> None:
        self.nc = nc
        self.got: list[bytes] = []

    async def keep(self, msg: Any) -> None:
        self.got.append(msg.subject.encode() + b" " + (msg.data or b""))

    async def ask(self, team: str, run: str, op: str, body: dict[str, Any]) -> Any:
        reply = await self.nc.request(desk_subject(team, run, op), json.dumps(body).encode(), timeout=2)
        self.got.append(reply.data)
        return json.loads(reply.data)


Attempt = Callable[[Runner], Awaitable[object]]

ATTACKS: dict[str, Attempt] = {
    "publish an event of a sibling run": lambda r: r.nc.jetstream(timeout=1).publish(
        f"runctl.{TEAM}.{SIBLING}.trial.finished", b"forged"
    ),
    "publish an event of another team's run": lambda r: r.nc.jetstream(timeout=1).publish(VICTIM_EVENT, b"forged"),
    "publish a launcher-only event of its own run": lambda r: r.nc.jetstream(timeout=1).publish(
        f"runctl.{TEAM}.{RUN}.run.admitted", b"forged"
    ),
    "list the subjects of RUNS": lambda r: r.nc.jetstream(timeout=1).stream_info(
        team_stream(RUNS_STREAM, VICTIM), subjects_filter=">"
    ),
    "direct get of the victim's last event": lambda r: r.nc.jetstream(timeout=1).get_last_msg(
        VICTIM_RUNS, VICTIM_EVENT, direct=True
    ),
    "write the launcher's ledger entry of another run": lambda r: r.nc.jetstream(timeout=1).publish(
        f"$KV.{LEDGER}.{VICTIM_RUN}", b'{"team": "vision", "state": "ended"}'
    ),
    "read the launcher's ledger entry of another run": lambda r: r.nc.request(
        f"$JS.API.DIRECT.GET.KV_{LEDGER}.$KV.{LEDGER}.{VICTIM_RUN}", b"", timeout=1
    ),
    "free another team's sandbox seat in the bucket": lambda r: r.nc.jetstream(timeout=1).publish(
        f"$KV.{SANDBOXES}.seat.{VICTIM}.seat1", b"", headers={"KV-Operation": "PURGE"}
    ),
    "subscribe to everything": lambda r: r.nc.subscribe(">", cb=r.keep),
    "subscribe to every inbox": lambda r: r.nc.subscribe("_INBOX.>", cb=r.keep),
    "ask another team's run's desk": lambda r: r.ask(VICTIM, VICTIM_RUN, "ledger_get", {}),
    "end another team's run through its desk": lambda r: r.ask(VICTIM, VICTIM_RUN, "end", {"outcome": "run.failed"}),
    "ask a sibling run's desk": lambda r: r.ask(TEAM, SIBLING, "ledger_put", {"progress": {}}),
    "free another run's sandbox through its own desk": lambda r: r.ask(
        TEAM, RUN, "unbook", {"sandbox_id": VICTIM_SANDBOX}
    ),
    "take over another run's sandbox entry through its own desk": lambda r: r.ask(
        TEAM, RUN, "book", {"entry": asdict(SandboxEntry(VICTIM_SANDBOX, "local", "/mine", "runner-nlp.r1.x"))}
    ),
    "free every sandbox through its own desk with a wildcard id": lambda r: r.ask(
        TEAM, RUN, "unbook", {"sandbox_id": "*"}
    ),
    "free every sandbox through its own desk with a tail wildcard": lambda r: r.ask(
        TEAM, RUN, "unbook", {"sandbox_id": "a.>"}
    ),
    "book a wildcard sandbox entry through its own desk": lambda r: r.ask(
        TEAM, RUN, "book", {"entry": asdict(SandboxEntry("*", "local", "/mine", desk_owner_prefix(TEAM, RUN) + "x"))}
    ),
    "keep another run's sandbox owner alive through its own desk": lambda r: r.ask(
        TEAM, RUN, "beat", {"owner": desk_owner_prefix(VICTIM, VICTIM_RUN) + "host-1"}
    ),
    "take a seat as another run's owner": lambda r: r.ask(
        TEAM, RUN, "seat", {"owner": desk_owner_prefix(VICTIM, VICTIM_RUN) + "host-1"}
    ),
    "read back an event a runner may not": lambda r: r.ask(TEAM, RUN, "last", {"event": "config.validated"}),
    "a services subject": lambda r: r.nc.request("_runctl.health.launcher", b"", timeout=1),
}


async def attempt(bus: NatsBus, name: str) -> list[str]:
    """Perform one attack as r1's runner; what it changed or got of others' (empty when refused)."""
    before = await everything(bus)
    nc = await nats.connect(run_url(bus), inbox_prefix=run_inbox(TEAM, RUN), error_cb=_ignore)
    runner = Runner(nc)
    try:
        try:
            answer = await ATTACKS[name](runner)
        except Exception:  # refused by the server (no permission: no responder, a timeout)
            answer = None
        if isinstance(answer, dict) and answer.get("ok"):
            runner.got.append(b"granted: " + json.dumps(answer).encode())
        services = await nats.connect(bus.url(SERVICES_USER))
        await services.jetstream().publish(VICTIM_EVENT, b'{"secret": "' + MARKER + b'"}')  # what it might hear
        await services.close()
        await nc.flush(timeout=2)
    finally:
        await nc.close()
    after = await everything(bus)
    after[team_stream(RUNS_STREAM, VICTIM)][VICTIM_EVENT] -= 1  # the victim's own publish above
    changed = [f"{what} changed" for what in before if before[what] != after[what]]
    return changed + [g.decode(errors="replace")[:200] for g in runner.got if MARKER in g or g.startswith(b"granted")]


@pytest.mark.parametrize("name", list(ATTACKS))
async def test_a_runner_cannot_touch_another_runs_work(bus: NatsBus, desk: Desk, name: str) -> None:
    assert await attempt(bus, name) == []


async def test_a_runner_does_its_own_runs_work_on_its_login(bus: NatsBus, desk: Desk) -> None:
    """The same login publishes its run's events and gets its own run's answers from the desk: what the attacks
    above were refused is not everything."""
    runner = await Bus.connect(run_url(bus), as_team=False)
    try:
        assert runner.run == (TEAM, RUN)
        ack = await runner.js.publish(f"runctl.{TEAM}.{RUN}.trial.finished", b"{}")
        assert ack.stream == team_stream(TRIALS_STREAM, TEAM)
        from runctl.bus import desk as asked

        assert (await asked.ask(runner, "ledger_get"))["entry"]["team"] == TEAM
        owner = desk_owner_prefix(TEAM, RUN) + "host-2"
        await asked.ask(runner, "beat", {"owner": owner})
        seat = (await asked.ask(runner, "seat", {"owner": owner}))["seat"]
        entry = SandboxEntry("sb-nlp-1", "local", "/h", owner, "vision", "v-run", "t", 1.0, seat)
        await asked.ask(runner, "book", {"entry": asdict(entry)})
        booked = (await SandboxLedger.open(desk.bus)).entries
        held = (await booked())["sb-nlp-1"]
        assert (held.team, held.run_id) == (TEAM, RUN)  # booked under its own run, whatever it claimed
        await asked.ask(runner, "unbook", {"sandbox_id": "sb-nlp-1"})
        assert "sb-nlp-1" not in await booked()
    finally:
        await runner.close()


def test_a_runs_login_is_taken_by_the_stacks_bus_and_cut_off_when_revoked(stack: Cli) -> None:  # noqa: F811
    state, logins = read_stack_state(stack.home), stack_logins(stack.home)
    assert state is not None and logins is not None
    url = state.nats_url

    async def scenario() -> tuple[str, bool, str]:
        services = await Bus.connect(logins[SERVICES_USER].url(url), as_team=False)
        try:
            await services.ensure_streams(teams=[TEAM])  # as the launcher has by the time a run has a login
            login = await runlogins.issue(services, TEAM, RUN)
            await runlogins.wait_accepted(url, login, timeout_s=30)
            runner = await Bus.connect(login.url(url), as_team=False, reconnect=False)
            ack = await runner.js.publish(f"runctl.{TEAM}.{RUN}.trial.finished", b"{}")
            before = "" if ack.seq else "no ack"
            await runlogins.revoke(services, TEAM, RUN)
            for _ in range(200):  # the supervisor rewrites nats.conf and reloads: the connection is closed
                if runner.nc.is_closed:
                    break
                await asyncio.sleep(0.1)
            closed = runner.nc.is_closed
            await runner.close()
            return before, closed, await login_refused(url, user=login.user, password=login.password)
        finally:
            await services.close()

    before, closed, refused = asyncio.run(scenario())
    assert before == "" and closed and "Authorization" in refused


def test_the_stack_writes_no_run_login_it_was_not_given(stack: Cli) -> None:  # noqa: F811
    """nats.conf carries exactly the logins in the bucket (none here), so a stale one never lingers."""
    wait_until(lambda: (stack.home / "nats.conf").exists(), 10, "nats.conf")
    assert "run." not in json.dumps(json.loads((stack.home / "nats.conf").read_text().split("\n", 1)[1]))
    assert Path(stack.home / "nats.conf").stat().st_mode & 0o777 == 0o600


async def test_a_restarted_launcher_revokes_the_logins_of_runs_that_ended_meanwhile(bus: NatsBus) -> None:
    from services.launcher.service import revoke_stale_logins

    services = await Bus.connect(bus.url(SERVICES_USER), as_team=False)
    try:
        ledger = await Ledger.open(services)
        held = await runlogins.current(services)  # r1's and r2's where the launcher answers the bus: still active
        for user in held:
            await ledger.put(user.run_id, LedgerEntry(team=user.team, state="active"))
        await ledger.put("live-run", LedgerEntry(team=TEAM, state="active"))
        await ledger.put("done-run", LedgerEntry(team=TEAM, state="ended", outcome="run.succeeded"))
        await ledger.put("theirs", LedgerEntry(team=VICTIM, state="active"))
        for run in ("live-run", "done-run", "theirs", "never-admitted"):
            await runlogins.issue(services, TEAM, run)
        assert await revoke_stale_logins(services, ledger) == 3
        left = [u.name for u in await runlogins.current(services)]
        assert left == sorted([run_user(TEAM, "live-run")] + [u.name for u in held])
    finally:
        await services.close()


#: The attacks on the auth callout itself, on the bus that has one.
on_the_callout_bus = pytest.mark.parametrize("bus", ["callout"], indirect=True)


async def _grant_anyone(bus: NatsBus, heard: list[bytes]) -> nats.NATS:
    """Team nlp's own answerer on the callout's subject: it grants every login it hears, signed by a key of its
    own."""
    from runctl import natsjwt

    forger = NKey.create()
    nc = await nats.connect(bus.url(TEAM))

    async def grant(msg: Any) -> None:
        heard.append(msg.data)
        asked = natsjwt.decode(msg.data.decode())["nats"]
        claims = {"sub": asked["user_nkey"], "aud": "RUNCTL", "nats": {"type": "user", "version": 2}}
        user = natsjwt.encode(claims, forger)
        body = {"jwt": user, "type": "authorization_response", "version": 2}
        answer = natsjwt.encode({"sub": asked["user_nkey"], "aud": asked["server_id"]["id"], "nats": body}, forger)
        await msg.respond(answer.encode())

    await nc.subscribe(CALLOUT_SUBJECT, cb=grant)
    await nc.flush()
    return nc


@on_the_callout_bus
async def test_the_callout_refuses_a_run_login_it_did_not_issue(bus: NatsBus) -> None:
    """Wrong password, a run that has no login, a name that is no run's, a team's token as a run's password, a
    login replaced by the next runner's and one revoked: each refused by the launcher's callout, while the login it
    issued is taken."""
    url = f"nats://127.0.0.1:{bus.port}"
    async with answering(bus) as callout:
        assert callout is not None
        services = callout.bus
        login = await runlogins.issue(services, TEAM, "r3")
        assert await login_refused(url, user=login.user, password=login.password) == ""
        replaced = await runlogins.issue(services, TEAM, "r3")  # a new runner: the one given up on is cut off
        tries = {
            "wrong password": (run_user(TEAM, RUN), "r1-guess"),
            "a run with no login": (run_user(VICTIM, "v-run"), PASSWORD),
            "not a run's name": ("launcher", PASSWORD),
            "a team's token as a run's password": (run_user(VICTIM, "v-run"), "v-secret"),
            "the replaced login": (login.user, login.password),
        }
        refused = {what: await login_refused(url, user=u, password=p) for what, (u, p) in tries.items()}
        assert await login_refused(url, user=replaced.user, password=replaced.password) == ""
        await runlogins.revoke(services, TEAM, "r3")
        refused["the revoked login"] = await login_refused(url, user=replaced.user, password=replaced.password)
        assert {what: "Authorization" in why for what, why in refused.items()} == dict.fromkeys(refused, True)
        assert callout.refused == len(refused) and callout.granted == 2


@on_the_callout_bus
async def test_a_team_cannot_answer_the_callout_for_itself(bus: NatsBus) -> None:
    """Team nlp (let in by the launcher) subscribes to the callout's subject in its own account and grants every
    login; then the launcher stops answering. nats-server asks only the services' account, so nlp hears no request
    (no password) and no login is let in."""
    heard: list[bytes] = []
    async with answering(bus):
        forger = await _grant_anyone(bus, heard)
    try:
        why = await login_refused(f"nats://127.0.0.1:{bus.port}", user=run_user(VICTIM, "v-run"), password="any")
    finally:
        await forger.close()
    assert why != "" and heard == []  # refused: no answer comes within the server's (and the client's) 2 s


@on_the_callout_bus
async def test_a_runner_cannot_hear_other_runs_logins(bus: NatsBus) -> None:
    """r1's runner subscribes to the callout's subject (in the services' account, where its login lives) while r2's
    runner logs in: its login may not subscribe there, so r2's password never reaches it."""
    heard: list[bytes] = []
    async with answering(bus):
        nc = await nats.connect(run_url(bus), inbox_prefix=run_inbox(TEAM, RUN), error_cb=_ignore)

        async def hear(msg: Any) -> None:
            heard.append(msg.data)

        try:
            await nc.subscribe(CALLOUT_SUBJECT, cb=hear)
            with contextlib.suppress(Exception):
                await nc.flush(timeout=2)
            url = f"nats://127.0.0.1:{bus.port}"
            assert await login_refused(url, user=run_user(TEAM, SIBLING), password="r2-secret") == ""
            with contextlib.suppress(Exception):
                await nc.flush(timeout=2)
        finally:
            await nc.close()
    assert heard == []


@on_the_callout_bus
async def test_the_launcher_closes_a_revoked_or_replaced_logins_connection(bus: NatsBus) -> None:
    """A runner the launcher gave up on keeps its connection open: when the next runner's login replaces its login,
    the launcher has nats-server close that connection; the next runner's stays until the run's login is revoked."""
    url = f"nats://127.0.0.1:{bus.port}"

    async def runner(login: Login) -> nats.NATS:
        return await nats.connect(
            login.url(url), inbox_prefix=run_inbox(TEAM, "r4"), allow_reconnect=False, error_cb=_ignore
        )

    async with answering(bus) as callout:
        assert callout is not None
        first = await runner(await runlogins.issue(callout.bus, TEAM, "r4"))
        second = await runner(await runlogins.issue(callout.bus, TEAM, "r4"))
        # The server closes the connection before it answers the launcher's request: wait for both.
        closed = "the replaced login's connection to be closed and counted"
        await async_wait_until(lambda: first.is_closed and callout.kicked >= 1, 10, closed)
        assert not second.is_closed and callout.kicked == 1
        await runlogins.revoke(callout.bus, TEAM, "r4")
        closed = "the revoked login's connection to be closed and counted"
        await async_wait_until(lambda: second.is_closed and callout.kicked >= 2, 10, closed)
        assert callout.kicked == 2 and callout.let_in.get((TEAM, "r4")) is None
