"""Attacks by a runner on its run's own bus login (runctl.runlogins, runctl.natsauth.RunUser), and through the
launcher's desk it asks (services/launcher/desk.py), against a real nats-server with the generated configuration and
a real desk: the runner of team nlp's run r1 tries to write another run's events, read the services' streams and
buckets, ask another run's desk, and book or free another run's sandboxes through its own. Each is refused and
nothing of the other runs, the services' streams or their buckets changes. On the embedded stack, a run's login
is accepted once issued and cut off when revoked."""

from __future__ import annotations

import asyncio
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
from runctl.events.payloads import RUNS_STREAM, TRIALS_STREAM
from runctl.home import read_stack_state
from runctl.natsauth import SERVICES_USER, RunUser, nats_hash, run_inbox, run_user
from runctl.stackbus import stack_logins
from runctl.subjects import desk_subject, team_stream
from services.launcher.carry.books import Books
from services.launcher.desk import Desk, desk_owner_prefix
from services.launcher.evalstore import BUCKET as EVALS
from services.launcher.ledger import BUCKET as LEDGER
from services.launcher.ledger import Ledger, LedgerEntry
from services.sandbox.ledger import BUCKET as SANDBOXES
from services.sandbox.ledger import LedgerEntry as SandboxEntry
from services.sandbox.ledger import SandboxLedger
from tests.conftest import login_refused, wait_until
from tests.e2e.conftest import Cli, cli, stack  # noqa: F401  (fixtures: a real embedded stack)
from tests.infra.bus_attacks import MARKER, VICTIM, VICTIM_EVENT, nats_bus
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


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsBus]:
    with nats_bus(tmp_path_factory.mktemp("bus"), with_run_users) as server:
        yield server


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
        await ledger.put("live-run", LedgerEntry(team=TEAM, state="active"))
        await ledger.put("done-run", LedgerEntry(team=TEAM, state="ended", outcome="run.succeeded"))
        await ledger.put("theirs", LedgerEntry(team=VICTIM, state="active"))
        for run in ("live-run", "done-run", "theirs", "never-admitted"):
            await runlogins.issue(services, TEAM, run)
        assert await revoke_stale_logins(services, ledger) == 3
        assert [u.name for u in await runlogins.current(services)] == [run_user(TEAM, "live-run")]
    finally:
        await services.close()
