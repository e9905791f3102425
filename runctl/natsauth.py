"""NATS tenancy for the bus: one account for runctl's services and one per team, generated from the team registry
into ``nats-server``'s configuration (the embedded stack's and, by ``runctl team nats-config``, a shared cluster's).

An account is NATS's unit of isolation: subjects, inboxes and JetStream assets (streams, consumers, their API) of one
account do not exist for another. What crosses between accounts is only what the configuration exports and imports:

- **The services' account** (``RUNCTL``) holds the services' user and the admin, and every stream runctl keeps
  (RUNS, TRIALS, DEADLETTER, the key-value buckets).
- **A team's account** (``team-<name>``) holds the team's user (its token is the password) and imports two things:
  - as a *service*, the subjects of the events a team may author on its own runs (``runctl.<team>.*.<event>`` for
    every event but those only the services write: :data:`SERVICES_ONLY`). A publish lands in the services' RUNS or
    TRIALS stream and its acknowledgement comes back, as on a single-account bus;
  - as a *stream*, ``runctl.<team>.>`` delivered as ``view.runctl.<team>.>``: every event the services and runners
    publish about its runs. A stream of its own account keeps them (:data:`VIEW_STREAM`), where the team reads its
    runs' history and live events. A stream import does not carry back what came in through the service import,
    so the team's client adds a copy of each event it published itself (``runctl.bus``). The services make the
    view as soon as the account exists (they import the team account's JetStream API as ``_runctl.js.<team>``, a
    direction that gives the team nothing), and the team's client makes it on its first connection if it is
    missing. The copies cost the services nothing when no team listens (a benchmark's bus, say): a message goes
    to a team account only where that account has interest.

So a team cannot name, list, read, pull from, update or delete anything of the services' JetStream or of another
team, whatever its requests say: those requests reach only its own account's JetStream. A push consumer it makes
delivers only onto subjects of its own account, and the only subjects there that leave it are its own authorable
events — exactly what it may publish anyway. Its account's JetStream is bounded (:class:`BusLimits`: storage, one
stream, and the consumers the team's quota gives), so a team fills only its own view.

Nothing of the services' account is imported by a team account: a team account that imported any part of the
services' JetStream API could have a push consumer deliver a body it wrote onto that import (deliveries are not
checked against the user's permissions) and so act on the services' consumers.

- **A run's login** (``run.<team>.<run>``, a user of the services' account, :class:`RunUser`) is what its runner
  connects with: issued by the launcher when it starts the runner and revoked when the run ends
  (:mod:`runctl.runlogins`). It may publish the run's own events (not those only the services write about a run:
  ``run.queued``, ``run.admitted``, ``eval.requested``) and ask the launcher's desk about the run
  (``runctl.subjects.desk_subject``); it may subscribe to its own inboxes only (``_INBOX_RUN.<team>.<run>``: the
  client sets that prefix). No JetStream API, no key-value bucket, no other run's subjects, no other inbox: what a
  runner kept in the services' buckets itself, it now asks the desk for, which answers about that run only.

Passwords are given as bcrypt hashes (``nats-server`` checks a bcrypt hash in place of a password): the registry keeps
no secret, and this file can be read without revealing one. Every password is 256 random bits that runctl made, never
one a person chose, so the hash's work factor buys nothing (no guess of 256 bits ever lands, however cheap each
try) and costs on every connection: the server checks the hash each time a client connects. The hashes use bcrypt's
smallest cost (``BCRYPT_ROUNDS``): about 1 ms of the server's CPU per connection instead of 250 ms at bcrypt's default
of 12, which made a stack's start cost 3 CPU-seconds in ``nats-server`` alone and let any client that can reach the
port (right password or not) keep a core busy with four connection attempts a second.

nats-server 2.16 wires a service import of an account that a reload *introduces* only at the next reload (measured:
a new team's publishes find no responder after one SIGHUP and land after a second), so whoever applies a new
configuration reloads twice (``runctl.stack`` does; deploy/nats/README.md says so).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from runctl.events.payloads import PAYLOADS
from runctl.subjects import PREFIX, SYSTEM_PREFIX, _token, desk_prefix

SERVICES_ACCOUNT = "RUNCTL"
SERVICES_USER = "runctl"
ADMIN_USER = "admin"
#: nats-server's own account (its monitoring and control requests), with a user only where the operators ask for one.
SYSTEM_ACCOUNT = "SYS"
SYSTEM_USER = "system"
#: bcrypt's cost for a password of 256 random bits (see above).
BCRYPT_ROUNDS = 4
#: Seconds nats-server gives a new connection to log in before closing it (its default, 2 s, closed a suite's login
#: whose process was held off the CPU that long on a loaded machine: "Broken pipe" at connect). A connection that
#: does not log in holds no more than a socket for these seconds.
AUTH_TIMEOUT_S = 10
#: Prefix of a team's copy of its runs' events (``view.runctl.<team>.<run>.<event>``).
VIEW_PREFIX = "view"
#: The stream in a team's account that keeps its view.
VIEW_STREAM = "VIEW"
#: Events only runctl's services write: a team's account does not import their subjects.
SERVICES_ONLY = ("run.queued", "run.admitted", "eval.requested", "sandbox.created", "sandbox.destroyed")
#: Of those, the ones a run's own runner does not write either (it announces its sandboxes itself).
LAUNCHER_ONLY = ("run.queued", "run.admitted", "eval.requested")
#: A run login's user name is this prefix, the team and the run id (``run.<team>.<run>``).
RUN_USER_PREFIX = "run."
#: A run login's inboxes (``_INBOX_RUN.<team>.<run>.<id>``): the only subjects it may subscribe to.
RUN_INBOX_PREFIX = "_INBOX_RUN"


def nats_hash(secret: str) -> str:
    """The bcrypt hash ``nats-server`` is given in place of ``secret`` (a password runctl generated)."""
    import bcrypt

    return bcrypt.hashpw(secret.encode(), bcrypt.gensalt(BCRYPT_ROUNDS)).decode()


def team_account(team: str) -> str:
    return f"team-{_token(team, 'team')}"


def view_subject(subject: str) -> str:
    """Where the copy of an event published on ``subject`` reaches its team's account."""
    return f"{VIEW_PREFIX}.{subject}"


def unviewed(subject: str) -> str:
    """The event subject a view subject copies (unchanged when it is not a view subject)."""
    return subject.removeprefix(f"{VIEW_PREFIX}.")


def team_api(team: str) -> str:
    """The prefix under which the services' account reaches a team account's JetStream API (to make its view)."""
    return f"{SYSTEM_PREFIX}.js.{_token(team, 'team')}"


def authored_events() -> list[str]:
    """The events a team may publish about its own runs (a foreground run publishes all of these)."""
    return [p.event_name for p in PAYLOADS if p.event_name not in SERVICES_ONLY]


@dataclass(frozen=True)
class BusLimits:
    """What a team's account may keep in JetStream: its view and the consumers that read it."""

    storage_bytes: int = 256 * 1024**2
    streams: int = 1
    consumers: int = 64

    def jetstream(self) -> dict[str, int]:
        return {
            "max_file": self.storage_bytes,
            "max_mem": 0,
            "max_streams": self.streams,
            "max_consumers": self.consumers,
        }


@dataclass(frozen=True)
class NatsUser:
    name: str
    password_hash: str
    """bcrypt (``$2a$``/``$2b$``), as ``nats-server`` checks it."""
    limits: BusLimits = BusLimits()


@dataclass(frozen=True)
class RunUser:
    """A run's login on the bus (see the module's docstring)."""

    team: str
    run_id: str
    password_hash: str

    @property
    def name(self) -> str:
        return run_user(self.team, self.run_id)

    def entry(self) -> dict[str, object]:
        return {
            "user": self.name,
            "password": self.password_hash,
            "permissions": run_permissions(self.team, self.run_id),
        }


def run_permissions(team: str, run_id: str) -> dict[str, dict[str, list[str]]]:
    """What a run's login may publish and subscribe to, as the configuration and a user JWT both write it."""
    own = f"{PREFIX}.{_token(team, 'team')}.{_token(run_id, 'run id')}"
    return {
        "publish": {
            "allow": [f"{own}.>", f"{desk_prefix(team, run_id)}.*"],
            "deny": [f"{own}.{event}" for event in LAUNCHER_ONLY],
        },
        "subscribe": {"allow": [f"{run_inbox(team, run_id)}.>"]},
    }


def run_user(team: str, run_id: str) -> str:
    return f"{RUN_USER_PREFIX}{_token(team, 'team')}.{_token(run_id, 'run id')}"


def run_of_user(user: str) -> tuple[str, str] | None:
    """(team, run id) of a run login's user name; None for any other user."""
    if not user.startswith(RUN_USER_PREFIX):
        return None
    team, _, run_id = user.removeprefix(RUN_USER_PREFIX).partition(".")
    return (team, run_id) if team and run_id else None


def run_inbox(team: str, run_id: str) -> str:
    return f"{RUN_INBOX_PREFIX}.{_token(team, 'team')}.{_token(run_id, 'run id')}"


def team_subjects(team: str) -> list[str]:
    """The subjects a team's account imports as a service (one per event it may author)."""
    own = f"{PREFIX}.{_token(team, 'team')}"
    return [f"{own}.*.{name}" for name in authored_events()]


def _team_account(team: NatsUser, with_user: bool = True) -> dict[str, object]:
    view = view_subject(f"{PREFIX}.{team.name}.>")
    imports: list[dict[str, object]] = [
        {"service": {"account": SERVICES_ACCOUNT, "subject": s}} for s in team_subjects(team.name)
    ]
    imports.append({"stream": {"account": SERVICES_ACCOUNT, "subject": f"{PREFIX}.{team.name}.>"}, "to": view})
    return {
        "jetstream": team.limits.jetstream(),
        "users": [{"user": team.name, "password": team.password_hash}] if with_user else [],
        "imports": imports,
        # The services make the team's view (and may inspect it); nothing of theirs is reachable from here.
        "exports": [{"service": "$JS.API.>", "accounts": [SERVICES_ACCOUNT]}],
    }


def _services_account(
    services: NatsUser, admin: NatsUser | None, teams: list[NatsUser], runs: list[RunUser]
) -> dict[str, object]:
    users: list[dict[str, object]] = [{"user": services.name, "password": services.password_hash}]
    if admin is not None:
        users.append({"user": admin.name, "password": admin.password_hash})
    users += [run.entry() for run in runs]
    exports: list[dict[str, object]] = []
    imports: list[dict[str, object]] = []
    for team in teams:
        to = [team_account(team.name)]
        exports += [{"service": s, "accounts": to} for s in team_subjects(team.name)]
        exports.append({"stream": f"{PREFIX}.{team.name}.>", "accounts": to})
        api = {"account": team_account(team.name), "subject": "$JS.API.>"}
        imports.append({"service": api, "to": f"{team_api(team.name)}.>"})
    return {"jetstream": "enabled", "users": users, "exports": exports, "imports": imports}


def server_config(
    listen: str,
    store_dir: str,
    services: NatsUser,
    admin: NatsUser | None,
    teams: list[NatsUser],
    runs: list[RunUser] | None = None,
    callout_issuer: str | None = None,
    system: NatsUser | None = None,
) -> str:
    """``nats-server``'s configuration: JetStream at ``store_dir``, listening on ``listen`` (host:port), the
    services' account (with the logins of the runs in ``runs``) and one account per team with its user. With
    ``callout_issuer`` (an account's public nkey), the teams' and the runs' logins are not written but asked of the
    services' auth callout (:mod:`runctl.callout`), which signs them with that key; the users written (the services',
    the admin, the system user) log in as before. With ``system``, nats-server's system account gets that user (the
    callout closes the connections of logins that went through it). JSON is valid NATS configuration syntax, so
    values are written as JSON (no quoting of one's own)."""
    asked = callout_issuer is not None
    accounts: dict[str, object] = {
        SERVICES_ACCOUNT: _services_account(services, admin, teams, [] if asked else runs or [])
    }
    for team in teams:
        accounts[team_account(team.name)] = _team_account(team, with_user=not asked)
    config: dict[str, object] = {"listen": listen, "jetstream": {"store_dir": store_dir}, "accounts": accounts}
    if system is not None:
        accounts[SYSTEM_ACCOUNT] = {"users": [{"user": system.name, "password": system.password_hash}]}
        config["system_account"] = SYSTEM_ACCOUNT
    authorization: dict[str, object] = {"timeout": AUTH_TIMEOUT_S}
    config["authorization"] = authorization
    if asked:
        # Fixed users only: nats-server refuses to reload a changed callout block, and teams come and go.
        written = [u.name for u in (services, admin, system) if u is not None]
        authorization["auth_callout"] = {"issuer": callout_issuer, "account": SERVICES_ACCOUNT, "auth_users": written}
    return "# Generated by runctl from its team registry; edits here are overwritten.\n" + json.dumps(config, indent=2)


def config_runs(text: str) -> list[RunUser]:
    """The run logins of a configuration :func:`server_config` wrote."""
    body = json.loads(text[text.index("{") :])
    found = []
    for user in body.get("accounts", {}).get(SERVICES_ACCOUNT, {}).get("users", []):
        run = run_of_user(user["user"])
        if run is not None:
            found.append(RunUser(run[0], run[1], user["password"]))
    return found


def config_users(text: str) -> list[NatsUser]:
    """The team users of a configuration :func:`server_config` wrote."""
    body = json.loads(text[text.index("{") :])
    users = []
    for name, account in body.get("accounts", {}).items():
        if name == SERVICES_ACCOUNT:
            continue
        limits = account.get("jetstream", {})
        for user in account.get("users", []):
            users.append(
                NatsUser(
                    user["user"],
                    user["password"],
                    BusLimits(limits["max_file"], limits["max_streams"], limits["max_consumers"]),
                )
            )
    return users
