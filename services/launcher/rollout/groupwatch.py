"""Run a command and take its whole process group down with it: ``python -m ...groupwatch -- ARGV``.

A vLLM server is several processes (the API server, its engine core, the engine's workers). When the Ray actor
that owns a replica dies, Ray SIGKILLs the actor's direct children and a parent-death signal reaches only those:
the API server's own children live on. So the actor starts this program as the leader of a new process group, and
it splits in two:

- the *sentinel* (the actor's child) only waits; it dies with the actor (parent-death signal, or Ray's kill);
- the *watcher* (its child) starts the server in the group and holds the read end of a pipe whose write end only
  the sentinel holds. When the sentinel dies (the pipe reads end-of-file), when it is told to stop (SIGTERM,
  SIGINT), or when the server exits, the watcher signals the whole group: SIGTERM, then SIGKILL for whatever still
  runs after ``GRACE_S``. The sentinel's exit code is the server's.

The command gets a private ``TMPDIR`` that the watcher removes once the group is down: vLLM puts its ZeroMQ
sockets in the temporary folder and leaves them there when it is stopped, a handful for every start. torch's
compile cache stays where it would be without it (``TORCHINDUCTOR_CACHE_DIR``), so the next start reuses it.
"""

from __future__ import annotations

import contextlib
import ctypes
import getpass
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from runctl.home import group_members

GRACE_S = 15.0
PR_SET_PDEATHSIG = 1


def command_env(private_tmp: str) -> dict[str, str]:
    """The command's environment: its private ``TMPDIR``, and torch's compile cache where it would be without it
    (torch keeps it under the temporary folder): vLLM on CPU compiles its kernels with torch's inductor even in eager
    mode, tens of seconds on two cores, and a replica's next start reuses them only from a cache that outlives it."""
    env = {**os.environ, "TMPDIR": private_tmp}
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's arbitrary uid)
        user = str(os.getuid())
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{user}"))
    return env


def others_in_group() -> list[int]:
    """Live processes of this process group other than this one (zombies do not count)."""
    me = os.getpid()
    return [pid for pid in group_members(os.getpgrp()) if pid != me]


def take_down_group(spare: int) -> None:
    """SIGTERM every other process of the group but ``spare`` (the sentinel, which exits with the server's code
    once this watcher is done); SIGKILL whatever still runs after ``GRACE_S``."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    deadline = time.monotonic() + GRACE_S
    sent: set[int] = set()
    while (left := [p for p in others_in_group() if p != spare]) and time.monotonic() < deadline:
        for pid in set(left) - sent:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            sent.add(pid)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-1, os.WNOHANG)  # reap the server, so it does not linger as a zombie
        time.sleep(0.2)
    for pid in others_in_group():
        if pid != spare:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1 :] if "--" in argv else argv[1:]
    if not command:
        print("usage: python -m services.launcher.rollout.groupwatch -- COMMAND...", file=sys.stderr)
        return 2
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    read_end, write_end = os.pipe()
    watcher = os.fork()
    if watcher:  # the sentinel
        os.close(read_end)
        _, status = os.waitpid(watcher, 0)
        return os.waitstatus_to_exitcode(status)
    os.close(write_end)
    libc.prctl(PR_SET_PDEATHSIG, 0)
    stop = {"asked": False}

    def asked(signum: int, frame: object) -> None:
        stop["asked"] = True

    signal.signal(signal.SIGTERM, asked)
    signal.signal(signal.SIGINT, asked)
    private_tmp = tempfile.mkdtemp(prefix="runctl-group-")
    code: int | None = None
    try:
        child = subprocess.Popen(command, pass_fds=(), env=command_env(private_tmp))
    except OSError as e:
        print(f"groupwatch: cannot start {command[0]}: {e}", file=sys.stderr)
        code = 127
    try:
        while code is None and not stop["asked"]:
            if select.select([read_end], [], [], 1.0)[0]:
                break  # end-of-file: the sentinel, and so the actor, is gone
            code = child.poll()
        take_down_group(spare=os.getppid())
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)
    os._exit(code if code is not None else 143)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
