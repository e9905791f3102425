"""``runctl run CONFIG``: one run carried in the foreground by the same runner the launcher uses, without a bus.

The run's events (the same envelopes the bus would carry, with the same deterministic ids) are appended to
``<run folder>/events.jsonl`` and handed to an observer (the CLI's progress display); how far the run got is kept
in ``<run folder>/progress.json``, so ``runctl run CONFIG --run-id ID`` resumes a run that was killed: finished
trials are not run again and none is recorded twice.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runctl.config import RunConfig
from runctl.errors import RunctlError
from runctl.events import Event, RunCancelled, RunFailed, RunSucceeded, new_event
from runctl.events.payloads import Payload
from services.launcher.engines import RunContext, make_engine
from services.launcher.errors import EngineError, RunCancelledError
from services.launcher.service import revalidate, run_dir_for

EVENTS_FILE = "events.jsonl"
PROGRESS_FILE = "progress.json"
Observer = Callable[[Event], None]


class EventLog:
    """Appends a run's events to ``events.jsonl``; an id already there is not written again (a resumed run)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: set[str] = set()
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    self.seen.add(json.loads(line)["id"])
                except (ValueError, KeyError):
                    continue  # a line cut short by a kill

    def append(self, event: Event) -> bool:
        if event.id in self.seen:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(event.to_json().decode() + "\n")
        self.seen.add(event.id)
        return True


async def run_foreground(
    config: RunConfig,
    run_id: str,
    observer: Observer,
    progress_hook: Callable[[int, int], None] | None = None,
) -> tuple[Event, Path]:
    """Carry the run to its end; return its end event and its folder. SIGINT/SIGTERM cancel it cleanly."""
    team = config.team
    run_dir = run_dir_for(team, run_id, config)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = EventLog(run_dir / EVENTS_FILE)
    progress_path = run_dir / PROGRESS_FILE
    progress: dict[str, Any] = json.loads(progress_path.read_text()) if progress_path.exists() else {}

    def record(payload: Payload, key: str) -> Event:
        event = new_event(payload, team=team, run_id=run_id, source="runctl run", event_id=f"{run_id}.{key}")
        if log.append(event):
            observer(event)
        return event

    async def emit(payload: Payload, key: str) -> None:
        record(payload, key)

    async def save(state: dict[str, Any]) -> None:
        temp = progress_path.with_suffix(".tmp")
        temp.write_text(json.dumps(state))
        temp.replace(progress_path)

    cancelled = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, cancelled.set)
    ctx = RunContext(run_id, team, config, run_dir, emit, save, progress, cancelled)
    if progress_hook is not None:
        ctx.progress_hook = progress_hook
    end: Payload
    try:
        await revalidate(ctx)
        outcome = await make_engine(config.engine).run(ctx)
        end = RunSucceeded(
            summary=outcome.summary, score=outcome.score, synthetic=outcome.synthetic, num_trials=ctx.num_trials
        )
    except RunCancelledError:
        end = RunCancelled(requested_by="signal", phase=ctx.phase, num_trials=ctx.num_trials)
    except EngineError as e:
        end = RunFailed(phase=e.phase, error_type=type(e).__name__, message=str(e), num_trials=ctx.num_trials)
    except RunctlError as e:
        end = RunFailed(phase=ctx.phase, error_type=type(e).__name__, message=str(e), num_trials=ctx.num_trials)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    await save({**ctx.progress, "ended": end.event_name})
    return record(end, "end"), run_dir
