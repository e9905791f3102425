"""Run logins: the bus login a run's runner connects with, instead of the services' (:class:`runctl.natsauth.RunUser`
says what it may do).

The launcher issues one when it starts a run's runner (a fresh password each time, so a runner it gave up on is cut
off when the next starts) and revokes it when the run ends. Both are writes to the ``runctl_run_logins`` key-value
bucket (key ``<team>.<run>``, the bcrypt hash only), which the bus takes in one of two ways: the embedded stack's
supervisor (:class:`runctl.stack.TeamSync`) rewrites ``nats.conf`` from it and reloads nats-server, which then closes
the connections of a login it no longer has; a bus configured by ``runctl team nats-config --issuer-seed`` asks the
launcher's auth callout (:mod:`runctl.callout`), which reads it at each connection. The launcher hands a login to a
runner only once the bus accepts it (:func:`wait_accepted`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time

import nats.js.errors
from nats.aio.client import Client as NATS

from runctl.bus import Bus
from runctl.bus.client import close_refused
from runctl.bus.kv import bucket_keys, open_bucket
from runctl.errors import BusError
from runctl.natsauth import RunUser, nats_hash, run_inbox, run_of_user, run_user
from runctl.stackbus import Login
from runctl.subjects import kv_bucket

BUCKET = kv_bucket("run_logins")
ACCEPT_TIMEOUT_S = 30.0


def _key(team: str, run_id: str) -> str:
    return f"{team}.{run_id}"


async def issue(bus: Bus, team: str, run_id: str) -> Login:
    """A new login for the run (replacing any it had): recorded in the bucket for the bus to take."""
    password = secrets.token_urlsafe(32)
    login = Login(run_user(team, run_id), password, nats_hash(password))
    await record(bus, team, run_id, login)
    return login


async def record(bus: Bus, team: str, run_id: str, login: Login) -> None:
    """Record ``login`` as the run's (its hash only): the bus takes it from here."""
    kv = await open_bucket(bus.js, BUCKET)
    await kv.put(_key(team, run_id), json.dumps({"bcrypt": login.password_hash, "issued": time.time()}).encode())


async def revoke(bus: Bus, team: str, run_id: str) -> None:
    """Take the run's login back (nothing happens when it has none)."""
    kv = await open_bucket(bus.js, BUCKET)
    await kv.purge(_key(team, run_id))


async def password_hash(bus: Bus, team: str, run_id: str) -> str | None:
    """The bcrypt hash of the run's login now (None: none is issued)."""
    kv = await open_bucket(bus.js, BUCKET)
    try:
        entry = await kv.get(_key(team, run_id))
    except nats.js.errors.KeyNotFoundError:
        return None
    return hash_in(entry.value) if entry.value else None


def hash_in(value: bytes) -> str:
    """The bcrypt hash a run login's entry in the bucket holds."""
    return str(json.loads(value)["bcrypt"])


async def current(bus: Bus) -> list[RunUser]:
    """Every run login the bus should accept, by team and run."""
    kv = await open_bucket(bus.js, BUCKET)
    found = []
    for key in await bucket_keys(bus.js, BUCKET):
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            continue
        if entry.value:
            team, _, run_id = key.partition(".")
            found.append(RunUser(team, run_id, hash_in(entry.value)))
    return sorted(found, key=lambda u: u.name)


async def sequence(bus: Bus) -> int:
    """The bucket's last sequence: it moves with every issue and revoke."""
    await open_bucket(bus.js, BUCKET)
    info = await bus.js.stream_info(f"KV_{BUCKET}")
    return int(info.state.last_seq)


async def _quiet(error: Exception) -> None:
    """A refusal while the bus has not taken the login yet is expected: not logged."""


async def wait_accepted(url: str, login: Login, timeout_s: float = ACCEPT_TIMEOUT_S) -> None:
    """Return once the bus at ``url`` accepts ``login`` (whoever applies its configuration has taken it).

    Raises:
        BusError: it did not within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    run = run_of_user(login.user)
    if run is None:
        raise BusError(f"{login.user} is not a run's login")
    team, run_id = run
    last: Exception | None = None
    while time.monotonic() < deadline:
        nc = NATS()
        try:
            await nc.connect(
                login.url(url),
                allow_reconnect=False,
                max_reconnect_attempts=1,
                connect_timeout=2,
                inbox_prefix=run_inbox(team, run_id),
                error_cb=_quiet,
            )
            await nc.close()
            return
        except Exception as e:  # refused (not taken yet), or the bus restarting: try again
            last = e
            await close_refused(nc)
        await asyncio.sleep(0.1)
    raise BusError(
        f"the bus did not accept the login of run {run_id} of team {team} within {timeout_s:.0f}s (last: {last}). "
        "Fix: whatever applies the bus's configuration must read the run logins bucket "
        f"({BUCKET}): the embedded stack's supervisor does (see logs/supervisor.log). On a bus runctl does not "
        "configure, write its configuration with `runctl team nats-config --issuer-seed FILE`, restart nats-server "
        "and give the launcher RUNCTL_RUN_LOGIN_SEED_FILE=FILE (it answers the bus's auth callout), or set "
        "RUNCTL_RUN_LOGINS=off (runners then use the launcher's login)."
    )
