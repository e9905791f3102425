"""What the workers of one pytest run share: a folder made by the process that starts them, and a lock.

``pytest -n 2`` (pytest-xdist) runs the suite in worker processes. Servers that are safe to share across them (one
dockerd with its base image) and files that are made once per checkout (the tiny model) are made by whichever
worker asks first, under an exclusive lock, and found by the others afterwards; the process that started the
workers (or pytest itself, without xdist) stops the shared servers when the run ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

ENV = "PYTEST_RUNCTL_SHARED"  # not RUNCTL_*: the CLI tests drop those from the environments they make


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created) for the block: one process at a time, across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def open_run() -> bool:
    """Make the run's shared folder and name it in the environment (which the workers inherit); False when an
    enclosing run made it already (a worker, or pytest started by a test)."""
    if os.environ.get(ENV):
        return False
    os.environ[ENV] = tempfile.mkdtemp(prefix="runctl-tests-")
    return True


def folder() -> Path:
    """The run's shared folder (made here when this process runs the tests without a controller that made it)."""
    open_run()
    return Path(os.environ[ENV])


def close_run() -> None:
    shared = os.environ.pop(ENV, None)
    if shared:
        shutil.rmtree(shared, ignore_errors=True)
