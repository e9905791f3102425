"""Every error runctl raises on purpose.

    RunctlError                      base; ``str(e)`` is a complete message with the fix
    ├── ConfigError                  a config file or value is wrong (carries one ConfigIssue per problem)
    ├── ChecksFailedError            a config resolved, but checks of it are fatal: nothing was launched
    ├── EventError                   a message on the bus is not a runctl event we understand
    ├── BusError                     talking to NATS JetStream failed
    │   ├── BusUnreachableError      no NATS server answers at the URL
    │   ├── DeskRefusedError         the launcher's desk refused what a runner asked about its run
    │   └── PublishError             the server did not acknowledge a publish
    │       └── DuplicateRunError    a submission JetStream dropped: its run id was already submitted
    ├── StackError                   the embedded stack (``runctl up`` / ``down``) could not start or stop
    ├── TaskError                    a Harbor task folder or a task index is missing or malformed
    └── TrackerError                 the tracker API failed or is unreachable
        └── RunNotFoundError         no run with that id is recorded

Each service adds its own branch under ``RunctlError`` in its ``errors.py``: ``LauncherError`` (the launcher and
its engines), ``SandboxError`` (sandbox backends), ``ProxyError`` (the proxy's HTTP errors), ``RebuildError`` (the
tracker's rebuild). A message ends with ``Fix: …`` where there is one; :attr:`RunctlError.fix` reads it back.

The CLI catches ``RunctlError`` at the top and prints ``ErrorType: message``; services turn errors raised by a
message handler into published events. Everything else propagates, chained with ``from``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass


class RunctlError(Exception):
    """Base of all runctl errors.

    Args:
        message: what happened, what it causes, and the fix.
        run_id: the run concerned, where there is one.
        team: the team concerned, where there is one.
        subject: the bus subject concerned, where there is one.
    """

    def __init__(
        self, message: str, *, run_id: str | None = None, team: str | None = None, subject: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.run_id = run_id
        self.team = team
        self.subject = subject

    @property
    def what(self) -> str:
        """The message without the fix it names (the text before its last ``Fix:``)."""
        what, found, _ = self.message.rpartition("Fix: ")
        return what.strip() if found else self.message

    @property
    def fix(self) -> str:
        """The fix the message names (the text after its last ``Fix:``), or "" when it names none."""
        _, found, fix = self.message.rpartition("Fix: ")
        return fix.strip() if found else ""


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a config: where it is, what is wrong, and how to fix it."""

    path: str
    line: int | None
    key: str | None
    message: str
    fix: str = ""
    code: str = "schema.value"
    """Check id, e.g. ``schema.unknown_key``."""

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        text = f"{where}: {self.message}"
        return f"{text} Fix: {self.fix}" if self.fix else text


class ConfigError(RunctlError):
    """One or more problems in a config. ``issues`` lists them all; ``line`` is the first one's line."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        if not issues:
            raise ValueError("ConfigError needs at least one issue")
        self.issues = list(issues)
        if len(issues) == 1:
            text = str(issues[0])
        else:
            text = f"{len(issues)} problems in the config:\n" + "\n".join(f"  - {i}" for i in issues)
        super().__init__(text)

    @property
    def path(self) -> str:
        return self.issues[0].path

    @property
    def line(self) -> int | None:
        return self.issues[0].line


class ChecksFailedError(RunctlError):
    """Fatal checks stopped a launch; the message names each and the first fix (the checks were printed above)."""

    def __init__(self, fatal: list[tuple[str, str, str]], what: str = "nothing was launched") -> None:
        """``fatal``: (check id, message, fix) of each fatal check."""
        shown = "; ".join(f"{check_id}: {message}" for check_id, message, _ in fatal[:3])
        more = f" (and {len(fatal) - 3} more)" if len(fatal) > 3 else ""
        fix = next((f for _, _, f in fatal if f), "")
        super().__init__(f"{len(fatal)} fatal check(s), so {what}: {shown}{more}." + (f" Fix: {fix}" if fix else ""))
        self.checks = fatal


class EventError(RunctlError):
    """A message that is not a valid runctl event (bad JSON, unknown type, payload not matching its model)."""


class BusError(RunctlError):
    """Talking to NATS JetStream failed."""


class BusUnreachableError(BusError):
    """No NATS server answers at the configured URL."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"cannot reach the runctl bus at {url} ({reason}). Nothing was sent. "
            "Fix: start the embedded stack with `runctl up`, or set RUNCTL_NATS_URL to your cluster's NATS URL."
        )
        self.url = url


class DeskRefusedError(BusError):
    """The launcher's desk refused a runner's request (another run's, or one its run may no longer make)."""


class PublishError(BusError):
    """JetStream did not acknowledge a publish."""


class DuplicateRunError(PublishError):
    """JetStream acknowledged a submission as a duplicate: a run with that id was already submitted."""


class StackError(RunctlError):
    """The embedded stack could not be started, inspected or stopped."""


class TrackerError(RunctlError):
    """The tracker API failed or could not be reached."""


class RunNotFoundError(TrackerError):
    """No run with the given id is recorded by the tracker."""


class TaskError(RunctlError):
    """A Harbor task folder or task index is missing or malformed.

    Args:
        path: the file or folder at fault.
        problem: what is wrong.
        fix: how to fix it.
        field: the ``task.toml`` field or index column at fault, where there is one.
    """

    def __init__(self, path: str, problem: str, fix: str, field: str | None = None) -> None:
        where = f"{path} [{field}]" if field else path
        super().__init__(f"{where}: {problem} Fix: {fix}")
        self.path = path
        self.problem = problem
        self.field = field


def log_failure(logger: logging.Logger, what: str, error: BaseException) -> None:
    """Log a failure in one line when it is a runctl error (it names the problem and the fix: a traceback would
    only bury that); with its traceback when it is not (a bug, to be reported with it)."""
    if isinstance(error, RunctlError):
        logger.error("%s: %s: %s", what, type(error).__name__, error.message)
    else:
        logger.error("%s: %s: %s", what, type(error).__name__, error, exc_info=error)
