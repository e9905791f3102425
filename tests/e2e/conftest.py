"""Fixtures of the end-to-end tests: the runctl command as a user runs it, and an embedded stack it started."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runctl.home import read_stack_state
from runctl.ports import free_ports
from tests.conftest import ROOT, SANDBOX_CGROUP

RUNCTL = str(Path(sys.executable).parent / "runctl")
# How long `runctl up` may take in a test: its 60 s serve a user's idle machine, while a test's stack may start
# beside a vLLM compile on the other worker (five services importing on two busy cores took over 60 s in CI).
UP_TIMEOUT_S = 300
UP_ENV = {"RUNCTL_UP_TIMEOUT": str(UP_TIMEOUT_S)}
PREVIEW = ROOT / "configs" / "examples" / "preview.env"


@dataclass
class Cli:
    home: Path
    env: dict[str, str]

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 120, **env: str
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [RUNCTL, *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=max(timeout, UP_TIMEOUT_S + 60) if args[:1] == ("up",) else timeout,
            cwd=ROOT,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"runctl {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
            )
        return result


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    # No runctl setting of the test process, but its worker's cgroup parent of local sandboxes (tests/conftest.py).
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNCTL_") or k == SANDBOX_CGROUP}
    env["RUNCTL_HOME"] = str(tmp_path / "home")
    env |= UP_ENV
    return Cli(tmp_path / "home", env)


def admin_bus_url(home: Path) -> str:
    """The embedded stack's bus with its admin's login (what the CLI of the stack's owner logs in with)."""
    from runctl.natsauth import ADMIN_USER
    from runctl.stackbus import stack_logins

    state, logins = read_stack_state(home), stack_logins(home)
    assert state is not None and logins is not None
    return logins[ADMIN_USER].url(state.nats_url)


def port_args() -> list[str]:
    """``runctl up``'s two port options, on two distinct free ports."""
    nats_port, tracker_port = free_ports(2)
    return ["--nats-port", str(nats_port), "--tracker-port", str(tracker_port)]


@pytest.fixture
def stack(cli: Cli) -> Iterator[Cli]:
    cli("up", *port_args())
    yield cli
    cli("down", check=False)
    state = read_stack_state(cli.home)
    assert state is None
