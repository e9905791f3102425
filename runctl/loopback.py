"""The embedded stack's bus, reached from inside a loopback-only network namespace.

Ray binds the machine's routable address whatever it is told, so as root runctl runs the runner (and so Ray and
vLLM) inside a new network namespace whose only interface is loopback (``scripts/demo.sh``). That loopback is not
the host's, so the stack's bus (``127.0.0.1:PORT`` on the host, where the dashboard is served too) is out of
reach from it. Filesystems are shared, so a Unix socket crosses: the host side listens on a socket and connects
each client to the bus; the namespace side listens on ``127.0.0.1:PORT`` inside and connects each client to the
socket. Nothing listens on anything but loopback and that socket.

    python -m runctl.loopback host SOCKET            in the host namespace, until SIGTERM
    python -m runctl.loopback enter SOCKET -- CMD…   in the new namespace: relay while CMD runs; exit with its code

The port is the embedded stack's (``$RUNCTL_HOME/stack.json``) unless ``--port`` names one. The stack's supervisor
uses the same pair for its launcher (:func:`launcher_isolated`): the relay's host side is one of its children and
the launcher runs under ``enter`` in a namespace of its own, so every Ray head and runner it starts is loopback-only
while the bus, the tracker and the dashboard stay on the host's loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

from runctl.errors import StackError
from runctl.home import read_stack_state

Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
CHUNK = 1 << 16


def stack_bus_port() -> int:
    """The embedded stack's NATS port.

    Raises:
        StackError: no stack is recorded in ``$RUNCTL_HOME``.
    """
    state = read_stack_state()
    if state is None:
        raise StackError("no stack is recorded in $RUNCTL_HOME, so there is no bus to reach. Fix: `runctl up` first.")
    port = urlsplit(state.nats_url).port
    if port is None:
        raise StackError(f"the stack's bus URL {state.nats_url} names no port. Fix: `runctl down`, then `runctl up`.")
    return port


#: auto (the default): isolate the stack's launcher when it can and must — as root, with unshare and ip, on a
#: machine with more than a loopback interface; 1: always (an error when it cannot); 0: never.
LAUNCHER_NETNS_ENV = "RUNCTL_LAUNCHER_NETNS"
#: Set inside a namespace runctl made, so nothing tries to make another.
INSIDE_ENV = "RUNCTL_LOOPBACK_NETNS"
_ENTER_SCRIPT = 'ip link set lo up && exec "$0" "$@"'


def only_loopback() -> bool:
    """Whether this network namespace has no interface but loopback (Ray cannot reach past it)."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def can_isolate() -> str | None:
    """Why a loopback-only namespace cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "a network namespace of its own needs root"
    missing = [tool for tool in ("unshare", "ip") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (Debian: util-linux, iproute2)"
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True, timeout=10)
    if probe.returncode != 0:
        return f"`unshare --net` failed: {probe.stderr.strip() or probe.returncode}"
    return None


def launcher_isolated(env: dict[str, str]) -> bool:
    """Whether the stack runs its launcher in a loopback-only namespace (see :data:`LAUNCHER_NETNS_ENV`).

    Raises:
        StackError: isolation was asked for (``=1``) and cannot be made, or the setting is not 0, 1 or auto.
    """
    setting = env.get(LAUNCHER_NETNS_ENV, "auto")
    if setting not in ("0", "1", "auto"):
        raise StackError(f"{LAUNCHER_NETNS_ENV}={setting!r} is not 0, 1 or auto. Fix: unset it (auto) or pick one.")
    if setting == "0":
        return False
    if setting == "auto" and (env.get(INSIDE_ENV) or only_loopback() or os.geteuid() != 0):
        return False
    reason = can_isolate()
    if reason is None:
        return True
    if setting == "1":
        raise StackError(f"{LAUNCHER_NETNS_ENV}=1 but {reason}. Fix: fix that, or unset {LAUNCHER_NETNS_ENV}.")
    return False


def host_argv(socket_path: str, port: int) -> list[str]:
    """The relay's host side for the bus at 127.0.0.1:``port``."""
    return [sys.executable, "-m", "runctl.loopback", "--port", str(port), "host", socket_path]


def enter_argv(socket_path: str, port: int, command: list[str]) -> list[str]:
    """``command`` in a new loopback-only namespace, with the bus at 127.0.0.1:``port`` relayed in."""
    inner = [sys.executable, "-m", "runctl.loopback", "--port", str(port), "enter", socket_path, "--", *command]
    return ["unshare", "--net", "sh", "-c", _ENTER_SCRIPT, *inner]


def _die_with_parent() -> None:
    """In the command's child, before exec: SIGTERM when the relay dies (so killing it never orphans the command)."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()


def _relay(connect: Connect) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A connection handler that joins each client to a new connection made by ``connect``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await connect()
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, upstream_writer), _pump(upstream_reader, writer))

    return handle


async def host_side(socket_path: str, port: int, stop: asyncio.Event) -> None:
    """Listen on ``socket_path``; join each connection to the bus at 127.0.0.1:``port``, until ``stop``."""
    server = await asyncio.start_unix_server(
        _relay(lambda: asyncio.open_connection("127.0.0.1", port)), path=socket_path
    )
    os.chmod(socket_path, 0o600)
    try:
        await stop.wait()
    finally:
        server.close()
        Path(socket_path).unlink(missing_ok=True)


async def enter_side(socket_path: str, port: int, command: list[str]) -> int:
    """Listen on 127.0.0.1:``port`` here, join each connection to ``socket_path``, run ``command``; its exit code.

    Ctrl-C reaches the command (it cancels its run cleanly); this side waits for it. SIGTERM is passed on to the
    command, and the command gets SIGTERM should this side die.
    """
    server = await asyncio.start_server(
        _relay(lambda: asyncio.open_unix_connection(socket_path)), "127.0.0.1", port, reuse_address=True
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, lambda: None)
    try:
        proc = await asyncio.create_subprocess_exec(*command, preexec_fn=_die_with_parent)
        loop.add_signal_handler(signal.SIGTERM, lambda: proc.send_signal(signal.SIGTERM))
        return await proc.wait()
    finally:
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runctl.loopback", description=__doc__.split("\n\n")[0])
    parser.add_argument("side", choices=("host", "enter"))
    parser.add_argument("socket", help="the Unix socket both sides share")
    parser.add_argument("--port", type=int, help="the bus's port on 127.0.0.1 (default: the embedded stack's)")
    parser.add_argument("command", nargs="*", help="enter: the command to run (after --)")
    args = parser.parse_args(argv)
    try:
        port = args.port or stack_bus_port()
    except StackError as e:
        print(f"StackError: {e.message}", file=sys.stderr)
        return 1
    if args.side == "enter":
        if not args.command:
            parser.error("enter needs a command: python -m runctl.loopback enter SOCKET -- CMD…")
        return asyncio.run(enter_side(args.socket, port, args.command))

    async def serve() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await host_side(args.socket, port, stop)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
