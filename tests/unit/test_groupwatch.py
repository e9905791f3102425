"""The group watcher under each vLLM replica: the server's exit code comes through, its whole process group goes
down with it, and the private temporary folder it was given (where vLLM leaves its sockets) is removed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from runctl.home import group_members
from tests.conftest import wait_until

WATCH = [sys.executable, "-m", "services.launcher.rollout.groupwatch", "--"]


def test_the_exit_code_comes_through_and_nothing_of_the_group_or_its_temporary_folder_stays(tmp_path: Path) -> None:
    told = tmp_path / "tmpdir"
    script = f'echo "$TMPDIR" > {told}; : > "$TMPDIR/socket"; sleep 600 & exit 3'
    proc = subprocess.Popen([*WATCH, "sh", "-c", script], start_new_session=True)
    assert proc.wait(timeout=60) == 3
    private = Path(told.read_text().strip())
    assert private.name.startswith("runctl-group-") and private.parent != tmp_path
    wait_until(lambda: not group_members(proc.pid), 30, "the background sleep to be stopped with its group")
    assert not private.exists()


def test_when_the_sentinel_dies_the_server_is_stopped_and_its_folder_removed(tmp_path: Path) -> None:
    told = tmp_path / "tmpdir"
    proc = subprocess.Popen([*WATCH, "sh", "-c", f'echo "$TMPDIR" > {told}; exec sleep 600'], start_new_session=True)
    wait_until(lambda: told.exists() and told.read_text().strip() != "", 30, "the server to start")
    private = Path(told.read_text().strip())
    assert private.is_dir()
    os.kill(proc.pid, signal.SIGKILL)  # as Ray kills an actor's child
    proc.wait(timeout=30)
    wait_until(lambda: not group_members(proc.pid), 30, "the server to be stopped with its group")
    wait_until(lambda: not private.exists(), 30, "the private temporary folder to be removed")


def test_a_command_that_cannot_start_exits_127_and_leaves_nothing(tmp_path: Path) -> None:
    # The watcher's own temporary folder, where it makes the command's private one: another test's replica, on
    # another worker, makes its own in the machine's /tmp meanwhile.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = subprocess.run(
        [*WATCH, str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert done.returncode == 127 and "cannot start" in done.stderr and "Traceback" not in done.stderr
    assert list(tmp.iterdir()) == []


def test_the_command_gets_a_private_tmpdir_but_keeps_torchs_compile_cache_outside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.launcher.rollout.groupwatch import command_env

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    private = str(tmp_path / "private")
    env = command_env(private)
    assert env["TMPDIR"] == private
    cache = Path(env["TORCHINDUCTOR_CACHE_DIR"])
    assert cache.parent == Path(tempfile.gettempdir()) and cache.name.startswith("torchinductor_")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert command_env(private)["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")  # a setting given is kept
