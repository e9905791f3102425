"""``$RUNCTL_HOME``: where the embedded stack keeps its state, logs, JetStream store, database and runs."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from runctl.errors import StackError

STATE_FILE = "stack.json"


def home() -> Path:
    """``$RUNCTL_HOME``, or ``~/.runctl``."""
    return Path(os.environ.get("RUNCTL_HOME") or Path.home() / ".runctl")


def private_folder(path: Path) -> Path:
    """``path`` made (with its parents) and readable by its owner only (0700): a run's folder, the home. Parents
    this makes are private too; one that existed keeps its mode."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_uid == os.getuid():
        os.chmod(path, 0o700)
    return path


def private_file(path: Path) -> Path:
    """``path`` made empty if missing, and readable by its owner only (0600): a database before it is opened."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
    if path.stat().st_uid == os.getuid():
        os.chmod(path, 0o600)
    return path


def write_atomic(path: Path, content: str | bytes) -> None:
    """Replace ``path`` with ``content`` in one step: a reader, or a process killed half-way, never sees half a file
    (the new content goes to a hidden temporary file of this process beside it first)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(content, bytes):
            temp.write_bytes(content)
        else:
            temp.write_text(content)
        temp.replace(path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


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
        write_atomic((base or home()) / STATE_FILE, json.dumps(asdict(self), indent=2))


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


OWNED_DIR = "owned"
"""``$RUNCTL_HOME/owned/<name>.json``: process groups the stack's services started beyond its own children (the
launcher's Ray head), so that ``runctl down`` stops them too, even when the service that started one is dead."""


@dataclass
class OwnedGroup:
    """A process group a service started (its leader's PID and start time), with what the service needs to find
    it again (``extra``: a Ray head's URL and temp folder)."""

    name: str
    pid: int
    start_ticks: int
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def record(self) -> ProcessRecord:
        return ProcessRecord(self.pid, self.start_ticks)


def own_group(name: str, pid: int, extra: dict[str, str] | None = None, base: Path | None = None) -> OwnedGroup:
    """Record the process group led by ``pid`` as the stack's to stop (``runctl down`` stops it)."""
    group = OwnedGroup(name, pid, process_start_ticks(pid) or 0, dict(extra or {}))
    folder = private_folder((base or home()) / OWNED_DIR)  # a record may hold its group's secret (a Ray token)
    write_atomic(folder / f"{name}.json", json.dumps(asdict(group)))
    return group


def disown_group(name: str, base: Path | None = None) -> None:
    ((base or home()) / OWNED_DIR / f"{name}.json").unlink(missing_ok=True)


def owned_groups(base: Path | None = None) -> list[OwnedGroup]:
    """Every recorded group (alive or not); an unreadable record is skipped."""
    found = []
    for path in sorted(((base or home()) / OWNED_DIR).glob("*.json")):
        try:
            found.append(OwnedGroup(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return found


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of a process group."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def stop_group(pgid: int, grace_s: float = 5.0) -> bool:
    """SIGTERM a process group, then SIGKILL what is left after ``grace_s``; wait until none of it lives (bounded).

    Returns:
        True when no process of the group is left.
    """
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not group_members(pgid):
                return True
            time.sleep(0.05)
    return not group_members(pgid)
