"""Logins on a bus runctl does not configure: ``nats-server``'s auth callout, answered by the launcher.

On the embedded stack the team and run logins are written into ``nats-server``'s configuration and applied by a
reload (:mod:`runctl.stack`, :mod:`runctl.runlogins`). A shared cluster's bus is configured by its operators, from
``runctl team nats-config --issuer-seed FILE``: the accounts and what crosses between them as before, but only the
services', the admin's and the system user written in, and those three listed as ``auth_users`` of an *auth
callout* (``authorization.auth_callout``, nats-server ≥ 2.10) whose issuer is the account key in FILE. Every other
login is handed by nats-server to whoever subscribes to ``$SYS.REQ.USER.AUTH`` in the services' account: the
launcher, holding that key's seed (``RUNCTL_RUN_LOGIN_SEED_FILE``). It answers with a user JWT signed by the key,
bound to the one-off user key nats-server made for this connection and to the server that asked (an answer cannot
be replayed for another connection), or with a refusal:

- a team's user (its name, its token as the password), checked against the team registry now, is placed in the
  team's account, as the configuration would place it;
- ``run.<team>.<run>`` with the password whose bcrypt hash is the run's entry in the run logins bucket now (issued
  when the runner was started, replaced when another is, purged when the run ends), placed in the services'
  account with exactly the permissions the configuration would write (:func:`runctl.natsauth.run_permissions`);
- anything else is refused.

The callout's block cannot be changed by a reload (nats-server refuses), which is why its ``auth_users`` are the
three fixed users and the teams log in through it: ``team add`` then needs a reload (a new account), never a
restart. So the operators never edit the bus for a run, a login works the moment it is recorded, and a revoked,
rotated or replaced one is refused at its next connection. A connection let in stays open when its login goes,
unless the launcher may also log in to the bus's system account (``RUNCTL_BUS_SYSTEM_URL``; the configuration has
that user when ``$RUNCTL_SYSTEM_PASSWORD`` is set): it then watches the registry and the run logins bucket and has
nats-server close (``$SYS.REQ.SERVER.<id>.KICK``) every connection it let in on a login that changed or went since.
Several launchers may answer: they share a queue group, read the same buckets, and each closes the connections it
let in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

import bcrypt
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.kv import KeyValue

from runctl import natsjwt, runlogins, teams
from runctl.bus import Bus
from runctl.bus.kv import open_bucket
from runctl.errors import BusError
from runctl.natsauth import SERVICES_ACCOUNT, run_of_user, run_permissions, team_account
from runctl.natsjwt import NKey
from runctl.teams import TeamRegistry
from runctl.tokens import TEAM_NAME

log = logging.getLogger(__name__)

CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
QUEUE = "runctl-callout"
KICK_TIMEOUT_S = 5.0
RUN_LOGINS, TEAMS = runlogins.BUCKET, teams.BUCKET


@dataclass(frozen=True)
class Grant:
    """A login let in: where it is placed, what it may do (None: anything within its account), and the login it was
    then (its bucket, key, and a fingerprint of its secret), to close its connections when that changes."""

    account: str
    name: str
    permissions: dict[str, dict[str, list[str]]] | None
    bucket: str
    key: str
    fingerprint: str


@dataclass(frozen=True)
class LetIn:
    """A connection the callout let in: which server holds it and its client id there."""

    server: str
    client: int
    fingerprint: str


def user_claims(grant: Grant, user_key: str) -> dict[str, Any]:
    """A user JWT's claims (configuration mode places the user in the account its ``aud`` names)."""
    nats: dict[str, Any] = {"subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2}
    if grant.permissions is not None:
        nats |= {"pub": grant.permissions["publish"], "sub": grant.permissions["subscribe"]}
    return {"sub": user_key, "name": grant.name, "aud": grant.account, "nats": nats}


def fingerprint(bucket: str, value: bytes | None) -> str | None:
    """What of a bucket's value a login's validity hangs on (None: no login there)."""
    if not value:
        return None
    try:
        return runlogins.hash_in(value) if bucket == RUN_LOGINS else str(json.loads(value)["token_sha256"])
    except (ValueError, KeyError, TypeError):
        return None


class LoginCallout:
    """Answers nats-server's authorization requests for team and run logins (see the module's docstring)."""

    def __init__(self, bus: Bus, issuer: NKey, system: NATS | None = None) -> None:
        self.bus = bus
        self.issuer = issuer
        self.system = system
        """A connection to the bus's system account: where given, connections of logins that went are closed."""
        self.registry = TeamRegistry(bus)
        self.granted = 0
        self.refused = 0
        self.kicked = 0
        self.let_in: dict[tuple[str, str], list[LetIn]] = {}
        self._sub: Subscription | None = None
        self._watches: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        if self.system is not None:
            for bucket in (RUN_LOGINS, TEAMS):
                watcher = await (await open_bucket(self.bus.js, bucket)).watchall()
                self._watches.append(asyncio.create_task(self._follow(bucket, watcher)))
        self._sub = await self.bus.nc.subscribe(CALLOUT_SUBJECT, queue=QUEUE, cb=self._on)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        for watch in self._watches:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watch
        self._watches = []

    async def _follow(self, bucket: str, watcher: KeyValue.KeyWatcher) -> None:
        try:
            async for entry in watcher:
                if entry is None:  # the values there were when the watch began: nothing changed yet
                    continue
                now = fingerprint(bucket, entry.value) if entry.operation is None else None
                await self.cut_off(bucket, entry.key, now)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]

    async def cut_off(self, bucket: str, key: str, now: str | None) -> None:
        """Close the connections let in on a login of ``key`` other than ``now`` (None: it has none now)."""
        assert self.system is not None
        kept = []
        for conn in self.let_in.pop((bucket, key), []):
            if conn.fingerprint == now:
                kept.append(conn)
                continue
            body = json.dumps({"cid": conn.client}).encode()
            try:
                reply = await self.system.request(f"$SYS.REQ.SERVER.{conn.server}.KICK", body, timeout=KICK_TIMEOUT_S)
                error = json.loads(reply.data).get("error")
            except Exception as e:  # its server is gone, or answers nothing we read: nothing we can close there
                error = str(e)
            if error:  # most often "no such client": that connection had ended by itself
                log.debug("closing connection %d of %s on %s: %s", conn.client, key, conn.server, error)
            else:
                self.kicked += 1
                log.info("closed connection %d of %s on %s: its login changed or went", conn.client, key, conn.server)
        if kept:
            self.let_in[(bucket, key)] = kept

    async def _on(self, msg: Msg) -> None:
        try:
            request = natsjwt.decode(msg.data.decode(errors="replace"))
            asked = request["nats"]
            user_key, server = str(asked["user_nkey"]), str(asked["server_id"]["id"])
            natsjwt.public_role(user_key)
        except (BusError, KeyError, TypeError) as e:
            self.refused += 1
            log.warning("dropped an authorization request that is not nats-server's: %s", e)
            return
        opts = asked.get("connect_opts") or {}
        user = str(opts.get("user") or "")
        grant = await self.check(user, str(opts.get("pass") or ""))
        answer: dict[str, Any] = {"type": "authorization_response", "version": 2}
        if isinstance(grant, Grant):
            answer["jwt"] = natsjwt.encode(user_claims(grant, user_key), self.issuer)
            self.granted += 1
            client = (asked.get("client_info") or {}).get("id")
            if self.system is not None and isinstance(client, int):
                self.let_in.setdefault((grant.bucket, grant.key), []).append(LetIn(server, client, grant.fingerprint))
        else:
            answer["error"] = grant
            self.refused += 1
            log.info("refused a bus login as %r: %s", user, grant)
        response = natsjwt.encode({"sub": user_key, "aud": server, "nats": answer}, self.issuer)
        with contextlib.suppress(Exception):  # the server gave up waiting, or the bus is going away
            await msg.respond(response.encode())

    async def check(self, user: str, password: str) -> Grant | str:
        """The grant of a team's or a run's login as it is now, or why not."""
        run = run_of_user(user)
        if run is None:
            team = await self.registry.get(user) if TEAM_NAME.fullmatch(user) else None
            if team is None:
                return "neither a team's nor a run's login"
            if not team.accepts(password):
                return "wrong token"
            return Grant(team_account(team.name), team.name, None, TEAMS, team.name, team.token_sha256)
        team_name, run_id = run
        stored = await runlogins.password_hash(self.bus, team_name, run_id)
        if stored is None:
            return "no login is issued for this run"
        if not await asyncio.to_thread(bcrypt.checkpw, password.encode(), stored.encode()):
            return "wrong password"
        key = f"{team_name}.{run_id}"
        return Grant(SERVICES_ACCOUNT, user, run_permissions(team_name, run_id), RUN_LOGINS, key, stored)
