"""The team registry: each team's quotas and weight (what the launcher admits against) and its token, kept only as
hashes.

A token (``runctl.tokens``: ``rct_<team>.`` and 256 random bits) is shown once when a team is added or its token
rotated; the team it names is who presents it, and the registry checks the rest. The registry keeps two hashes of
it: SHA-256 for the API (a token has too much entropy for a fast hash to matter, and every request is checked), and
bcrypt for ``nats-server``, which checks a bcrypt hash in place of a password
(``runctl.natsauth``): a team connects to the bus as user ``<team>`` with its token as password (``RUNCTL_TOKEN`` or
a credentials file, read by the CLI and SDK for every call).

The registry lives in a JetStream key-value bucket the services read and only an admin writes; every change is a
compare-and-set on the team's entry, so two admins never overwrite each other unseen.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import os
import secrets
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import nats.js.errors
from nats.js.kv import KeyValue

from runctl.bus import Bus, StreamLimits
from runctl.bus.kv import bucket_keys, open_bucket
from runctl.errors import RunctlError
from runctl.events.payloads import RUNS_STREAM
from runctl.natsauth import BusLimits, NatsUser, nats_hash
from runctl.subjects import kv_bucket, team_stream
from runctl.tokens import TEAM_NAME, new_token, team_of_token, token_digest

log = logging.getLogger(__name__)
BUCKET = kv_bucket("teams")
RESERVED = frozenset({"runctl", "admin", "default", "system"})  # the bus's own users, and the default team
MIB = 1024**2
#: A team's storage on the bus when it is given none: its RUNS stream (and its view) and its TRIALS ring, in MiB.
DEFAULT_EVENTS_MB = StreamLimits().runs_max_bytes // MIB
DEFAULT_TRIALS_MB = StreamLimits().trials_max_bytes // MIB
DEFAULT_CONSUMERS = BusLimits().consumers
QUOTA_KEYS = ("gpus", "cpus", "sandboxes", "weight", "events_mb", "trials_mb", "consumers")


class TeamError(RunctlError):
    """A team registry operation that cannot be done (unknown team, name taken, bad name)."""


@dataclass(frozen=True)
class Team:
    name: str
    gpus: float | None = None  # None: no quota of its own (the cluster's size bounds it)
    cpus: float | None = None
    sandboxes: int | None = None
    weight: float = 1.0
    events_mb: int | None = None  # None: DEFAULT_EVENTS_MB (a stream is always bounded)
    trials_mb: int | None = None  # None: DEFAULT_TRIALS_MB
    consumers: int | None = None  # None: DEFAULT_CONSUMERS (an account's consumers are always bounded)
    token_sha256: str = ""
    nats_bcrypt: str = ""
    created: float = 0.0
    rotated: float = 0.0

    def limits(self) -> tuple[float, float, float]:
        """The quotas as numbers (GPUs, CPUs, sandboxes), ``inf`` where the team has none."""

        def limit(quota: float | None) -> float:
            return math.inf if quota is None else float(quota)

        return limit(self.gpus), limit(self.cpus), limit(self.sandboxes)

    def stream_limits(self) -> StreamLimits:
        """Its streams' bounds: RUNS_<team> holds ``events_mb``, TRIALS_<team> turns over at ``trials_mb``."""
        return replace(
            StreamLimits(),
            runs_max_bytes=(self.events_mb or DEFAULT_EVENTS_MB) * MIB,
            trials_max_bytes=(self.trials_mb or DEFAULT_TRIALS_MB) * MIB,
        )

    def nats_user(self) -> NatsUser:
        """Its login and account on the bus; the account's JetStream (its view of its events) holds ``events_mb`` and
        at most ``consumers`` consumers (each watch of a run holds one while it lasts)."""
        limits = BusLimits(self.stream_limits().runs_max_bytes, consumers=self.consumers or DEFAULT_CONSUMERS)
        return NatsUser(self.name, self.nats_bcrypt, limits)

    def accepts(self, token: str) -> bool:
        """True when ``token`` is this team's (compared in constant time)."""
        return bool(self.token_sha256) and hmac.compare_digest(self.token_sha256, token_digest(token))

    def with_token(self, token: str) -> Team:
        return replace(self, token_sha256=token_digest(token), nats_bcrypt=nats_hash(token), rotated=time.time())

    def public(self) -> dict[str, object]:
        """What `team list` shows: everything but the hashes."""
        return {k: v for k, v in asdict(self).items() if k not in ("token_sha256", "nats_bcrypt")}


def check_name(name: str) -> str:
    if not TEAM_NAME.fullmatch(name) or name in RESERVED:
        raise TeamError(
            f"{name!r} cannot be a team name. Fix: 1 to 32 characters, lower-case letters, digits, '-' and '_', "
            f"starting with a letter, and none of {', '.join(sorted(RESERVED))}."
        )
    return name


class TeamRegistry:
    """The registry in its KV bucket (one key per team)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await open_bucket(self.bus.js, BUCKET)
        return self._kv

    async def sequence(self) -> int:
        """The registry's last change, as its stream's sequence (0 before the first): it moves on every add, set,
        rotate and remove."""
        try:
            info = await self.bus.js.stream_info(f"KV_{BUCKET}")
        except nats.js.errors.NotFoundError:
            return 0
        return int(info.state.last_seq)

    async def get(self, name: str) -> Team | None:
        kv = await self._bucket()
        try:
            entry = await kv.get(name)
        except nats.js.errors.KeyNotFoundError:
            return None
        return Team(**json.loads(entry.value)) if entry.value else None

    async def all(self) -> list[Team]:
        await self._bucket()  # made when first asked for: a stack with no team yet has none
        teams = [await self.get(key) for key in await bucket_keys(self.bus.js, BUCKET)]
        return sorted((t for t in teams if t is not None), key=lambda t: t.name)

    async def add(
        self,
        name: str,
        gpus: float | None = None,
        cpus: float | None = None,
        sandboxes: float | None = None,
        weight: float = 1.0,
        events_mb: float | None = None,
        trials_mb: float | None = None,
        consumers: float | None = None,
    ) -> tuple[Team, str]:
        """A new team and its token (the only time the token exists outside its holder). A quota not given (or
        ``inf``) is no quota: the team may use what the cluster has free. Its storage on the bus (``events_mb``,
        ``trials_mb``) and its account's ``consumers`` are always bounded: not given, the defaults."""
        check_name(name)
        quotas = _quotas(gpus, cpus, sandboxes, weight, events_mb, trials_mb, consumers)
        token = new_token(name)
        team = Team(name, **quotas, created=time.time()).with_token(token)  # type: ignore[arg-type]
        kv = await self._bucket()
        try:
            await kv.create(name, json.dumps(asdict(team)).encode())
        except nats.js.errors.KeyWrongLastSequenceError as e:
            raise TeamError(f"team {name} exists already. Fix: `runctl team set {name}` to change it.") from e
        await self.bus.ensure_streams(team.stream_limits(), [name])  # where its events go, before it can send any
        return team, token

    async def update(self, name: str, **changes: float) -> Team:
        """The team with its quotas, weight or storage changed (a compare-and-set on its entry); ``inf`` removes a
        quota. Its streams take a new storage bound at once; a RUNS bound below what its stream holds is refused (a
        smaller TRIALS ring drops its oldest trial events, as a full ring does)."""
        unknown = set(changes) - set(QUOTA_KEYS)
        if unknown:
            raise TeamError(f"a team has no {', '.join(sorted(unknown))}. Fix: change {', '.join(QUOTA_KEYS)}.")
        team, revision = await self._current(name)
        current = {k: getattr(team, k) for k in QUOTA_KEYS}
        changed = replace(team, **_quotas(**(current | changes)))  # type: ignore[arg-type]
        if changed.stream_limits() != team.stream_limits():
            await self._check_fits(changed)
            await self.bus.ensure_streams(changed.stream_limits(), [name])
        await self._write(changed, revision)
        return changed

    async def _check_fits(self, team: Team) -> None:
        """Raises TeamError when the team's RUNS stream holds more than its new bound (lowering it there would make
        JetStream drop recorded events)."""
        try:
            info = await self.bus.js.stream_info(team_stream(RUNS_STREAM, team.name))
        except nats.js.errors.NotFoundError:
            return
        held = int(info.state.bytes)
        if held > team.stream_limits().runs_max_bytes:
            raise TeamError(
                f"team {team.name}'s runs stream holds {held / MIB:.1f} MiB of events, more than events_mb="
                f"{team.events_mb}: lowering it there would drop recorded events. Fix: give events_mb of at least "
                f"{math.ceil(held / MIB)}."
            )

    async def rotate(self, name: str) -> tuple[Team, str]:
        """A new token for the team; the old one stops working (on the bus once its config is reloaded)."""
        team, revision = await self._current(name)
        token = new_token(name)
        rotated = team.with_token(token)
        await self._write(rotated, revision)
        return rotated, token

    async def remove(self, name: str) -> None:
        await self._current(name)
        kv = await self._bucket()
        await kv.purge(name)

    async def by_token(self, token: str) -> Team | None:
        """The team whose token this is, or None."""
        name = team_of_token(token)
        team = await self.get(name) if name else None
        return team if team is not None and team.accepts(token) else None

    async def _current(self, name: str) -> tuple[Team, int]:
        kv = await self._bucket()
        try:
            entry = await kv.get(name)
        except nats.js.errors.KeyNotFoundError:
            entry = None
        if entry is None or not entry.value:
            raise TeamError(f"there is no team {name!r}. Fix: `runctl team list` shows the teams.")
        return Team(**json.loads(entry.value)), int(entry.revision or 0)

    async def _write(self, team: Team, revision: int) -> None:
        kv = await self._bucket()
        try:
            await kv.update(team.name, json.dumps(asdict(team)).encode(), last=revision)
        except nats.js.errors.KeyWrongLastSequenceError as e:
            raise TeamError(
                f"team {team.name} was changed by someone else meanwhile. Fix: run the command again."
            ) from e


def _quotas(
    gpus: float | None,
    cpus: float | None,
    sandboxes: float | None,
    weight: float,
    events_mb: float | None = None,
    trials_mb: float | None = None,
    consumers: float | None = None,
) -> dict[str, float | int | None]:
    """The registry's form of a team's quotas (``None`` for none: not given, or ``inf``) and storage (``None``: the
    default), checked."""
    storage = {"events_mb": events_mb, "trials_mb": trials_mb, "consumers": consumers}
    wrong = [f"{k}={v:g}" for k, v in storage.items() if v is not None and not (math.isfinite(v) and v == int(v) >= 1)]
    if wrong:
        raise TeamError(
            f"a team's storage on the bus and its consumers there are whole numbers, at least 1 (got "
            f"{', '.join(wrong)}); they are always bounded. Fix: give events_mb and trials_mb in MiB (defaults "
            f"{DEFAULT_EVENTS_MB} and {DEFAULT_TRIALS_MB}) and consumers as a count (default {DEFAULT_CONSUMERS})."
        )
    given = {"gpus": gpus, "cpus": cpus, "sandboxes": sandboxes}
    bad = [f"{k}={v:g}" for k, v in given.items() if v is not None and (math.isnan(v) or v < 0)]
    if bad or not (weight > 0 and math.isfinite(weight)):
        raise TeamError(
            f"quotas cannot be negative and the weight must be above 0 (got {', '.join(bad) or 'quotas'}, "
            f"weight={weight:g}). Fix: give quotas ≥ 0 (inf for none) and a weight > 0."
        )
    out: dict[str, float | int | None] = {k: None if v is None or math.isinf(v) else v for k, v in given.items()}
    if out["sandboxes"] is not None:
        if out["sandboxes"] != int(out["sandboxes"]):
            raise TeamError(f"sandboxes={sandboxes:g} is not a whole number. Fix: give a count of sandboxes.")
        out["sandboxes"] = int(out["sandboxes"])
    return out | {"weight": weight} | {k: None if v is None else int(v) for k, v in storage.items()}


def quota_text(value: float | None) -> str:
    """A quota as `team list` shows it."""
    return "-" if value is None else f"{value:g}"


ADMIN_PREFIX = "rca_"


def admin_token_path() -> Path:
    from runctl.home import home

    return home() / "admin-token"


def admin_token(create: bool = False) -> str | None:
    """The tracker API's admin token: ``$RUNCTL_ADMIN_TOKEN``, else the one in ``$RUNCTL_HOME/admin-token``; with
    ``create`` (the tracker, at its start), a new one written there (mode 0600) when there is none — so the embedded
    stack's CLI reads it with no setup."""
    token = os.environ.get("RUNCTL_ADMIN_TOKEN", "").strip()
    if token:
        return token
    path = admin_token_path()
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        if not create:
            return None
    except OSError:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    token = ADMIN_PREFIX + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    log.warning("no admin token was set: wrote a new one to %s (RUNCTL_ADMIN_TOKEN overrides it)", path)
    return token
