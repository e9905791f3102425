"""The embedded stack's bus, secured from its first start: its nats-server always runs with users, never open.

- ``$RUNCTL_HOME/bus-users.json`` (mode 0600, written once) holds the random passwords of the services' user and of
  the admin, with their bcrypt hashes.
- ``$RUNCTL_HOME/nats.conf`` (mode 0600) is nats-server's configuration: those two users in the services' account and
  one account per team of the registry, as :mod:`runctl.natsauth` lays them out — the same file
  ``runctl team nats-config`` writes for a shared cluster's bus.
- The supervisor keeps that file in step with the team registry (:class:`runctl.stack.TeamSync`): when the
  registry's key-value stream moves, it rewrites the file if the teams' users differ, reloads nats-server (SIGHUP,
  twice: see :mod:`runctl.natsauth`) and makes each team's view, then records the registry sequence it applied in
  ``bus-auth.json``; ``runctl team add|rotate|remove`` returns once the bus has taken its change, so a rotated token
  is cut off before the command ends.

Who logs in how: the services as the services' user (``RUNCTL_NATS_URL`` carries it, set by the supervisor); each
runner the launcher starts with its run's own login (:mod:`runctl.runlogins`, applied by the same supervisor); a
team's CLI and SDK with the team's token; and the CLI of whoever started the
stack, when no token is given, as the admin — it can read the users file, which no other account can.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from runctl.home import StackState, home, is_same_process, read_stack_state
from runctl.natsauth import (
    ADMIN_USER,
    SERVICES_USER,
    NatsUser,
    RunUser,
    config_runs,
    config_users,
    nats_hash,
    server_config,
)

USERS_FILE = "bus-users.json"
CONFIG_FILE = "nats.conf"
APPLIED_FILE = "bus-auth.json"


@dataclass(frozen=True)
class Login:
    user: str
    password: str
    password_hash: str

    def url(self, url: str) -> str:
        """``url`` with this login in it (``nats://user:password@host:port``)."""
        return with_login(url, self.user, self.password)


def with_login(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"))


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the first byte, replacing it in one step."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)


def stack_logins(base: Path, create: bool = False) -> dict[str, Login] | None:
    """The services' and the admin's logins of the stack kept in ``base``; with ``create``, made (once) when there
    are none. None when there are none, or the file cannot be read (another account's stack)."""
    path = base / USERS_FILE
    try:
        doc = json.loads(path.read_text())
        return {user: Login(user, doc[user]["password"], doc[user]["bcrypt"]) for user in (SERVICES_USER, ADMIN_USER)}
    except FileNotFoundError:
        if not create:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    doc = {}
    for user in (SERVICES_USER, ADMIN_USER):
        password = secrets.token_urlsafe(32)
        doc[user] = {"password": password, "bcrypt": nats_hash(password)}
    base.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps(doc, indent=2))
    return stack_logins(base)


def config_teams(base: Path) -> list[NatsUser]:
    """The team users in the stack's current ``nats.conf`` (none when there is no file yet)."""
    try:
        text = (base / CONFIG_FILE).read_text()
    except FileNotFoundError:
        return []
    return config_users(text)


def config_run_logins(base: Path) -> list[RunUser]:
    """The run logins in the stack's current ``nats.conf`` (none when there is no file yet)."""
    try:
        text = (base / CONFIG_FILE).read_text()
    except FileNotFoundError:
        return []
    return sorted(config_runs(text), key=lambda u: u.name)


def write_config(
    base: Path, port: int, logins: dict[str, Login], teams: list[NatsUser], runs: list[RunUser] | None = None
) -> None:
    """The stack's ``nats.conf``: listening on 127.0.0.1 only, JetStream under ``base/jetstream``."""
    services, admin = (NatsUser(u, logins[u].password_hash) for u in (SERVICES_USER, ADMIN_USER))
    listen, store = f"127.0.0.1:{port}", str(base / "jetstream")
    text = server_config(listen, store, services, admin, sorted(teams, key=lambda t: t.name), runs)
    write_private(base / CONFIG_FILE, text + "\n")


def applied_seq(base: Path) -> int:
    """The registry sequence the stack's bus has taken (0: none yet)."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        return int(json.loads((base / APPLIED_FILE).read_text())["registry_seq"])
    return 0


def mark_applied(base: Path, seq: int) -> None:
    write_private(base / APPLIED_FILE, json.dumps({"registry_seq": seq}))


def same_server(a: str, b: str) -> bool:
    """True when two NATS URLs name the same host and port (logins aside)."""
    try:
        one, two = urlsplit(a), urlsplit(b)
        return (one.hostname, one.port or 4222) == (two.hostname, two.port or 4222)
    except ValueError:
        return False


def home_stack(url: str) -> StackState | None:
    """The embedded stack recorded in ``$RUNCTL_HOME`` when ``url`` is its bus, else None."""
    state = read_stack_state()
    return state if state is not None and same_server(url, state.nats_url) else None


def admin_login(url: str) -> Login | None:
    """The admin's login when ``url`` is the bus of the embedded stack in ``$RUNCTL_HOME`` and its users file can be
    read (whoever started the stack), else None."""
    with contextlib.suppress(Exception):  # no stack, or an unreadable record: no login of ours to offer
        if home_stack(url) is not None:
            logins = stack_logins(home())
            return logins[ADMIN_USER] if logins else None
    return None


async def wait_applied(url: str, seq: int, timeout_s: float = 20.0) -> None:
    """When ``url`` is the bus of the running embedded stack in ``$RUNCTL_HOME``: wait until its supervisor has
    applied registry sequence ``seq`` to the bus's users. Nothing to wait for on any other bus.

    Raises:
        StackError: the bus did not take it within ``timeout_s``.
    """
    import asyncio
    import time

    from runctl.errors import StackError

    state = home_stack(url)
    if state is None or not is_same_process(state.supervisor):
        return
    deadline = time.monotonic() + timeout_s
    while applied_seq(home()) < seq:
        if time.monotonic() > deadline:
            raise StackError(
                f"the registry has the change, but the stack's bus did not take it within {timeout_s:.0f}s. "
                f"Fix: see {home() / 'logs' / 'supervisor.log'} and nats-server.log beside it; `runctl down` and "
                "`runctl up` rewrite the bus's users from the registry."
            )
        await asyncio.sleep(0.05)
