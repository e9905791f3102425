"""The Python SDK: what the CLI, an agent plugin or a notebook calls to submit, watch and cancel runs.

async with RunctlClient() as client:
    run = await client.submit("configs/examples/preview.env")
    async for event in client.watch(run.run_id):
        print(event.name)
"""

from __future__ import annotations

import asyncio
import getpass
import os
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from runctl.bus.client import Bus
from runctl.config.loader import ResolvedConfig, load_config
from runctl.errors import DuplicateRunError, RunctlError, RunNotFoundError, TrackerError
from runctl.events import CancelRequested, ConfigSubmitted, Event, new_event, parse_event
from runctl.events.payloads import RUNS_STREAM, TRIALS_STREAM
from runctl.events.state import TERMINAL, target_state
from runctl.home import read_stack_state
from runctl.natsauth import VIEW_STREAM, view_subject
from runctl.subjects import run_filter, team_stream

DEFAULT_TRACKER_URL = "http://127.0.0.1:8750"
SOURCE = "/runctl/sdk"


def tracker_url(explicit: str | None = None) -> str:
    """The tracker API: explicit, else ``$RUNCTL_TRACKER_URL``, else the embedded stack's, else the default."""
    if explicit:
        return explicit.rstrip("/")
    if os.environ.get("RUNCTL_TRACKER_URL"):
        return os.environ["RUNCTL_TRACKER_URL"].rstrip("/")
    state = read_stack_state()
    return state.tracker_url if state is not None else DEFAULT_TRACKER_URL


def bearer(token: str | None) -> dict[str, str]:
    """The HTTP header that carries ``token`` (none when there is no token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def api_token() -> str | None:
    """The token the tracker API is asked with: the team's (``RUNCTL_TOKEN``, or the credentials file), else the
    admin's (``RUNCTL_ADMIN_TOKEN``, else the embedded stack's ``$RUNCTL_HOME/admin-token``)."""
    from runctl.bus.client import credentials
    from runctl.teams import admin_token

    login = credentials()
    return login[1] if login is not None else admin_token()


def dashboard_url(explicit: str | None = None) -> str:
    """The dashboard's URL (the tracker serves it), once the tracker has answered.

    Raises:
        TrackerError: the tracker does not answer there.
    """
    import httpx  # local: the CLI's light commands never pay for it

    url = tracker_url(explicit) + "/"
    try:
        httpx.get(url + "healthz", timeout=3).raise_for_status()
    except httpx.HTTPError as e:
        raise TrackerError(
            f"the tracker does not answer at {url} ({type(e).__name__}). "
            "Fix: start the stack with `runctl up`, or set RUNCTL_TRACKER_URL to your cluster's tracker."
        ) from e
    return url


RUN_ID_RANDOM_BYTES = 8
"""64 random bits: two submissions of one experiment on one day collide with odds of about 1 in 10^19 per pair (a
duplicate would be dropped by JetStream's duplicate window; :meth:`RunctlClient.submit` refuses to let that pass)."""


def new_run_id(exp_name: str, now: datetime | None = None) -> str:
    """``<exp>-<yyyymmdd>-<16 hex>``: readable, sortable by day, and 64 random bits."""
    day = (now or datetime.now(UTC)).strftime("%Y%m%d")
    return f"{exp_name.lower().replace('_', '-')}-{day}-{secrets.token_hex(RUN_ID_RANDOM_BYTES)}"


def submitter() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class Submitted:
    """A published submission."""

    run_id: str
    team: str
    event: Event


Via = Literal["cli", "sdk", "launcher", "foreground"]


def submission_event(resolved: ResolvedConfig, via: Via = "sdk", run_id: str | None = None) -> Event:
    """The ``config.submitted`` event for a resolved config (secrets redacted), with a fresh run id unless given."""
    model = resolved.model
    if via != "foreground":
        refuse_carried_secrets(resolved)
    run_id = run_id or new_run_id(model.exp_name)
    payload = ConfigSubmitted(
        run_type=resolved.run_type,
        project_name=model.project_name,
        exp_name=model.exp_name,
        engine=model.engine,
        priority=model.priority,
        config_path=str(Path(resolved.path).resolve()) if resolved.path != "<config>" else resolved.path,
        raw_config=resolved.redacted_text(),
        resolved=resolved.redacted_settings(),
        submitter=submitter(),
        via=via,
    )
    return new_event(payload, team=model.team, run_id=run_id, source=SOURCE, event_id=f"{run_id}.submitted")


def refuse_carried_secrets(resolved: ResolvedConfig) -> None:
    """A submitted run is carried from its ``config.submitted`` event, where secrets are ``***``: a key that holds
    a secret inside its value (``AGENT_COMMAND="K=${WANDB_API_KEY} …"``) would run with ``***`` in its place.

    Raises:
        ConfigError: one issue per such key.
    """
    keys = resolved.keys_holding_secrets()
    if not keys:
        return
    from runctl.errors import ConfigError, ConfigIssue

    issues = []
    for key in keys:
        source = resolved.settings[key].source
        path, _, line = source.rpartition(":")
        issues.append(
            ConfigIssue(
                path or resolved.path,
                int(line) if line.isdigit() else None,
                key,
                f"{key} holds the value of a secret it interpolates. Secrets never travel on the bus, so a submitted "
                f"run would run with *** in its place.",
                "run it here with `runctl run` (the secret stays in this process), or let the program read the "
                "secret where the run executes instead of passing it in the config.",
                code="schema.secret_in_value",
            )
        )
    raise ConfigError(issues)


class RunctlClient:
    """Talks to the bus (submit, cancel, watch) and the tracker API (runs, show).

    Args:
        nats_url: bus URL; None resolves ``$RUNCTL_NATS_URL``, the embedded stack, then localhost.
        tracker: tracker API URL; None resolves likewise.
    """

    def __init__(self, nats_url: str | None = None, tracker: str | None = None) -> None:
        self._nats_url = nats_url
        self.tracker = tracker_url(tracker)
        self._bus: Bus | None = None

    async def __aenter__(self) -> RunctlClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def bus(self) -> Bus:
        if self._bus is None:
            self._bus = await Bus.connect(self._nats_url, name="runctl-sdk")
        return self._bus

    async def close(self) -> None:
        if self._bus is not None:
            await self._bus.close()
            self._bus = None

    async def submit(self, config: str | Path | ResolvedConfig, *, via: Via = "sdk") -> Submitted:
        """Resolve (if given a path), then publish ``config.submitted``.

        Raises:
            ConfigError: the config has problems; nothing is published.
            BusUnreachableError / PublishError: the bus did not take it.
            DuplicateRunError: JetStream already had a submission with this run id and dropped this one.
        """
        resolved = config if isinstance(config, ResolvedConfig) else load_config(config)
        event = submission_event(resolved, via=via)
        return await self.publish_submission(event)

    async def publish_submission(self, event: Event) -> Submitted:
        """Publish a ``config.submitted`` event, refusing to report a dropped duplicate as a submission.

        Raises:
            DuplicateRunError: JetStream's acknowledgement says it already had this event id.
        """
        bus = await self.bus()
        if bus.team is None:
            await bus.ensure_streams()  # the embedded stack's open bus; on a shared cluster the services made them
        elif event.team != bus.team:
            raise RunctlError(
                f"the config says TEAM={event.team} but your token is team {bus.team}'s: the bus takes events of "
                f"your own team only, so nothing was sent. Fix: set TEAM={bus.team}, or use team {event.team}'s "
                "token.",
                run_id=event.runid,
                team=event.team,
            )
        ack = await bus.publish(event)
        if ack.duplicate:
            raise DuplicateRunError(
                f"a run with the id {event.runid} was already submitted, so JetStream dropped this submission as a "
                "duplicate: nothing new will run. Fix: submit again without choosing the id (a fresh one is drawn).",
                run_id=event.runid,
                team=event.team,
            )
        return Submitted(run_id=event.runid, team=event.team, event=event)

    async def cancel(self, run_id: str, *, team: str | None = None, reason: str = "") -> Event:
        """Ask the launcher to cancel a run; the run's team comes from the tracker unless given."""
        if team is None:
            team = (await self.get_run(run_id, events=False))["run"]["team"]
        assert team is not None
        payload = CancelRequested(requested_by=submitter(), reason=reason)
        event = new_event(payload, team=team, run_id=run_id, source=SOURCE)
        await (await self.bus()).publish(event)
        return event

    async def watch(
        self, run_id: str, *, include_trials: bool = True, trial_grace_s: float = 5.0
    ) -> AsyncIterator[Event]:
        """Every event of a run from its beginning, live; the event that ends the run comes last.

        RUNS and TRIALS are read by two ordered consumers, so their events interleave as they arrive; the end
        event says how many trials the run published, and is held back until they have all been delivered, or
        until no trial has come for ``trial_grace_s`` (TRIALS is bounded by age and size, so old trials may be gone).
        """
        bus = await self.bus()
        queue: asyncio.Queue[Event] = asyncio.Queue()

        async def push(msg: Any) -> None:
            event = parse_event(msg.data)
            if include_trials or event.stream != TRIALS_STREAM:
                await queue.put(event)

        if bus.team is not None:  # a team reads the copy of its runs' events in its own account (runctl.natsauth)
            filtered = view_subject(run_filter(run_id, bus.team))
            subs = [await bus.js.subscribe(filtered, stream=VIEW_STREAM, ordered_consumer=True, cb=push)]
        else:
            team = await bus.team_of_run(run_id)
            if team is None:
                raise RunctlError(
                    f"no run {run_id} was submitted on this bus, so there is nothing to watch. Fix: check the id "
                    "with `runctl status`.",
                    run_id=run_id,
                )
            families = [RUNS_STREAM, TRIALS_STREAM] if include_trials else [RUNS_STREAM]
            subs = [
                await bus.js.subscribe(
                    run_filter(run_id, team), stream=team_stream(family, team), ordered_consumer=True, cb=push
                )
                for family in families
            ]
        ending: Event | None = None
        trial_ids: set[str] = set()
        try:
            while True:
                if ending is None:
                    event = await queue.get()
                else:
                    try:
                        event = await asyncio.wait_for(queue.get(), trial_grace_s)
                    except TimeoutError:
                        yield ending
                        return
                if event.stream == TRIALS_STREAM:
                    trial_ids.add(event.id)
                    yield event
                elif target_state(event.name) in TERMINAL:
                    ending = event
                else:
                    yield event
                if ending is not None and (not include_trials or len(trial_ids) >= _num_trials(ending)):
                    yield ending
                    return
        finally:
            for sub in subs:
                await sub.unsubscribe()

    async def _get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        import httpx  # local: the CLI's light commands never pay for it

        headers = bearer(api_token())
        try:
            async with httpx.AsyncClient(base_url=self.tracker, timeout=10, headers=headers) as http:
                response = await http.get(path, params={k: v for k, v in (params or {}).items() if v is not None})
        except httpx.HTTPError as e:
            raise TrackerError(
                f"cannot reach the tracker at {self.tracker} ({type(e).__name__}). "
                "Fix: start the stack with `runctl up`, or set RUNCTL_TRACKER_URL."
            ) from e
        if response.status_code == 401:
            raise TrackerError(f"the tracker at {self.tracker} refused: {response.json().get('detail', '')}")
        if response.status_code == 404:
            raise RunNotFoundError(response.json().get("detail", f"not found: {path}"))
        if response.status_code >= 400:
            raise TrackerError(f"tracker answered {response.status_code} for {path}: {response.text[:300]}")
        return response.json()

    async def list_runs(self, **filters: Any) -> dict[str, Any]:
        """Runs recorded by the tracker (filters: team, state, run_type, exp_name, limit, offset)."""
        result: dict[str, Any] = await self._get("/api/runs", filters)
        return result

    async def usage(self, *, team: str | None = None, since: str | None = None) -> dict[str, Any]:
        """What each team and run used (GPU-hours by role, CPU-hours, sandbox-minutes, tokens), from ``since`` (an
        ISO 8601 date or time) when given."""
        result: dict[str, Any] = await self._get("/api/usage", {"team": team, "since": since})
        return result

    async def get_run(self, run_id: str, *, events: bool = True) -> dict[str, Any]:
        """One run, its resolved config, and (by default) its events in order.

        Raises:
            RunNotFoundError: the tracker has no such run.
        """
        try:
            result: dict[str, Any] = await self._get(f"/api/runs/{run_id}", {"events": str(events).lower()})
        except RunNotFoundError as e:
            raise RunNotFoundError(
                f"no run {run_id!r} is recorded by the tracker at {self.tracker}. "
                "Fix: check the id with `runctl runs`.",
                run_id=run_id,
            ) from e
        return result


async def import_events(client: RunctlClient, run_dir: Path) -> tuple[int, int]:
    """Publish the events a foreground run recorded in ``<run_dir>/events.jsonl``; return (new to the bus, in all).

    Raises:
        TrackerError: the folder has no readable events.jsonl.
        EventError: a line is not a runctl event.
    """
    path = Path(run_dir) / "events.jsonl"
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except OSError as e:
        raise TrackerError(
            f"cannot read {path} ({e.strerror or e}). Fix: give the folder `runctl run` printed as its results."
        ) from e
    events = [parse_event(line) for line in lines if line.endswith("}")]  # a line cut short by a kill is skipped
    bus = await client.bus()
    await bus.ensure_streams()
    acks = await bus.publish_many(events)
    return sum(not ack.duplicate for ack in acks), len(events)


def _num_trials(ending: Event) -> int:
    return int(getattr(ending.data, "num_trials", 0))
