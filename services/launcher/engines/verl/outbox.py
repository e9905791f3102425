"""The events runctl's plugins inside verl's processes hand to the runner: one file per event in the run folder.

verl runs its checkpoint callback on its driver and the agent loops in Ray actors, possibly on other nodes; none of
them holds the run's bus connection. Each writes its event to ``<run>/verl/outbox/`` (on the run's shared
filesystem, like the checkpoints): ``<ns>-<key>.json`` holds the event's key, type and payload, written under a
temporary name and renamed, so a reader never sees half of one. The runner publishes each with its key as the
event id, then moves it to ``sent/``; a runner that dies between the two publishes it again, and JetStream drops
the repeat. Nothing here imports verl or talks to the bus, so a plugin's hook stays cheap and cannot hang on it.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from runctl.events.payloads import BY_TYPE, Payload
from runctl.home import write_atomic

OUTBOX = Path("verl") / "outbox"
SENT = "sent"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def outbox_dir(run_dir: Path) -> Path:
    return run_dir / OUTBOX


def post(run_dir: Path, key: str, payload: Payload) -> Path:
    """Leave one event for the runner to publish; ``key`` is its stable id within the run (``checkpoint.20``)."""
    folder = outbox_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}-{_UNSAFE.sub('_', key)}.json"
    body = {"key": key, "type": payload.type_string(), "data": payload.model_dump(mode="json")}
    write_atomic(folder / name, json.dumps(body))  # hidden until whole: the reader skips dot-files
    return folder / name


class OutboxReader:
    """The runner's side: the events not yet sent, oldest first."""

    def __init__(self, run_dir: Path) -> None:
        self.folder = outbox_dir(run_dir)

    def pending(self) -> list[tuple[Path, str, Payload]]:
        """Each waiting event as (its file, its key, its payload). A file that does not parse is moved aside to
        ``sent/`` with a ``.bad`` suffix (it would block nothing, but would be read again on every poll)."""
        if not self.folder.is_dir():
            return []
        found: list[tuple[Path, str, Payload]] = []
        for path in sorted(p for p in self.folder.iterdir() if p.suffix == ".json" and not p.name.startswith(".")):
            try:
                body = json.loads(path.read_text())
                payload = BY_TYPE[body["type"]].model_validate(body["data"])
                found.append((path, str(body["key"]), payload))
            except (OSError, ValueError, KeyError) as e:
                self._set_aside(path, ".bad", str(e))
        return found

    def sent(self, path: Path) -> None:
        """Mark one event published."""
        self._set_aside(path, "", "")

    def _set_aside(self, path: Path, suffix: str, why: str) -> None:
        done = self.folder / SENT
        done.mkdir(exist_ok=True)
        if why:
            (done / (path.name + ".why")).write_text(why)
        path.replace(done / (path.name + suffix))
