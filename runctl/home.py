"""``$RUNCTL_HOME``: where the embedded stack keeps its state, logs, JetStream store, database and runs."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from runctl.errors import StackError

STATE_FILE = "stack.json"


def home() -> Path:
    """``$RUNCTL_HOME``, or ``~/.runctl``."""
    return Path(os.environ.get("RUNCTL_HOME") or Path.home() / ".runctl")


@dataclass
class ProcessRecord:
    """A process the stack started: its PID and the kernel's start time, so a reused PID is never mistaken."""

    pid: int
    start_ticks: int
    restarts: int = 0


@dataclass
class StackState:
    """What ``runctl up`` started, written to ``$RUNCTL_HOME/stack.json``."""

    nats_url: str
    tracker_url: str
    supervisor: ProcessRecord
    children: dict[str, ProcessRecord] = field(default_factory=dict)

    def write(self, base: Path | None = None) -> None:
        path = (base or home()) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)


def read_stack_state(base: Path | None = None) -> StackState | None:
    """The embedded stack's state, or None when no stack was started from this home."""
    path = (base or home()) / STATE_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise StackError(f"{path} is unreadable ({e}). Fix: remove it after checking no stack runs.") from e
    return StackState(
        nats_url=doc["nats_url"],
        tracker_url=doc["tracker_url"],
        supervisor=ProcessRecord(**doc["supervisor"]),
        children={name: ProcessRecord(**rec) for name, rec in doc.get("children", {}).items()},
    )


def process_start_ticks(pid: int) -> int | None:
    """The start time of a live process in clock ticks since boot, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 counts after the parenthesised command name, which may itself contain spaces.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def is_same_process(record: ProcessRecord) -> bool:
    """True if the PID is alive and is the very process recorded (not a reuse of its number)."""
    return process_start_ticks(record.pid) == record.start_ticks
